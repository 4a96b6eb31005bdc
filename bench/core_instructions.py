"""Instructions per heartbeat and per step through the pure folds, counted by cachegrind.

Wall-clock figures on a shared machine vary several-fold; an instruction count does not.
This script runs itself under ``valgrind --tool=cachegrind`` twice per kind: once folding
``--events`` events and once building the same events but folding none. The difference,
divided by ``--events``, is the fold's cost per event: start-up, imports and building the
events cancel.

    .venv/bin/python bench/core_instructions.py [--events 16000] [--world 8]
        [--kinds heartbeat,step,packed,fed-off,fed-on,loose,general,ladder,check-loose,check-pack]
        [--pack-worlds 8,32] [--loose-batch-records 512] [--tree DIR] [--callgrind FILE]

Heartbeats: a started run of ``--world`` ranks (default 8), every rank one heartbeat per
step, step times jittered 2 % (as bench/core.py folds them), so the periodic scans and
straggler bucket closes are in the average. Steps: healthy StepCompleted events of a
GPT-2-sized run with loss and grad norm (as bench/core.py). ``packed`` (only on a tree that
has `processors.core.liveness_pack.fold_heartbeat_pack`): the same heartbeats folded one
`EventPack` of ``--world`` heartbeats at a time by the pure pack fold alone (no Replayer);
its figure is per heartbeat (per rank of a record).

``fed-off`` and ``fed-on`` (issue 23's pack path): the same heartbeats, one `EventPack`
record per step of all ranks, through `processors.pipeline.fold_batch` (what the worker
runs: the `Replayer`, its bookkeeping, the state's encoding once per batch) in batches of
``--batch-records`` records, with the heartbeat pack path off (every inner event folded
on its own) and on (`processors.core.liveness_pack`), once per world of
``--pack-worlds`` (packs of 8 at world 8, of 32 at world 32); figures per heartbeat, and
off/on printed per world. A ``--tree`` without the switch cannot run these kinds.

``loose`` (issue 23's loose records): the same heartbeats (``loose-heartbeat``) and
steps (``loose-step``), each event a record of its own, through `fold_batch` in batches of
``--loose-batch-records`` records (a worker folds rounds of up to 4,096 events a chunk),
the checkout's default path; ``general`` the same through the Replayer's general path
(``loose_path=False``; on a tree without the switch, its one path); general/loose printed.
``ladder`` splits a loose record's cost into the layers it goes through on the general
path, each rung running one layer more than the one before over the same records (the
difference of two rungs is that layer's own cost): ``rung-fold`` (the reducer alone),
``rung-apply`` (`Replayer._apply`), ``rung-dispatch`` (`Replayer._dispatch`, with
`_heartbeats`), ``rung-feed`` (`Replayer.feed` per batch: a Replayer, the records' loop,
`_flush` with the state's encoding), then `fold_batch` (``general``); for heartbeats and
steps (``--ladder-of heartbeat,step``). ``--callgrind FILE`` runs one kind's measured
process (``--kinds`` names one) under callgrind instead, folding (into FILE) and not
(FILE.no-fold), and prints the C functions' exclusive counts per event, the second run's
subtracted; `callgrind_annotate --inclusive=yes FILE` reads the whole profile (CPython
3.11 shows its C functions, not the Python ones: the rungs split the Python layers).

``check-loose`` and ``check-pack``: the same heartbeats as records read from Kafka, through
the topic's check (`schemas.records.check`: decode, type, key, broker time), one
heartbeat a record or one pack of ``--world`` a record; figures per heartbeat.

``--tree DIR`` measures another checkout (a git worktree of an older commit): the
measured process gets ``PYTHONPATH=DIR`` and runs from DIR, so ``runwatch`` resolves to
that tree (printed). ``PYTHONHASHSEED`` is fixed and numpy's BLAS runs no worker threads
(their spin-waits would be counted), so reruns agree closely. Prints one line per kind,
then one JSON line (``bench: core_instructions``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

S = 1_000_000_000
_QUIET = {
    "PYTHONHASHSEED": "0",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""The measured process's environment: fixed hashing, and no BLAS worker threads (numpy
is imported; its threads' spin-waits would be counted and vary from run to run)."""
HERE = Path(__file__).resolve()


