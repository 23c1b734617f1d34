"""The shipped data files go through the one typed reader: a bad row is named by file, row and key."""

from __future__ import annotations

import copy
import re
import tomllib
from importlib import resources
from typing import Any

import pytest

from bot.slack import metrics as slack_metrics
from kernel.toml_reader import ConfigError, TomlReader, packaged
from protos.vocab import LadderOutcome
from runner.stages import cache_control, ladder, minimize, proxies
from vllm_sim import catalog, simulator, startup
from vllm_sim import metrics as sim_metrics


def shipped(name: str) -> dict[str, Any]:
    home = "kernel.data" if resources.files("kernel.data").joinpath(name).is_file() else "runner.data"
    return tomllib.loads(resources.files(home).joinpath(name).read_text(encoding="utf-8"))


def refusal(monkeypatch: pytest.MonkeyPatch, module: Any, loader: Any, name: str, data: dict[str, Any]) -> str:
    """What `loader` (a cached reader of `module`) says when the shipped `name` holds `data` instead."""
    monkeypatch.setattr(
        module, "packaged", lambda asked, home="kernel.data": TomlReader(data, f"{home.replace('.', '/')}/{asked}")
    )
    loader.cache_clear()
    try:
        with pytest.raises(ConfigError) as raised:
            loader()
    finally:
        loader.cache_clear()
    return str(raised.value)


def test_a_ladder_row_without_its_probe_is_named_by_file_row_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    data = copy.deepcopy(shipped("ladder.toml"))
    second = data["step"][1]
    del second["probe"]
    problem = refusal(monkeypatch, ladder, ladder.ladder_spec, "ladder.toml", data)
    assert problem == f"kernel/data/ladder.toml [[step]] #2 ({second['id']}): missing key 'probe'"


def test_a_ladder_row_keeps_its_free_parameters_and_refuses_a_wrong_type(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ladder.ladder_spec()
    with_params = next(step for step in spec.steps if step.params)
    assert not {"id", "title", "probe", "flags", "needs_peers", "as_written"} & set(with_params.params)
    data = copy.deepcopy(shipped("ladder.toml"))
    data["step"][0]["needs_peers"] = "yes"
    problem = refusal(monkeypatch, ladder, ladder.ladder_spec, "ladder.toml", data)
    assert re.fullmatch(
        r"kernel/data/ladder.toml \[\[step\]\] #1 \(\w+\): 'needs_peers' must be true or false.*", problem
    )


def test_a_ladder_outcome_outside_the_vocabulary_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(ladder.ladder_spec().outcomes.values()) <= set(LadderOutcome)  # read as members
    data = copy.deepcopy(shipped("ladder.toml"))
    data["outcomes"]["oom"] = "out_of_memory"
    problem = refusal(monkeypatch, ladder, ladder.ladder_spec, "ladder.toml", data)
    assert problem.startswith("kernel/data/ladder.toml: outcomes.oom must be one of ok, cache_hit")
    assert problem.endswith("got 'out_of_memory'")


def test_a_proxy_on_a_flag_vllm_does_not_have_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    data = copy.deepcopy(shipped("proxies.toml"))
    data["proxy"][0]["flag"] = "--no-such-flag"
    problem = refusal(monkeypatch, proxies, proxies.proxies, "proxies.toml", data)
    assert re.match(r"runner/data/proxies.toml \[\[proxy\]\] #1 \(\S+\): --no-such-flag is", problem)


def test_minimize_limits_must_be_whole_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    data = {**shipped("minimize.toml"), "max_tries": 2.5}
    problem = refusal(monkeypatch, minimize, minimize.limits, "minimize.toml", data)
    assert problem.startswith("runner/data/minimize.toml: 'max_tries' must be a whole number")


def test_a_row_that_is_not_a_table_and_an_unparsable_file_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"^f.toml \[\[step\]\] #2: must be a table$"):
        TomlReader({"step": [{"id": "a"}, 3]}, "f.toml").rows("step")
    with pytest.raises(ConfigError, match=r"^kernel/data/no-such.toml: "):
        packaged("no-such.toml")


def test_a_misspelt_key_in_a_row_is_named_with_the_key_it_meant(monkeypatch: pytest.MonkeyPatch) -> None:
    data = copy.deepcopy(shipped("cache_control.toml"))
    data["during"][0]["cachess"] = data["during"][0].pop("caches")
    problem = refusal(monkeypatch, cache_control, cache_control._rules, "cache_control.toml", data)
    assert re.fullmatch(
        r"runner/data/cache_control.toml \[\[during\]\] #1: unknown key 'cachess' \(did you mean 'caches'\?\)", problem
    )


def packaged_data(name: str, home: str) -> dict[str, Any]:
    return tomllib.loads(resources.files(home).joinpath(name).read_text(encoding="utf-8"))


