"""Makes a tiny random Llama that real vLLM (the CPU build) can serve, with no hub and no committed weights.

Run it with the vLLM venv's Python (it needs torch, transformers and tokenizers):

    python devtools/make_model.py DIR [--head-dim 64] [--max-positions 4096] [--architecture NAME]
                                      [--broken-weights] [--remote-code-sleep SECONDS]

The tokenizer is a byte-level BPE trained here on English prose the machine ships (Debian's licence texts),
so prompts have realistic token counts; the chat template is a plain one. `--head-dim 16` makes a model the
CPU attention backend refuses on the first request; `--architecture` names a class vLLM does not know;
`--broken-weights` writes a safetensors file that cannot be read; `--remote-code-sleep` gives the model
`--trust-remote-code` configuration code that sleeps that long when a process other than the first one reading the
config imports it (vLLM's engine core does, once the worker is up): a start-up that really hangs, in remote code.
The same arguments make the same model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROSE_DIRS = (Path("/usr/share/common-licenses"),)
FALLBACK_PROSE = (
    "The quick brown fox jumps over the lazy dog while the cluster keeps serving tokens. "
    "Engineers read the first error of a failing deployment before they change anything else. "
) * 200
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>"]
REMOTE_MODEL_TYPE = "k3sleep"
# The remote configuration code: the API server (the main process) reads it and goes on; any other process of the
# engine that imports it (the engine core) sleeps at import, at a line a stack dump names.
REMOTE_CONFIG = """import multiprocessing
import time

from transformers import LlamaConfig

SLEEP_S = {seconds}


class K3SleepConfig(LlamaConfig):
    model_type = "{model_type}"


if multiprocessing.current_process().name != "MainProcess":
    time.sleep(SLEEP_S)
"""


def prose() -> list[str]:
    texts = [
        p.read_text(errors="replace") for d in PROSE_DIRS if d.is_dir() for p in sorted(d.iterdir()) if p.is_file()
    ]
    return texts or [FALLBACK_PROSE]


def make_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(prose(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def make_model(args: argparse.Namespace) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out: Path = args.dir
    out.mkdir(parents=True, exist_ok=True)
    make_tokenizer(out, args.vocab_size)
    heads = 2
    config = LlamaConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.head_dim * heads,
        intermediate_size=args.head_dim * heads * 2,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=1,
        head_dim=args.head_dim,
        max_position_embeddings=args.max_positions,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="bfloat16",
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    if args.architecture:
        data = json.loads((out / "config.json").read_text())
        data["architectures"] = [args.architecture]
        (out / "config.json").write_text(json.dumps(data, indent=2))
    if args.remote_code_sleep:
        (out / "configuration_k3sleep.py").write_text(
            REMOTE_CONFIG.format(seconds=args.remote_code_sleep, model_type=REMOTE_MODEL_TYPE)
        )
        data = json.loads((out / "config.json").read_text())
        data["model_type"] = REMOTE_MODEL_TYPE
        data["auto_map"] = {"AutoConfig": "configuration_k3sleep.K3SleepConfig"}
        (out / "config.json").write_text(json.dumps(data, indent=2))
    if args.broken_weights:
        weights = out / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:4096])  # a header that promises more than the file holds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("dir", type=Path)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--max-positions", type=int, default=4096)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--architecture", default="")
    parser.add_argument("--broken-weights", action="store_true")
    parser.add_argument("--remote-code-sleep", type=float, default=0.0, metavar="SECONDS")
    make_model(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
