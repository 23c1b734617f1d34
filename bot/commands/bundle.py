"""`k3repro bundle export RUN -o FILE` / `k3repro bundle import FILE`: the frozen case as one verified file."""

from __future__ import annotations

import argparse

from bot.bundle import BundleError, export_bundle, import_bundle, read_bundle
from bot.commands.common import CommandError, load_config, said
from bot.render import terminal
from bot.store import RunNotFound, Store


def run_export(args: argparse.Namespace) -> int:
    store = Store(load_config(args.config).store)
    try:
        bundle = export_bundle(store, args.run)
    except (BundleError, RunNotFound) as exc:
        raise CommandError(said(exc)) from None
    finally:
        store.close()
    if args.output.exists():
        raise CommandError(f"{args.output} exists; not overwritten")
    try:
        args.output.write_bytes(bundle.to_bytes())
    except OSError as exc:
        raise CommandError(f"cannot write {args.output}: {exc.strerror}") from None
    print(f"run {bundle.manifest['run_id']} → {args.output} ({len(bundle.members)} members, sha256 {bundle.sha256})")
    return 0


def run_import(args: argparse.Namespace) -> int:
    try:
        bundle = read_bundle(args.file)
    except BundleError as exc:
        raise CommandError(str(exc)) from None
    config = load_config(args.config)
    store = Store(config.store)
    try:
        run = import_bundle(store, bundle)
    except BundleError as exc:
        raise CommandError(str(exc)) from None
    finally:
        store.close()
    renamed = "" if run.id == bundle.run["id"] else f" (its id {bundle.run['id']} is taken here)"
    print(
        terminal(
            f"imported run {run.id}{renamed} ({run.cluster}, {run.status}) from {args.file}: every member verified"
        )
    )
    if run.cluster not in config.clusters:  # shown, never launched: configured_launch refuses it
        print(
            terminal(f"cluster {run.cluster} is not in this bot's config: the run can be shown, not rerun or minimized")
        )
    return 0
