"""Engine backends that live outside the runner (the simulator's), found by their entry point: the runner and the
bot name no module of them, so a GPU host that does not install the simulator runs without it."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kernel.toml_reader import ConfigError

if TYPE_CHECKING:
    from runner.config import EngineConfig
    from runner.engines.base import EngineBackend


class ScenarioDeployment(Protocol):
    """A simulated deployment as its cluster runs it (the demo starts from one)."""

    @property
    def argv(self) -> tuple[str, ...]: ...

    @property
    def image(self) -> str: ...

    @property
    def request(self) -> Mapping[str, Any] | None: ...

    @property
    def api(self) -> str: ...


class EnginePlugin(Protocol):
    """What the runner's config and the demo ask of such a backend."""

    name: str

    def scenario(self, name: str, base: Path = ...) -> str:
        """A scenario by name or file, resolved and checked (ConfigError names what is wrong)."""
        ...

    def deployment(self, scenario: str) -> ScenarioDeployment: ...

    def make(self, config: EngineConfig) -> EngineBackend: ...


ENGINE_PLUGINS = "k3repro.engines"


def engine_plugin(name: str) -> EnginePlugin:
    """The installed plugin backend `name`; ConfigError when it is not installed."""
    for entry in entry_points(group=ENGINE_PLUGINS, name=name):
        plugin: EnginePlugin = entry.load()
        return plugin
    raise ConfigError(f"engine backend {name!r} is not installed on this host (pip install 'k3repro[{name}]')")
