"""Reading counters from vLLM's /metrics with prometheus_client's parser (labels, escaping, `_total` and
`_created` samples are its business, not ours)."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families


def counter_total(text: str, names: tuple[str, ...]) -> float | None:
    """The sum over all label sets of the first of `names` that the text has (names by vLLM version, each
    as its samples are named: `vllm:prefix_cache_hits_total`). None when none is there or the text does not
    parse: a scrape we cannot read is no evidence either way."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in names and math.isfinite(sample.value):
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    except ValueError:
        return None
    return next((totals[name] for name in names if name in totals), None)
