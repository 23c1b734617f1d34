"""Regenerates the checked-in gRPC/protobuf code from runner.proto (the only way it is produced)."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = "protos/runner.proto"
OUTPUTS = ("runner_pb2.py", "runner_pb2.pyi", "runner_pb2_grpc.py", "runner_pb2_grpc.pyi")


def generate(out_dir: Path) -> None:
    """Writes the generated modules as `out_dir/protos/<name>`."""
    include = Path(protoc.__file__).parent / "_proto"
    plugin = shutil.which("protoc-gen-mypy_grpc", path=str(Path(sys.executable).parent))
    if plugin is None:
        raise SystemExit("protoc-gen-mypy_grpc not found: install the dev extra (mypy-protobuf)")
    (out_dir / "protos").mkdir(parents=True, exist_ok=True)
    code = protoc.main(
        [
            "protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            f"--plugin=protoc-gen-mypy_grpc={plugin}",
            f"--mypy_grpc_out={out_dir}",
            str(ROOT / PROTO),
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    generate(ROOT)
    print("generated:", ", ".join(f"protos/{name}" for name in OUTPUTS), file=sys.stderr)


if __name__ == "__main__":
    main()