def sim_refusal(monkeypatch: pytest.MonkeyPatch, module: Any, loader: Any, name: str, data: dict[str, Any]) -> str:
    """What a simulator loader (a cached function of `module`, over vllm_sim.datafiles.reader) says of `data`."""
    monkeypatch.setattr(module, "reader", lambda asked: TomlReader(data, f"vllm_sim/data/{asked}"))
    loader.cache_clear()
    try:
        with pytest.raises(ConfigError) as raised:
            loader()
    finally:
        loader.cache_clear()
    return str(raised.value)


def test_a_bot_metric_row_without_its_help_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    data = copy.deepcopy(packaged_data("metrics.toml", "bot.data"))
    second = data["metric"][1]
    del second["help"]
    monkeypatch.setattr(slack_metrics, "packaged", lambda asked, home: TomlReader(data, f"bot/data/{asked}"))
    with pytest.raises(ConfigError) as raised:
        slack_metrics.Metrics()
    assert str(raised.value) == f"bot/data/metrics.toml [[metric]] #2 ({second['name']}): missing key 'help'"


def test_a_bot_metric_of_an_unknown_type_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    data = copy.deepcopy(packaged_data("metrics.toml", "bot.data"))
    data["metric"][0]["type"] = "histogram"
    monkeypatch.setattr(slack_metrics, "packaged", lambda asked, home: TomlReader(data, f"bot/data/{asked}"))
    with pytest.raises(ConfigError, match=r"^bot/data/metrics.toml \[\[metric\]\] #1 \(\w+\): 'type' must be"):
        slack_metrics.Metrics()


def test_a_sim_metric_row_with_a_misspelt_key_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    data = copy.deepcopy(packaged_data("metrics.toml", "vllm_sim.data"))
    first = data["metric"][0]
    first["valeu"] = first.pop("value")
    problem = sim_refusal(monkeypatch, sim_metrics, sim_metrics.metric_specs, "metrics.toml", data)
    assert problem == (
        f"vllm_sim/data/metrics.toml [[metric]] #1 ({first['name']}): unknown key 'valeu' (did you mean 'value'?)"
    )


def test_a_sim_startup_line_without_its_phase_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    data = copy.deepcopy(packaged_data("log.toml", "vllm_sim.data"))
    second = data["startup"][1]
    del second["phase"]
    problem = sim_refusal(monkeypatch, startup, startup.script, "log.toml", data)
    assert problem == f"vllm_sim/data/log.toml [[startup]] #2 ({second['id']}): missing key 'phase'"


def test_a_sim_shutdown_line_on_an_unknown_process_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    data = copy.deepcopy(packaged_data("log.toml", "vllm_sim.data"))
    data["shutdown"][2]["proc"] = "scheduler"
    monkeypatch.setattr(simulator, "reader", lambda asked: TomlReader(data, f"vllm_sim/data/{asked}"))
    simulator.untimed.cache_clear()
    try:
        with pytest.raises(ConfigError) as raised:
            simulator.untimed("shutdown")
    finally:
        simulator.untimed.cache_clear()
    assert str(raised.value).startswith("vllm_sim/data/log.toml [[shutdown]] #3: 'proc' must be one of api, ")


def test_a_sim_catalog_error_with_a_wrong_type_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    data = copy.deepcopy(packaged_data("errors.toml", "vllm_sim.data"))
    key = next(iter(data["error"]))
    data["error"][key]["only"] = "moe"
    problem = sim_refusal(monkeypatch, catalog, catalog.catalog, "errors.toml", data)
    assert problem == f"vllm_sim/data/errors.toml [error] [{key}]: 'only' must be a list of strings, got 'moe'"


@pytest.mark.parametrize("quantifier", ["*+", "++", "?+", "{2,}+"])
def test_a_possessive_quantifier_on_a_group_is_refused_with_what_means_the_same(
    monkeypatch: pytest.MonkeyPatch, quantifier: str
) -> None:
    """CPython 3.11.2 (Debian bookworm's) fails to match `(?:a|"b")*+c` patterns that 3.11.7 matches: a rule
    written so would read logs otherwise on some hosts. The reader refuses it, naming the atomic form."""
    from kernel import redact

    data = shipped("redaction.toml")
    data["text_patterns"] = [*data["text_patterns"], f"(?:key=(?:x|y) ){quantifier}secret=(?P<secret>\\w+)"]
    said = refusal(monkeypatch, redact, redact.redactor, "redaction.toml", data)
    assert (
        said.startswith("kernel/data/redaction.toml: ") and f"'text_patterns[{len(data['text_patterns']) - 1}]'" in said
    )
    assert "possessive quantifier on a group" in said and "(?>(?:…)*)" in said and "\n" not in said
    reader = TomlReader({"p": r"\)*+ [a-z]++ (?>(?:a|b)*)"}, "f.toml")
    assert reader.regex("p").pattern.endswith("*)")  # a quantified literal paren, a class, an atomic group: fine
