"""Automatic prefix caching with vLLM's accounting (v1/core/kv_cache_manager.py).

Blocks of `block_size` tokens are identified by a hash chained over the prefix, so a block only hits
when everything before it matches too. Per request, when it is first scheduled: queries += prompt
tokens; hits += the cached prefix, whole blocks only and at most prompt - 1 tokens (the last token is
always recomputed). With prefix caching off nothing is counted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    def __init__(self, *, enabled: bool, block_size: int, capacity_blocks: int) -> None:
        self.enabled = enabled
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.queries = 0
        self.hits = 0
        self._blocks: OrderedDict[int, None] = OrderedDict()  # least recently used first

    def _hashes(self, tokens: Sequence[str]) -> list[int]:
        hashes, parent = [], 0
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            parent = hash((parent, tuple(tokens[start : start + self.block_size])))
            hashes.append(parent)
        return hashes

    def schedule(self, prompt: Sequence[str]) -> int:
        """Counts a newly scheduled request; returns its cached tokens."""
        if not self.enabled:
            return 0
        usable = (len(prompt) - 1) // self.block_size
        cached = 0
        for block_hash in self._hashes(prompt)[:usable]:
            if block_hash not in self._blocks:
                break
            self._blocks.move_to_end(block_hash)
            cached += self.block_size
        self.queries += len(prompt)
        self.hits += cached
        return cached

    def store(self, tokens: Sequence[str]) -> None:
        """Keeps the full blocks of a finished request, evicting the least recently used beyond capacity."""
        if not self.enabled:
            return
        for block_hash in self._hashes(tokens):
            self._blocks[block_hash] = None
            self._blocks.move_to_end(block_hash)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
