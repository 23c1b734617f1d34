"""The caches in the scene: each cache's location, size, entries, newest mtime and index hash, and their diff."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernel.fingerprint import diff, diff_text
from kernel.fingerprint.caches import cache_specs, caches_section, survey
from kernel.redact import redactor
from runner.fingerprint import collect
from runner.nvml import NvmlView


class NoNvml:
    def read(self) -> NvmlView:
        return NvmlView(available=False, error="no NVML in this test")


def _home(tmp_path: Path) -> dict[str, str]:
    """A temp HOME with a fake Triton cache (two kernels in a hashed folder) and nothing else."""
    home = tmp_path / "home"
    kernels = home / ".triton" / "cache" / "ABCDEF"
    kernels.mkdir(parents=True)
    (kernels / "kernel.cubin").write_bytes(b"\0" * 1000)
    (kernels / "kernel.json").write_text('{"name": "k"}')
    return {"HOME": str(home), "USER": "tester", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}


def _by_name(scene: dict[str, object]) -> dict[str, dict[str, object]]:
    section = scene["caches"]
    assert isinstance(section, dict) and section["host"] is True
    return {c["name"]: c for c in section["caches"]}


def test_the_list_of_caches_is_the_data_file() -> None:
    names = {spec.name: spec.env for spec in cache_specs()}
    assert names == {
        "torch_inductor": "TORCHINDUCTOR_CACHE_DIR",
        "vllm": "VLLM_CACHE_ROOT",
        "triton": "TRITON_CACHE_DIR",
        "flashinfer": "FLASHINFER_WORKSPACE_BASE",
        "deep_gemm": "DG_JIT_CACHE_DIR",
        "hf_modules": "HF_MODULES_CACHE",
    }


def test_a_fake_triton_cache_in_home_is_recorded(tmp_path: Path) -> None:
    environ = _home(tmp_path)
    caches = _by_name(collect(NoNvml(), None, environ=environ))
    triton = caches["triton"]
    assert triton["path"] == f"{environ['HOME']}/.triton/cache" and triton["from"] == "default"
    assert triton["exists"] is True and triton["entries"] == 3  # the folder and its two files
    assert triton["size_bytes"] == 1000 + len('{"name": "k"}') and triton["truncated"] is None
    assert isinstance(triton["index_sha256"], str) and len(triton["index_sha256"]) == 64
    assert isinstance(triton["newest_mtime"], str) and triton["newest_mtime"].endswith("+00:00")
    # the env var moves a cache; one that is not there is recorded as absent
    assert caches["torch_inductor"]["path"] == environ["TORCHINDUCTOR_CACHE_DIR"]
    assert caches["torch_inductor"]["from"] == "TORCHINDUCTOR_CACHE_DIR" and caches["torch_inductor"]["exists"] is False
    assert caches["hf_modules"]["path"] == f"{environ['HOME']}/.cache/huggingface/modules"
    with_hf_home = _by_name(collect(NoNvml(), None, environ={**environ, "HF_HOME": "/srv/hf"}))
    assert with_hf_home["hf_modules"]["path"] == "/srv/hf/modules"


def test_the_walk_never_follows_a_symlink_nor_reads_a_file(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"x" * 5000)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "a.bin").write_bytes(b"y" * 10)
    os.symlink(outside, cache / "link")
    (cache / "locked").write_bytes(b"z" * 7)
    (cache / "locked").chmod(0)  # unreadable: its size is still known without opening it
    found = survey(str(cache))
    assert found["entries"] == 3 and found["size_bytes"] == 17  # the link counts, its target does not
    os.symlink(outside, tmp_path / "linked-cache")
    assert survey(str(tmp_path / "linked-cache"))["error"] == "a symlink; not walked"


def test_the_walk_is_capped_and_cut_at_the_same_place(tmp_path: Path) -> None:
    for index in range(30):
        (tmp_path / f"f{index:02}").write_bytes(b"1")
    first, second = survey(str(tmp_path), max_entries=10), survey(str(tmp_path), max_entries=10)
    assert first["entries"] == 10 and first["truncated"] == "entries" and first == second
    assert survey(str(tmp_path), max_seconds=-1)["truncated"] == "time"


def test_a_container_backend_says_its_caches_are_the_hosts(tmp_path: Path) -> None:
    section = caches_section(_home(tmp_path), redactor(), image=True)
    assert section["host"] is True and "container" in section["note"]


def test_diff_of_two_scenes_with_different_caches_shows_it(tmp_path: Path) -> None:
    environ = _home(tmp_path)
    a = collect(NoNvml(), None, environ=environ)
    (Path(environ["HOME"]) / ".triton" / "cache" / "ABCDEF" / "kernel2.cubin").write_bytes(b"\0" * 24)
    inductor = Path(environ["TORCHINDUCTOR_CACHE_DIR"])
    inductor.mkdir()
    (inductor / "fx.pkl").write_bytes(b"\0" * 5)
    b = collect(NoNvml(), None, environ=environ)
    result = diff(a, b)
    assert not result["same_scene"]
    changed = {c["name"]: c for c in result["caches"]}
    assert set(changed) == {"triton", "torch_inductor"}
    assert "3 entries, 1013 bytes" in changed["triton"]["a"] and "4 entries, 1037 bytes" in changed["triton"]["b"]
    assert changed["torch_inductor"]["a"] == "absent" and "1 entries, 5 bytes" in changed["torch_inductor"]["b"]
    text = diff_text(result)
    assert "caches (2, host paths):" in text and "  torch_inductor: absent → " in text
    assert "caches.2" not in text  # each cache once, in words, not field by field
    assert diff(a, a)["caches"] == []


@pytest.mark.parametrize("name", ["TRITON_CACHE_DIR"])
def test_a_cache_moved_by_its_variable_is_found_there(tmp_path: Path, name: str) -> None:
    moved = tmp_path / "moved"
    (moved / "x").mkdir(parents=True)
    caches = _by_name(collect(NoNvml(), None, environ={**_home(tmp_path), name: str(moved)}))
    assert caches["triton"]["path"] == str(moved) and caches["triton"]["entries"] == 1


def test_flashinfers_variable_names_the_folder_its_cache_is_kept_under(tmp_path: Path) -> None:
    """FLASHINFER_WORKSPACE_BASE is a base: FlashInfer appends .cache/flashinfer (a cache to clear, never $HOME)."""
    base = tmp_path / "base"
    (base / ".cache" / "flashinfer" / "kernel.so").parent.mkdir(parents=True)
    (base / ".cache" / "flashinfer" / "kernel.so").write_bytes(b"x")
    caches = _by_name(collect(NoNvml(), None, environ={**_home(tmp_path), "FLASHINFER_WORKSPACE_BASE": str(base)}))
    assert caches["flashinfer"]["path"] == str(base / ".cache" / "flashinfer") and caches["flashinfer"]["entries"] == 1
    assert caches["flashinfer"]["from"] == "FLASHINFER_WORKSPACE_BASE"
