"""`runwatch audit --run RUN | --all`: replay the log and check every verdict is reproduced.

Exit status: 0 every audited run agrees; 1 a run disagrees (or an error, said on stderr);
2 a usage error; 3 pending: the processors have not processed all of it yet (and none
disagrees).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from runwatch.cmd.processors import add_common, detector_config, parse_overrides
from runwatch.common.errors import BrokerUnreachable, UsageError

if TYPE_CHECKING:
    from runwatch.processors.audit import AuditReceipt, RunLog

HELP = "replay a run's events and diff the verdicts with the recorded ones (exit 0: agree)"

EXIT_AGREES = 0
EXIT_DISAGREES = 1
EXIT_PENDING = 3
EXIT_CODES = f"""exit status:
  {EXIT_AGREES}  AGREES     every verdict and command reproduced
  {EXIT_DISAGREES}  DISAGREES  the processors processed the run and the log differs
                (also: no events for the run, or an error, said on stderr)
  2  usage error
  {EXIT_PENDING}  PENDING    the processors (--app-id) have not processed all of the run's
                records within --wait; run again later (--all: none disagrees)
  {BrokerUnreachable.exit_code}  no Kafka broker answers at the bootstrap address
"""
DEFAULT_WAIT_S = 30.0


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch audit`."""
    from runwatch.processors.settings import DEFAULT_APP_ID

    parser.epilog = EXIT_CODES
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help="run id")
    which.add_argument(
        "--all", action="store_true", help="audit every run in the log: one summary table"
    )
    add_common(parser)
    parser.add_argument(
        "--app-id",
        help="the processors' app id (their consumer group): its committed offsets say "
        "whether the run's records were processed (default: <prefix>-processors, as for "
        f"`runwatch processors`; {DEFAULT_APP_ID} for the default prefix)",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help="wait this long for the processors to catch up before saying PENDING "
        f"(default: {DEFAULT_WAIT_S:.0f})",
    )
    parser.add_argument("--json", action="store_true", help="print the receipt as JSON")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument(
        "--from-archive",
        metavar="DIR",
        help="read the run from a `runwatch sinks --archive DIR` archive instead of Kafka "
        "(no lag check: an archive is what the processors already published)",
    )


def _describe(raw: bytes) -> str:
    data = msgspec.json.decode(raw)
    bits = [str(data.get(k)) for k in ("kind", "action", "step", "rank") if k in data]
    return " ".join(bits) or raw.decode(errors="replace")[:80]


def render(receipt: AuditReceipt) -> str:
    """The receipt as text, one section per verdict family."""
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
    lines += _progress_lines(receipt)
    lines.append("  verdict: " + _verdict_text(receipt))
    return "\n".join(lines)


def _verdict_text(receipt: AuditReceipt) -> str:
    from runwatch.processors.audit import Verdict

    verdict = receipt.verdict
    if verdict is Verdict.AGREES:
        return "every verdict reproduced"
    if verdict is Verdict.PENDING:
        assert receipt.progress is not None
        ticks = f" and {receipt.pending_ticks} clock ticks" if receipt.pending_ticks else ""
        return (
            f"PENDING: {receipt.progress.pending} of the run's records{ticks} not yet "
            f"processed by {receipt.progress.group} (waited {receipt.progress.waited_s:.0f} s)"
        )
    return "DISAGREES"


def _progress_lines(receipt: AuditReceipt) -> list[str]:
    progress = receipt.progress
    if progress is None:
        return []
    if not progress.group_found:
        hint = (
            f" (groups on these topics: {', '.join(progress.other_groups)})"
            if progress.other_groups
            else ""
        )
        return [
            f"  note: no consumer group {progress.group!r} has committed offsets{hint}: "
            "cannot tell lag; auditing what is in the log (pass the processors' --app-id)"
        ]
    lags = [(p, "records") for p in progress.partitions if p.pending]
    if receipt.pending_ticks:
        lags += [(p, "clock ticks") for p in progress.ticks if p.pending]
    return [
        f"    not processed: {p.topic}[{p.partition}] {p.pending} {what} "
        f"(committed {p.committed if p.committed is not None else 'nothing'}, "
        f"relied on up to {p.target})"
        for p, what in lags
    ]


def exit_status(receipts: list[AuditReceipt]) -> int:
    """0 when all agree, 1 when one disagrees, else 3 when one is pending."""
    from runwatch.processors.audit import Verdict

    verdicts = {r.verdict for r in receipts}
    if Verdict.DISAGREES in verdicts:
        return EXIT_DISAGREES
    if Verdict.PENDING in verdicts:
        return EXIT_PENDING
    return EXIT_AGREES


