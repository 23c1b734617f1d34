"""Three products on one kernel: which package may import which, and each product's third-party imports declared
in its own extra of pyproject.toml (a GPU host installs `k3repro[runner]` alone, the bot's host `k3repro[bot]`)."""

from __future__ import annotations

import ast
import contextlib
import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = {"kernel", "protos", "runner", "bot", "vllm_sim", "demo"}
# What each package may import of the project: the kernel (and the contract) below everything; the simulator
# plugs into the runner; the demo wires them all together; no product imports the simulator or the demo.
MAY_IMPORT = {
    "protos": {"protos"},
    "kernel": {"kernel", "protos"},
    "runner": {"runner", "kernel", "protos"},
    "bot": {"bot", "kernel", "protos"},
    "vllm_sim": {"vllm_sim", "runner", "kernel", "protos"},
    "demo": FIRST_PARTY,
}
EXTRA = {"kernel": (), "protos": (), "runner": ("runner",), "bot": ("bot",), "vllm_sim": ("sim", "runner")}


def imports(package: str) -> dict[str, set[str]]:
    """Top-level names each module of `package` imports (at any depth: lazy imports count too)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if re.search(r"_pb2(_grpc)?\.py$", path.name):
            continue
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_a_package_imports_only_what_is_below_it(package: str) -> None:
    wrong = {
        module: sorted(names & FIRST_PARTY - MAY_IMPORT[package])
        for module, names in imports(package).items()
        if names & FIRST_PARTY - MAY_IMPORT[package]
    }
    assert not wrong, f"{package} imports what it may not: {wrong}"


DEV_ONLY = {"protos/generate.py"}  # regenerates the contract's code: grpcio-tools, a dev dependency


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\[<>=~! ;]", requirement.strip(), maxsplit=1)[0]).lower()


def declared(extras: tuple[str, ...]) -> set[str]:
    """The distributions an install of these extras brings: those declared, and what they require in turn."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    todo = [_name(req) for req in requirements if not req.startswith("k3repro")]
    installed: set[str] = set()
    while todo:
        name = todo.pop()
        if name in installed:
            continue
        installed.add(name)
        with contextlib.suppress(PackageNotFoundError):  # declared but not installed here: nothing below it
            todo += [_name(req) for req in requires(name) or () if "extra ==" not in req]
    return installed


@pytest.mark.parametrize("package", sorted(EXTRA))
def test_a_products_third_party_imports_are_in_its_extra(package: str) -> None:
    """Checked on the package and on every project package it may import (the runner's install carries the
    kernel's imports, the simulator's the runner's)."""
    distributions = packages_distributions()
    allowed = declared(EXTRA[package])
    below = MAY_IMPORT[package] - {"demo"}
    missing: dict[str, list[str]] = {}
    for part in below:
        for module, names in imports(part).items():
            if module in DEV_ONLY:
                continue
            third_party = names - FIRST_PARTY - set(sys.stdlib_module_names) - {"__future__"}
            lacking = sorted(
                name for name in third_party if not {_name(dist) for dist in distributions.get(name, [name])} & allowed
            )
            if lacking:
                missing[module] = lacking
    assert not missing, f"k3repro[{','.join(EXTRA[package]) or 'base'}] does not declare: {missing}"
