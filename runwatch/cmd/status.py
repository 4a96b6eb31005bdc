"""`runwatch status`: every run the processors know, one line each."""

from __future__ import annotations

import argparse

HELP = "show every run the processors know: step, loss, MFU, live ranks, anomalies, restarts"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch status`."""
    parser.add_argument(
        "--bootstrap", help="Kafka bootstrap HOST:PORT (default: RUNWATCH_BOOTSTRAP)"
    )
    parser.add_argument(
        "--prefix",
        "--topic-prefix",
        dest="prefix",
        help="topic name prefix of the fleet (default: $RUNWATCH_TOPIC_PREFIX or runwatch)",
    )
    parser.add_argument(
        "--app-id",
        help="the processors' app id (default: <prefix>-processors, as `runwatch processors`)",
    )
    parser.add_argument("--run", help="only this run")
    parser.add_argument("--json", action="store_true", help="one JSON object per run")


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_row(r: object) -> str:
    """One run as a line of the status table."""
    from runwatch.processors.fleet import RunSummary

    assert isinstance(r, RunSummary)
    ranks = f"{len(r.live_ranks)}/{len(r.live_ranks) + len(r.dead_ranks)}"
    anomalies = ",".join(f"{k}={v}" for k, v in r.anomalies.items()) or "-"
    mfu = _fmt(None if r.mfu is None else 100 * r.mfu, ".2f")
    line = (
        f"{r.run_id:<24} {r.incarnation:>3} {_fmt(r.last_step, 'd'):>7} {_fmt(r.loss, '.4f'):>9} "
        f"{mfu:>6}% {ranks:>5} {r.status:<10} {anomalies} / {r.restarts}"
    )
    if r.shadow_commands:
        line += f" (+{r.shadow_commands} shadow, not executed)"
    if r.replica_groups:
        stepping = r.replica_groups - len(r.replicas_lost)
        line += f"  groups {stepping}/{r.replica_groups}, {r.degraded_steps} degraded steps"
    return line if r.continuity_ok else line + "  CONTINUITY BROKEN"


def format_stacks(r: object) -> list[str]:
    """Where each rank was before the run's latest hang or dead-rank restart, a line each."""
    from runwatch.processors.fleet import RunSummary

    assert isinstance(r, RunSummary)
    if not r.last_stacks:
        return []
    lines = [f"{r.run_id}: where the ranks were before the last restart for a hang or dead rank"]
    for s in r.last_stacks:
        lines.append(f"  rank {s.rank:<5} {s.host:<16} {s.where or '(' + s.note + ')'}")
    return lines


HEADER = (
    f"{'run':<24} {'inc':>3} {'step':>7} {'loss':>9} {'mfu':>7} {'ranks':>5} {'status':<10} "
    "anomalies / restarts"
)


def run(args: argparse.Namespace) -> int:
    """Read the changelogs and print one line per run."""
    import msgspec

    from runwatch.common.settings import topic_prefix
    from runwatch.processors.fleet import default_app_id, last_stacks, latest_states, summarize
    from runwatch.resolve import resolve_bootstrap
    from runwatch.schemas.topics import names

    prefix = topic_prefix(args.prefix)
    app_id = args.app_id or default_app_id(prefix)
    bootstrap = resolve_bootstrap(args.bootstrap)
    views = latest_states(bootstrap, app_id)
    stacks = last_stacks(bootstrap, names(prefix).controller)
    rows = [
        msgspec.structs.replace(summarize(v), last_stacks=stacks[k].stacks)
        if k in stacks
        else summarize(v)
        for k, v in views.items()
        if args.run in (None, k)
    ]
    if args.json:
        for row in rows:
            print(msgspec.json.encode(row).decode())
        return 0
    if not rows:
        print(f"no runs known to the processors (app id {app_id})")
        return 0 if args.run is None else 1
    print(HEADER)
    for row in rows:
        print(format_row(row))
    for row in rows:
        for line in format_stacks(row):
            print(line)
    return 0