def _counts(cmp: object) -> str:
    from runwatch.processors.verdict_diff import Comparison

    assert isinstance(cmp, Comparison)
    wrong = len(cmp.differing) + len(cmp.conflicts)
    text = f"{len(cmp.matched)}/{len(cmp.missing)}/{len(cmp.unexpected)}"
    return text + (f" +{wrong} differing" if wrong else "")


def render_table(receipts: list[AuditReceipt]) -> str:
    """The `--all` summary: one row per run, then what disagrees or is pending."""
    from runwatch.processors.audit import Verdict

    header = ("run", "input records", "anomalies m/mi/u", "commands m/mi/u", "verdict")
    rows = [
        (
            r.run_id,
            str(r.input_records),
            _counts(r.anomalies),
            _counts(r.commands),
            r.verdict.value
            + (
                f" ({r.progress.pending + r.pending_ticks} unprocessed)"
                if r.verdict is Verdict.PENDING and r.progress
                else ""
            ),
        )
        for r in receipts
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    counts = {v: sum(1 for r in receipts if r.verdict is v) for v in Verdict}
    lines.append(
        f"{len(receipts)} runs: "
        + ", ".join(f"{n} {v.value.lower()}" for v, n in counts.items())
        + "  (m/mi/u: matched/missing/unexpected)"
    )
    notes = {line for r in receipts for line in _progress_lines(r) if "note:" in line}
    lines += [n.strip() for n in sorted(notes)]
    for r in receipts:
        if r.verdict is Verdict.DISAGREES:
            lines.append("")
            lines.append(render(r))
    return "\n".join(lines)


def _archived_log(root: Path, explicit_prefix: str | None, run_id: str) -> RunLog:
    """The run's log from an archive; the prefix is inferred when the archive has one."""
    from runwatch.common.settings import topic_prefix
    from runwatch.sinks.archive_read import archived_prefixes, load_archived_run_log

    if not root.is_dir():
        raise UsageError(f"--from-archive: {root} is not a directory")
    found = archived_prefixes(root)
    prefix = topic_prefix(explicit_prefix)
    if explicit_prefix is None and prefix not in found and len(found) == 1:
        prefix = next(iter(found))
    return load_archived_run_log(root, prefix, run_id)


def _as_json(receipt: AuditReceipt) -> dict[str, object]:
    out: dict[str, object] = msgspec.to_builtins(receipt)
    out["agrees"] = receipt.agrees
    out["verdict"] = receipt.verdict.value
    return out


def run(args: argparse.Namespace) -> int:
    """Load the run's log (or every run's), audit it, print the receipt(s)."""
    from runwatch.common.gc_tuning import tune_for_throughput
    from runwatch.common.settings import topic_prefix
    from runwatch.processors.audit import audit, audit_all, load_run_log
    from runwatch.processors.fleet import default_app_id
    from runwatch.resolve import resolve_bootstrap

    tune_for_throughput()  # a bulk decode and fold of the run's whole log
    cfg = detector_config(parse_overrides(args.overrides, args.shadow))
    group = args.app_id or default_app_id(topic_prefix(args.prefix))
    if args.wait < 0 or args.timeout <= 0:
        raise UsageError("--wait must be >= 0 and --timeout > 0")
    if args.all:
        if args.from_archive:
            raise UsageError("--all reads Kafka; audit archived runs one by one with --run")
        receipts = audit_all(
            resolve_bootstrap(args.bootstrap),
            topic_prefix(args.prefix),
            cfg,  # type: ignore[arg-type]
            timeout_s=args.timeout,
            group=group,
            wait_s=args.wait,
        )
        if not receipts:
            print("runwatch audit: no runs in the log", file=sys.stderr)
            return EXIT_DISAGREES
        if args.json:
            print(json.dumps([_as_json(r) for r in receipts], default=str))
        else:
            print(render_table(receipts))
        return exit_status(receipts)
    if args.from_archive:
        log = _archived_log(Path(args.from_archive), args.prefix, args.run)
    else:
        log = load_run_log(
            resolve_bootstrap(args.bootstrap),
            topic_prefix(args.prefix),
            args.run,
            timeout_s=args.timeout,
            group=group,
            wait_s=args.wait,
        )
    if not log.inputs:
        print(f"runwatch audit: no events for run {args.run!r}", file=sys.stderr)
        return EXIT_DISAGREES
    receipt = audit(log, cfg)  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(_as_json(receipt), default=str))
    else:
        print(render(receipt))
    return exit_status([receipt])