def _heartbeats(world: int, events: int) -> tuple[Any, list[Any], list[Any]]:
    """The run's state after its RunStarted, and ``events`` heartbeats with their positions."""
    from runwatch.processors.core.config import DetectorConfig
    from runwatch.processors.core.liveness import fold_liveness
    from runwatch.schemas.events import Heartbeat, Provenance, RunStarted

    rng = random.Random(0)
    steps = max(1, math.ceil(events / world))
    beats = [
        Heartbeat(
            run_id="r",
            ts_ns=s * S // 4 + rng.randrange(50_000_000),
            rank=r,
            step=s,
            step_time_s=0.25 * (1.0 + rng.gauss(0.0, 0.02)),
        )
        for s in range(1, steps + 1)
        for r in range(world)
    ][:events]
    sources = [Provenance(topic="hb", partition=0, offset=i) for i in range(len(beats) + 1)]
    started = RunStarted(run_id="r", ts_ns=0, world_size=world)
    state0, _ = fold_liveness(None, started, sources[0], DetectorConfig())
    return state0, beats, sources[1:]


def _steps(events: int) -> tuple[Any, list[Any], list[Any]]:
    """A started run's step state and ``events`` healthy steps (bench/core.py's)."""
    from runwatch.processors.core.config import DetectorConfig
    from runwatch.processors.core.steps import fold_step
    from runwatch.schemas.events import ModelFlopConfig, Provenance, RunStarted, StepCompleted

    rng = random.Random(0)
    gpt2 = ModelFlopConfig(n_params=124_356_864, n_layer=12, n_head=12, d_model=768, seq_len=1024)
    sources = [Provenance(topic="steps", partition=0, offset=i) for i in range(events + 1)]
    steps = [
        StepCompleted(
            run_id="r",
            ts_ns=s * S // 4,
            step=s,
            loss=2.5 + math.exp(-s / 5000) + rng.gauss(0.0, 0.02),
            grad_norm=math.exp(rng.gauss(0.0, 0.08)),
            step_time_s=0.25 * (1.0 + rng.gauss(0.0, 0.01)),
            tokens=32768,
        )
        for s in range(1, events + 1)
    ]
    started = RunStarted(
        run_id="r",
        ts_ns=0,
        world_size=8,
        flop_config=gpt2,
        peak_flops_per_s=312e12,
        vocab_size=50257,
    )
    state0, _ = fold_step(None, started, sources[0], DetectorConfig())
    return state0, steps, sources[1:]


def _settle() -> None:
    """Collect, then freeze what is alive (the prebuilt events) out of later collections."""
    gc.collect()
    gc.freeze()


