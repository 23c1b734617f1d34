"""Every test is in exactly one tier (tests/conftest.py: TIERS), so that `make check` (`-m unit`) and the other
tiers cover the suite between them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ELSEWHERE, STREAMS, TIER_FIXTURES, TIER_NAMES, TIER_OVERRIDES, TIERS, UNTIERED

TESTS = Path(__file__).parent


def test_every_test_module_has_a_tier_and_every_row_a_module() -> None:
    modules = {p.stem for p in TESTS.glob("test_*.py")}
    assert sorted(modules - TIERS.keys()) == [], "give these modules a row in TIERS (tests/conftest.py)"
    assert sorted(TIERS.keys() - modules) == [], "these rows of TIERS (tests/conftest.py) name no module"
    assert {*TIERS.values(), *TIER_OVERRIDES.values(), *TIER_FIXTURES.values()} <= set(TIER_NAMES)
    assert all(key.split("::")[0] in modules for key in TIER_OVERRIDES)
    assert {TIERS.get(module) for module in STREAMS} == {"real_vllm"}  # the streams' modules exist


def test_every_test_this_session_collected_has_exactly_one_tier(request: pytest.FixtureRequest) -> None:
    """In process, over everything collected before `-m` deselects: `make check` checks the whole suite too."""
    assert request.config.stash.get(UNTIERED, []) == []


def test_every_daemons_and_real_vllm_test_is_in_a_module_of_its_tier(request: pytest.FixtureRequest) -> None:
    """`make test`'s second pass groups these tiers by module into two streams (conftest.TierGroups): a real-vLLM
    test elsewhere could run beside both, a third vLLM server at once."""
    assert request.config.stash.get(ELSEWHERE, []) == []


@pytest.mark.sim  # a pytest subprocess
def test_no_marker_expression_outside_the_tiers_selects_a_test() -> None:
    """What `-m` sees, end to end: no test is in no tier, none in two."""
    none = f"not ({' or '.join(TIER_NAMES)})"
    two = " or ".join(f"({a} and {b})" for i, a in enumerate(TIER_NAMES) for b in TIER_NAMES[i + 1 :])
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-m", f"{none} or {two}", str(TESTS)],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=TESTS.parent,
    )
    assert out.returncode == 5, out.stdout[-3000:] + out.stderr[-3000:]  # 5: no test selected
    assert [line for line in out.stdout.splitlines() if "::" in line] == []
