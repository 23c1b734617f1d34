"""`k3repro dev-certs DIR`: a throwaway CA, runner and bot certificates for trying mTLS locally."""

from __future__ import annotations

import argparse
from pathlib import Path

from runner.tls import write_dev_certs


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("dev-certs", help="write a local CA plus runner and bot certificates (not for production)")
    parser.add_argument("dir", type=Path)
    parser.add_argument(
        "--host", action="append", default=[], help="a name or IP the runner certificate is valid for (repeatable)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    hosts = tuple(args.host) or ("localhost", "127.0.0.1", "::1")
    paths = write_dev_certs(args.dir, hosts)
    for label, path in vars(paths).items():
        print(f"{label:<12} {path}")
    return 0
