"""`runwatch checkpoints`: what a checkpoint root holds, and pruning what resumes set aside.

A resume (a rollback, a respawn, ``--fresh``) never deletes a checkpoint: what lies past the
resume point is moved into ``<root>/rolled_back/<set>/`` (`common.checkpoint_layout`).
``list`` shows the committed checkpoints and those sets; ``prune`` deletes sets an operator
names (or all of them), and is the only command that deletes anything there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from runwatch.common.errors import UsageError

HELP = "list a checkpoint root's checkpoints and the sets rollbacks moved aside; prune sets"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the `checkpoints` subcommands and their arguments."""
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    show = sub.add_parser("list", help="committed checkpoints and the sets moved aside")
    show.add_argument("root", type=Path, help="the checkpoint root (--checkpoint-dir)")
    prune = sub.add_parser("prune", help="delete sets under <root>/rolled_back/ (named, or --all)")
    prune.add_argument("root", type=Path, help="the checkpoint root (--checkpoint-dir)")
    prune.add_argument("sets", nargs="*", metavar="SET", help="a set's name, as `list` shows it")
    prune.add_argument("--all", action="store_true", help="every set moved aside")
    prune.add_argument(
        "--dry-run", action="store_true", help="say what would be deleted, delete nothing"
    )


def _mib(size_bytes: int) -> str:
    return f"{size_bytes / 2**20:.1f} MiB"


def _list(root: Path) -> int:
    from runwatch.common.checkpoint_layout import list_complete_checkpoints, list_set_aside

    committed = list_complete_checkpoints(root)
    print(f"{root}: {len(committed)} committed checkpoint(s)", end="")
    print(f", steps {committed[0][0]}..{committed[-1][0]}" if committed else "")
    sets = list_set_aside(root)
    for s in sets:
        print(f"  set aside {s.name}: {' '.join(s.entries)} ({_mib(s.size_bytes)})")
    if sets:
        total = sum(s.size_bytes for s in sets)
        print(f"{len(sets)} set(s) aside, {_mib(total)}: `runwatch checkpoints prune {root} SET`")
    return 0


def _prune(args: argparse.Namespace) -> int:
    from runwatch.common.checkpoint_layout import list_set_aside, prune_set_aside

    if bool(args.sets) == bool(args.all):
        raise UsageError("name the sets to prune, or give --all (not both)")
    names = [s.name for s in list_set_aside(args.root)] if args.all else args.sets
    known = {s.name: s for s in list_set_aside(args.root)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"no set {', '.join(map(repr, unknown))} under {args.root}/rolled_back")
    verb = "would delete" if args.dry_run else "deleted"
    if not args.dry_run:
        prune_set_aside(args.root, names)
    for name in names:
        print(f"{verb} {known[name].path} ({_mib(known[name].size_bytes)})")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run `runwatch checkpoints`."""
    if not args.root.is_dir():
        raise UsageError(f"{args.root} is not a directory")
    if args.action == "list":
        return _list(args.root)
    return _prune(args)
