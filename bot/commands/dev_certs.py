"""`k3repro dev-certs DIR`: a throwaway CA, runner and bot certificates for trying mTLS locally."""

from __future__ import annotations

import argparse

from kernel.tls import write_dev_certs


def run(args: argparse.Namespace) -> int:
    hosts = tuple(args.host) or ("localhost", "127.0.0.1", "::1")
    paths = write_dev_certs(args.dir, hosts)
    for label, path in vars(paths).items():
        print(f"{label:<12} {path}")
    return 0