def _fed(world: int, events: int, fold: bool, *, pack_path: bool, batch_records: int) -> None:
    """Heartbeats in packs of ``world`` through ``fold_batch`` (``pack_path`` off or on)."""
    from runwatch.processors.core.config import DetectorConfig
    from runwatch.processors.pipeline import fold_batch
    from runwatch.schemas.events import EventPack, Provenance
    from runwatch.schemas.records import Decoded

    cfg = DetectorConfig()
    state, beats, _ = _heartbeats(world, events)
    items = [
        Decoded(
            Provenance(topic="hb", partition=0, offset=1 + i // world),
            EventPack(run_id="r", ts_ns=max(b.ts_ns for b in chunk), events=tuple(chunk)),
        )
        for i, chunk in ((i, beats[i : i + world]) for i in range(0, len(beats), world))
    ]
    batches = [items[i : i + batch_records] for i in range(0, len(items), batch_records)]
    states = {"r": state}
    _settle()
    verdicts = 0
    if fold:
        for batch in batches:
            result = fold_batch(
                "heartbeats",  # type: ignore[arg-type]
                batch,
                states.get,
                lambda _: ("r",),
                cfg,
                pack_path=pack_path,  # type: ignore[call-arg]
            )
            states["r"] = result.states["r"]
            verdicts += len(result.outputs)
    print(f"folded={fold} verdicts={verdicts}", file=sys.stderr)


def _checks(kind: str, world: int, events: int, fold: bool) -> None:
    """The heartbeats as raw records of the heartbeats topic through ``records.check``."""
    from runwatch.schemas.codec import encode
    from runwatch.schemas.events import EventPack
    from runwatch.schemas.records import RawRecord, check
    from runwatch.schemas.topics import TopicRole

    _, beats, _ = _heartbeats(world, events)
    size = 1 if kind == "check-loose" else world
    groups = [beats[i : i + size] for i in range(0, len(beats), size)]
    values = [
        encode(g[0] if size == 1 else EventPack(run_id="r", ts_ns=g[-1].ts_ns, events=tuple(g)))
        for g in groups
    ]
    stamp_ms = max(b.ts_ns for b in beats) // 1_000_000 + 1
    records = [
        RawRecord("hb", 0, offset, b"r", value, stamp_ms) for offset, value in enumerate(values)
    ]
    _settle()
    good = 0
    if fold:
        for record in records:
            good += type(check(record, TopicRole.HEARTBEATS)).__name__ == "Decoded"
    print(f"folded={fold} decoded={good}", file=sys.stderr)


LOOSE_KINDS = ("heartbeat", "step")
"""What a loose record of ``loose-*``, ``general-*`` and ``rung-*-*`` is."""
RUNGS = ("rung-fold", "rung-apply", "rung-dispatch", "rung-feed", "general")
"""The ladder's rungs, each one layer more than the one before (the module docstring)."""


def _loose_records(what: str, world: int, events: int) -> tuple[str, Any, list[Any]]:
    """The role, the run's state before, and ``events`` loose records of ``what``."""
    from runwatch.schemas.records import Decoded

    if what == "heartbeat":
        state, beats, sources = _heartbeats(world, events)
        return "heartbeats", state, [Decoded(s, b) for s, b in zip(sources, beats, strict=True)]
    state, steps, sources = _steps(events)
    return "steps", state, [Decoded(s, e) for s, e in zip(sources, steps, strict=True)]


def _loose(
    what: str, world: int, events: int, fold: bool, batch_records: int, path: bool | None
) -> None:
    """Loose records through ``fold_batch`` (``path``: its ``loose_path``; None: default)."""
    import inspect

    from runwatch.processors.core.config import DetectorConfig
    from runwatch.processors.pipeline import fold_batch

    cfg = DetectorConfig()
    role, state, items = _loose_records(what, world, events)
    batches = [items[i : i + batch_records] for i in range(0, len(items), batch_records)]
    switch = "loose_path" in inspect.signature(fold_batch).parameters  # a tree without it:
    options = {"loose_path": path} if switch and path is not None else {}  # its one path
    states = {"r": state}
    _settle()
    verdicts = 0
    if fold:
        for batch in batches:
            result = fold_batch(role, batch, states.get, lambda _: ("r",), cfg, **options)  # type: ignore[arg-type]
            states["r"] = result.states["r"]
            verdicts += len(result.outputs)
    print(f"folded={fold} verdicts={verdicts}", file=sys.stderr)


def _rung(rung: str, what: str, world: int, events: int, fold: bool, batch_records: int) -> None:
    """One rung of the ladder below `fold_batch`, on the Replayer's general path."""
    import inspect

    from runwatch.processors.core.config import DetectorConfig
    from runwatch.processors.core.liveness import fold_liveness
    from runwatch.processors.core.replay import Replayer
    from runwatch.processors.core.steps import fold_step

    cfg = DetectorConfig()
    role, state, items = _loose_records(what, world, events)
    records = [(role, source, event) for source, event in items]
    batches = [records[i : i + batch_records] for i in range(0, len(records), batch_records)]
    general = (
        {"loose_path": False} if "loose_path" in inspect.signature(Replayer).parameters else {}
    )
    _settle()
    verdicts = 0
    if fold and rung == "rung-fold":
        reducer = fold_liveness if what == "heartbeat" else fold_step
        for _, source, event in records:
            state, out = reducer(state, event, source, cfg)  # type: ignore[operator]
            verdicts += len(out)
    elif fold:
        for batch in batches:
            replayer = Replayer(cfg, **general)
            store = replayer.states_of(role)
            store["r"] = state
            if rung == "rung-feed":
                replayer.feed(batch)  # type: ignore[arg-type]
            else:
                _step_rung(replayer, rung, what, batch)
            state = store["r"]
            verdicts += len(replayer.recomputed)
    print(f"folded={fold} verdicts={verdicts}", file=sys.stderr)


def _step_rung(replayer: Any, rung: str, what: str, batch: list[Any]) -> None:
    """`_apply` or `_dispatch` per record of one batch, with the batch's touched map."""
    from runwatch.schemas.topics import StateKind

    replayer._touched = {}
    if rung == "rung-dispatch":
        dispatch = replayer._dispatch
        for role, source, event in batch:
            dispatch(role, source, event)
    elif what == "heartbeat":
        apply, store, fold = replayer._apply, replayer.liveness, replayer._fold_liveness
        for _, source, event in batch:
            replayer._collect(apply(StateKind.LIVENESS, store, "r", source, event, fold) or [])
    else:
        apply, store, fold = replayer._apply, replayer.steps, replayer._fold_step
        for _, source, event in batch:
            replayer._collect(apply(StateKind.STEPS, store, "r", source, event, fold) or [])
    replayer._touched = None


def inner(kind: str, events: int, world: int, fold: bool, batch_records: int = 64) -> None:
    """Build ``events`` events of ``kind``; fold them when ``fold`` (the measured process).

    The events are built, then moved out of the collector's reach (`gc.freeze`): a full
    collection walks every live object, so without it a fold's count would depend on when
    the collector happened to run over the prebuilt events, not on the fold.
    """
    from runwatch.processors.core.config import DetectorConfig

    cfg = DetectorConfig()
    verdicts = 0
    if kind == "step":
        from runwatch.processors.core.steps import fold_step

        state, steps, sources = _steps(events)
        _settle()
        if fold:
            for event, source in zip(steps, sources, strict=True):
                state, out = fold_step(state, event, source, cfg)
                verdicts += len(out)
    elif kind == "heartbeat":
        from runwatch.processors.core.liveness import fold_liveness

        state, beats, sources = _heartbeats(world, events)
        _settle()
        if fold:
            for event, source in zip(beats, sources, strict=True):
                state, out = fold_liveness(state, event, source, cfg)
                verdicts += len(out)
    elif kind in ("fed-off", "fed-on"):
        _fed(world, events, fold, pack_path=kind == "fed-on", batch_records=batch_records)
        return
    elif kind in ("check-loose", "check-pack"):
        _checks(kind, world, events, fold)
        return
    elif kind.startswith(("loose-", "general-")):
        path = None if kind.startswith("loose-") else False
        _loose(kind.split("-", 1)[1], world, events, fold, batch_records, path)
        return
    elif kind.startswith("rung-"):
        rung, what = kind.rsplit("-", 1)
        _rung(rung, what, world, events, fold, batch_records)
        return
    else:  # packed: one record of `world` heartbeats at a time, one offset per record
        from runwatch.processors.core.liveness_pack import fold_heartbeat_pack
        from runwatch.schemas.events import EventPack, Provenance

        state, beats, _ = _heartbeats(world, events)
        records = [
            (
                EventPack(run_id="r", ts_ns=beats[i].ts_ns, events=tuple(beats[i : i + world])),
                Provenance(topic="hb", partition=0, offset=1 + i // world),
            )
            for i in range(0, len(beats), world)
        ]
        _settle()
        if fold:
            for pack, source in records:
                state, out, _, _ = fold_heartbeat_pack(state, pack, source, cfg)
                verdicts += len(out)
    print(f"folded={fold} verdicts={verdicts}", file=sys.stderr)


def _count(
    tree: Path,
    kind: str,
    events: int,
    world: int,
    fold: bool,
    batch_records: int = 64,
    callgrind: Path | None = None,
) -> int:
    """Instructions cachegrind counts for one inner run (after one run outside valgrind).

    The run outside valgrind compiles and caches every module's bytecode first: otherwise
    whichever counted run came first after an edit would also count the compilation.
    With ``callgrind``, the run is callgrind's instead, its profile written there.
    """
    env = dict(os.environ, PYTHONPATH=str(tree), **_QUIET)
    warm = [sys.executable, str(HERE), "--inner", kind, "--events", "1", "--no-fold"]
    subprocess.run(warm, cwd=tree, env=env, capture_output=True, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "cg.out"
        tool = (
            ["--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out_file}"]
            if callgrind is None
            else ["--tool=callgrind", f"--callgrind-out-file={callgrind}"]
        )
        cmd = [
            "valgrind",
            *tool,
            sys.executable,
            str(HERE),
            "--inner",
            kind,
            "--events",
            str(events),
            "--world",
            str(world),
            "--batch-records",
            str(batch_records),
            "--fold" if fold else "--no-fold",
        ]
        run = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
        if run.returncode != 0:
            raise SystemExit(f"{kind} under valgrind failed:\n{run.stderr[-3000:]}")
        match = re.search(r"(?:I\s+refs|Collected)\s*:\s+([\d,]+)", run.stderr)
        if match is None:
            raise SystemExit(f"no instruction count in valgrind's output:\n{run.stderr[-3000:]}")
        return int(match.group(1).replace(",", ""))


def _exclusive(profile: Path) -> dict[str, int]:
    """C function -> the instructions callgrind counted in it (exclusive), summed by name."""
    text = subprocess.run(
        ["callgrind_annotate", "--threshold=100", str(profile)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    out: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)", line)
        if match and "PROGRAM TOTALS" not in line:
            name = re.sub(r" \[.*\]$", "", match.group(2)).split(":")[-1]
            out[name] = out.get(name, 0) + int(match.group(1).replace(",", ""))
    return out


def _c_functions(folded: Path, empty: Path, events: int, top: int = 25) -> None:
    """Print the C functions of the fold: the folded run's counts less the empty run's."""
    a, b = _exclusive(folded), _exclusive(empty)
    diff = {name: a.get(name, 0) - b.get(name, 0) for name in a.keys() | b.keys()}
    total = sum(diff.values())
    print(f"{total / events:,.0f} instructions per event; C functions (exclusive):")
    for name, count in sorted(diff.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {count / events:>8,.0f} {count / total:6.1%}  {name}")


def _expand(kinds: list[str], ladder_of: list[str]) -> list[str]:
    """The inner kinds ``--kinds`` names (``loose``, ``general`` and ``ladder`` expanded)."""
    out: list[str] = []
    for kind in kinds:
        if kind in ("loose", "general"):
            out += [f"{kind}-{what}" for what in LOOSE_KINDS]
        elif kind == "ladder":
            out += [f"{rung}-{what}" for what in ladder_of for rung in RUNGS]
        else:
            out.append(kind)
    return list(dict.fromkeys(out))


def _ladder(per_event: dict[str, float], ladder_of: list[str]) -> dict[str, dict[str, float]]:
    """Each layer's own instructions per event: a rung's count less the one below it."""
    layers: dict[str, dict[str, float]] = {}
    for what in ladder_of:
        below = 0.0
        layers[what] = {}
        for rung in RUNGS:
            layer = "fold_batch" if rung == "general" else rung.removeprefix("rung-")
            layers[what][layer] = per_event[f"{rung}-{what}"] - below
            below = per_event[f"{rung}-{what}"]
        total = below
        print(f"ladder of a loose {what} ({total:,.0f} instructions through fold_batch):")
        for layer, own in layers[what].items():
            print(f"  {layer:>10}: {own:>8,.0f} ({own / total:6.1%})")
    return layers


def _where(tree: Path) -> str:
    """The ``runwatch`` package the measured process imports (proves ``--tree`` took)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    code = "import runwatch; print(runwatch.__file__)"
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, check=True
    )
    return run.stdout.strip()


def main() -> None:
    """Parse the arguments; measure (or, with ``--inner``, be the measured process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=16_000)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--kinds", default="heartbeat,step")
    parser.add_argument("--pack-worlds", default="8,32", help="worlds of fed-off / fed-on")
    parser.add_argument("--batch-records", type=int, default=64, help="fed-*: records a batch")
    parser.add_argument("--tree", type=Path, default=HERE.parents[1], help="checkout to measure")
    parser.add_argument(
        "--loose-batch-records",
        type=int,
        default=512,
        help="loose, general, ladder: records a batch",
    )
    parser.add_argument("--ladder-of", default="heartbeat,step", help="ladder: of which records")
    parser.add_argument("--callgrind", type=Path, help="profile the one kind's fold here")
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    parser.add_argument("--fold", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    if args.inner:
        inner(args.inner, args.events, args.world, args.fold, args.batch_records)
        return
    tree = args.tree.resolve()
    package = _where(tree)
    print(f"measuring {package} ({args.events:,} events, world {args.world})")
    per_event: dict[str, float] = {}
    kinds = args.kinds.split(",")
    ladder_of = args.ladder_of.split(",")
    inner_kinds = _expand(kinds, ladder_of)
    if args.callgrind is not None:
        if len(inner_kinds) != 1 or inner_kinds[0].startswith("fed-"):
            raise SystemExit("--callgrind profiles one kind (not fed-*): name it in --kinds")
        batch = args.loose_batch_records if "-" in inner_kinds[0] else args.batch_records
        empty = args.callgrind.with_name(args.callgrind.name + ".no-fold")
        _count(tree, inner_kinds[0], args.events, args.world, True, batch, args.callgrind)
        _count(tree, inner_kinds[0], args.events, args.world, False, batch, empty)
        _c_functions(args.callgrind, empty, args.events)
        print(f"callgrind_annotate --inclusive=yes {args.callgrind}")
        return
    for kind in inner_kinds:
        fed = kind.startswith("fed-")
        batch = args.batch_records if fed or "-" not in kind else args.loose_batch_records
        for world in [int(w) for w in args.pack_worlds.split(",")] if fed else [args.world]:
            name = f"{kind}@{world}" if fed else kind
            folded = _count(tree, kind, args.events, world, True, batch)
            empty = _count(tree, kind, args.events, world, False, batch)
            per_event[name] = (folded - empty) / args.events
            print(f"{name:>22}: {per_event[name]:>10,.0f} instructions per event")
    ratios: dict[str, float] = {}
    if "fed-off" in kinds and "fed-on" in kinds:
        for world in args.pack_worlds.split(","):
            ratios[world] = per_event[f"fed-off@{world}"] / per_event[f"fed-on@{world}"]
            print(f"packs of {world} (world {world}): pack path off/on {ratios[world]:.2f}x")
    general_over_loose: dict[str, float] = {}
    for what in LOOSE_KINDS:
        if f"loose-{what}" in per_event and f"general-{what}" in per_event:
            general_over_loose[what] = per_event[f"general-{what}"] / per_event[f"loose-{what}"]
            print(f"loose {what}: general path / default path {general_over_loose[what]:.2f}x")
    layers = _ladder(per_event, ladder_of) if "ladder" in kinds else {}
    commit = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    print(
        json.dumps(
            {
                "bench": "core_instructions",
                "tree": str(tree),
                "commit": commit,
                "runwatch": package,
                "python": sys.version.split()[0],
                "events": args.events,
                "world": args.world,
                "instructions_per_event": {k: round(v) for k, v in per_event.items()},
                "pack_path_off_over_on": {k: round(v, 3) for k, v in ratios.items()},
                "batch_records": args.batch_records,
                "loose_batch_records": args.loose_batch_records,
                "general_over_loose": {k: round(v, 3) for k, v in general_over_loose.items()},
                "ladder": {w: {k: round(v) for k, v in d.items()} for w, d in layers.items()},
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
