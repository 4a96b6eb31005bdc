"""`runwatch audit --run RUN`: replay a run's log and check every verdict is reproduced."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from runwatch.cmd.processors import add_common, detector_config, parse_overrides
from runwatch.errors import UsageError

if TYPE_CHECKING:
    from processors.audit import RunLog

HELP = "replay a run's events and diff the verdicts with the recorded ones (exit 0: agree)"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch audit`."""
    parser.add_argument("--run", required=True, help="run id")
    add_common(parser)
    parser.add_argument("--json", action="store_true", help="print the receipt as JSON")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument(
        "--from-archive",
        metavar="DIR",
        help="read the run from a `runwatch sinks --archive DIR` archive instead of Kafka",
    )


def _describe(raw: bytes) -> str:
    data = msgspec.json.decode(raw)
    bits = [str(data.get(k)) for k in ("kind", "action", "step", "rank") if k in data]
    return " ".join(bits) or raw.decode(errors="replace")[:80]


def render(receipt: object) -> str:
    """The receipt as text, one section per verdict family."""
    from processors.audit import AuditReceipt

    assert isinstance(receipt, AuditReceipt)
    lines = [
        f"audit of run {receipt.run_id}: {receipt.input_records} input records replayed "
        f"(config {receipt.config_hash})",
    ]
    if receipt.recorded_config_hashes and receipt.recorded_config_hashes != (receipt.config_hash,):
        lines.append(
            "  note: verdicts were recorded with config "
            + ", ".join(receipt.recorded_config_hashes)
            + "; pass the processors' --set values to audit with the same configuration"
        )
    for title, cmp in (("anomalies", receipt.anomalies), ("commands", receipt.commands)):
        lines.append(
            f"  {title}: {len(cmp.matched)} matched, {len(cmp.missing)} missing, "
            f"{len(cmp.unexpected)} unexpected, {len(cmp.differing)} differing, "
            f"{len(cmp.conflicts)} conflicting ids, {cmp.duplicates} identical duplicates"
        )
        lines += [f"    missing:    {_describe(m)}" for m in cmp.missing]
        lines += [f"    unexpected: {_describe(u)}" for u in cmp.unexpected]
        lines += [f"    differing:  {d.verdict_id}" for d in cmp.differing]
        lines += [f"    conflict:   {c}" for c in cmp.conflicts]
    if receipt.dead_letters:
        lines.append(f"  {receipt.dead_letters} records of this run are in the dead-letter topic")
    lines.append("  verdict: " + ("every verdict reproduced" if receipt.agrees else "DISAGREES"))
    return "\n".join(lines)


def _archived_log(root: Path, explicit_prefix: str | None, run_id: str) -> RunLog:
    """The run's log from an archive; the prefix is inferred when the archive has one."""
    from runwatch.settings import topic_prefix
    from sinks.archive_read import archived_prefixes, load_archived_run_log

    if not root.is_dir():
        raise UsageError(f"--from-archive: {root} is not a directory")
    found = archived_prefixes(root)
    prefix = topic_prefix(explicit_prefix)
    if explicit_prefix is None and prefix not in found and len(found) == 1:
        prefix = next(iter(found))
    return load_archived_run_log(root, prefix, run_id)


def run(args: argparse.Namespace) -> int:
    """Load the run's log, audit it, print the receipt."""
    from processors.audit import audit, load_run_log
    from runwatch.settings import resolve_bootstrap, topic_prefix

    cfg = detector_config(parse_overrides(args.overrides))
    if args.from_archive:
        log = _archived_log(Path(args.from_archive), args.prefix, args.run)
    else:
        log = load_run_log(
            resolve_bootstrap(args.bootstrap),
            topic_prefix(args.prefix),
            args.run,
            timeout_s=args.timeout,
        )
    if not log.inputs:
        print(f"runwatch audit: no events for run {args.run!r}", file=sys.stderr)
        return 1
    receipt = audit(log, cfg)  # type: ignore[arg-type]
    if args.json:
        out = msgspec.to_builtins(receipt)
        out["agrees"] = receipt.agrees
        print(json.dumps(out, default=str))
    else:
        print(render(receipt))
    return 0 if receipt.agrees else 1
