"""Throughput of the pure reducers on one core: heartbeats/s and steps/s.

Events are built before timing; the loop only folds (the work a processor does per
record after decoding). Each figure is the best of several repetitions, since a shared
machine only ever slows a run down. Also compares the sorted-tuple median/MAD with numpy
on a 50-value window, and measures the state encoding that table writes pay.

    .venv/bin/python bench/core.py [--events 200000] [--repeat 5] [--worlds 8,64,1024,4096,16384]
        [--pack-events 512] [--batch-records 5000] [--pipeline-events 2000] [--pipeline-only]

Heartbeats are folded for each world size (at least 4 steps of every rank, so the
per-step work, bucket closes and periodic scans, is in the average); the per-event cost
and the encoded liveness state (bytes per run, what a batch writes to the changelog) are
printed per world, with the cost at 4,096 over the cost at 8 (goal <= 1.5).

The same heartbeats then go through the path a worker runs per batch, unpacked (one
record per event) and packed (`schemas.events.EventPack` records of ``--pack-events``):
decode and intake (`schemas.records.split`), then `processors.pipeline.fold_batch` in
batches of ``--batch-records`` records, each batch loading the run's stored state and
leaving its new state as bytes (what the changelog gets: one value per run per batch).
Packed records go through with the heartbeat pack path (`processors.core.liveness_pack`)
and without it. ``--pack-events 0`` makes one record per step of all ranks (a world's
heartbeats, as a node or a gang packs them). Printed per world: microseconds per event
each way, and the changelog bytes per run per batch with what that is per event.
``--pipeline-only`` measures this section alone (best of ``--repeat``), then prints one
JSON line (``bench: core_pipeline``). The unpacked path checks (encodes) the state after
every record, which dominates at large worlds, so it folds at most ``--pipeline-events``
(default 2,000) events there.

Targets: >= 200k heartbeats/s and >= 100k steps/s; 4,096/8 per-event cost <= 1.5.

These are wall-clock figures: on a shared machine they vary several-fold between runs. For a
per-event cost that reruns to the same number (and compares checkouts), count instructions
with ``bench/core_instructions.py`` (cachegrind).

``--codec-only`` measures, per world of ``--worlds``, a liveness state's encode (what a
round pays for every run it touched) and decode alone, after four steps of every rank,
best of ``--repeat``; one JSON line (``bench: core_codec``):

    .venv/bin/python bench/core.py --codec-only --worlds 4096,16384,131072

``--huge-only`` measures one thing (issue 19, finding 8): unpacked heartbeats through
decode + `fold_batch` (batches of ``--batch-records``) at world 8 and at ``--huge-world``
(131,072), ``--huge-events`` of each; prints the per-heartbeat cost of both and their
ratio, then one JSON line (``bench: core_huge``). Goal: the ratio stays near 1 (flat cost).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from runwatch.processors.core import liveness as liveness_module
from runwatch.processors.core import steps as steps_module
from runwatch.processors.core.baseline import RollingBaseline
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.detectors.registry import LIVENESS_DETECTORS, STEP_DETECTORS
from runwatch.processors.core.liveness import LivenessState, fold_liveness
from runwatch.processors.core.state_codec import decode_state, encode_state
from runwatch.processors.core.steps import StepHealthState, fold_step
from runwatch.processors.pipeline import fold_batch
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import (
    EventPack,
    Heartbeat,
    ModelFlopConfig,
    Provenance,
    RunStarted,
    StepCompleted,
)
from runwatch.schemas.records import RawRecord, split

S = 1_000_000_000
CFG = DetectorConfig()
GPT2 = ModelFlopConfig(n_params=124_356_864, n_layer=12, n_head=12, d_model=768, seq_len=1024)


def best_rate(n: int, repeat: int, body: Callable[[], object]) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        body()
        best = min(best, time.perf_counter() - start)
    return n / best


class HeartbeatRun:
    """One world size's heartbeats, built before timing; `once` folds them all."""

    def __init__(self, world: int, events: int) -> None:
        rng = random.Random(0)
        events = max(events, 4 * world)
        self.sources = [Provenance(topic="hb", partition=0, offset=i) for i in range(events + 1)]
        self.beats = [
            Heartbeat(
                run_id="r",
                ts_ns=s * S // 4 + rng.randrange(50_000_000),
                rank=r,
                step=s,
                step_time_s=0.25 * (1.0 + rng.gauss(0.0, 0.02)),
            )
            for s in range(1, events // world + 1)
            for r in range(world)
        ]
        state0, _ = fold_liveness(
            None, RunStarted(run_id="r", ts_ns=0, world_size=world), self.sources[0], CFG
        )
        self.stored = encode_state(state0)
        self.final: LivenessState = state0
        self.verdicts = 0

    def once(self) -> float:
        """Seconds to fold every heartbeat, from the state as a processor loads it."""
        state = decode_state("liveness", self.stored)
        assert isinstance(state, LivenessState)
        verdicts = 0
        start = time.perf_counter()
        for event, source in zip(self.beats, self.sources[1:], strict=False):
            state, out = fold_liveness(state, event, source, CFG)
            verdicts += len(out)
        elapsed = time.perf_counter() - start
        self.final, self.verdicts = state, verdicts
        return elapsed


def heartbeat_rates(
    worlds: list[int], events: int, repeat: int
) -> dict[int, tuple[float, int, int, float]]:
    """Heartbeats/s, verdicts, encoded state bytes and codec µs per world size.

    The world sizes are interleaved within each repetition, so a change in the machine's
    load during the run affects all of them alike (the ratio is what matters).
    """
    runs = {world: HeartbeatRun(world, events) for world in worlds}
    best = dict.fromkeys(worlds, math.inf)
    for _ in range(repeat):
        for world, run in runs.items():
            best[world] = min(best[world], run.once())
    return {
        w: (len(r.beats) / best[w], r.verdicts, len(encode_state(r.final)), codec_us(r.final))
        for w, r in runs.items()
    }


def codec_us(state: LivenessState, repeat: int = 5) -> float:
    """Microseconds to encode a state and decode it again (what a batch pays per run)."""
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        decode_state("liveness", encode_state(state))
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def codec_main(args: argparse.Namespace) -> None:
    """The ``--codec-only`` case: a large run's liveness state encoded and decoded alone.

    Per world of ``--worlds``: every rank's heartbeats for four steps folded (their times
    50 ms apart at random, as `HeartbeatRun` makes them), then the final state encoded
    (what a round pays for each run it touched: `processors.core.replay.Replayer`'s check)
    and decoded (what a worker's load or a recovery pays), each the best of ``--repeat``
    passes of enough calls for ~0.2 s.
    """
    worlds = [int(w) for w in args.worlds.split(",")]
    figures: dict[str, dict[str, float]] = {}
    for world in worlds:
        run = HeartbeatRun(world, 4 * world)
        run.once()
        state, raw = run.final, encode_state(run.final)
        calls = max(5, 3_000_000 // world)
        passes = range(args.repeat)
        encode_s = min(_per_call(lambda s=state: encode_state(s), calls) for _ in passes)
        decode_s = min(_per_call(lambda r=raw: decode_state("liveness", r), calls) for _ in passes)
        figures[str(world)] = {
            "bytes": len(raw),
            "encode_us": round(encode_s * 1e6, 1),
            "decode_us": round(decode_s * 1e6, 1),
        }
        print(
            f"liveness state, world {world:>7,}: {len(raw):>9,} bytes, encode "
            f"{encode_s * 1e6:9.1f} us, decode {decode_s * 1e6:9.1f} us"
        )
    line = {"bench": "core_codec", "python": sys.version.split()[0], "repeat": args.repeat}
    print(json.dumps({**line, "worlds": figures}, sort_keys=True))


def _per_call(call: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``call``, over ``calls`` calls."""
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls


class PipelineCost(NamedTuple):
    """One world's per-event cost through decode + fold_batch, and its changelog writes."""

    unpacked_us: float
    packed_us: float
    packed_off_us: float
    unpacked_events: int
    packed_events: int
    changelog_bytes_per_batch: int
    unpacked_batches: int
    packed_batches: int


def _records(beats: list[Heartbeat], pack_events: int) -> list[RawRecord]:
    key = encode_key("r")
    if pack_events <= 1:
        values = [encode(b) for b in beats]
    else:
        values = [
            encode(
                EventPack(
                    run_id="r",
                    ts_ns=max(b.ts_ns for b in chunk),
                    events=tuple(chunk),
                )
            )
            for chunk in (beats[i : i + pack_events] for i in range(0, len(beats), pack_events))
        ]
    return [RawRecord("hb", 0, i + 1, key, v) for i, v in enumerate(values)]


def _through_pipeline(
    world: int, records: list[RawRecord], batch_records: int, *, pack_path: bool = True
) -> tuple[float, list[int]]:
    """Seconds to decode and fold ``records`` batch by batch, and each batch's state bytes.

    ``pack_path``: `fold_batch`'s switch of the heartbeat pack path (issue 23).
    """
    started = RawRecord(
        "hb", 0, 0, encode_key("r"), encode(RunStarted(run_id="r", ts_ns=0, world_size=world))
    )
    table: dict[str, bytes] = {}

    def load(run_id: str) -> object:
        raw = table.get(run_id)
        return None if raw is None else decode_state("liveness", raw)

    good, _ = split([started], "heartbeats")
    table.update(fold_batch("heartbeats", good, load, lambda _: (), CFG).encoded)
    sizes: list[int] = []
    begin = time.perf_counter()
    for i in range(0, len(records), batch_records):
        good, dead = split(records[i : i + batch_records], "heartbeats")
        assert not dead
        result = fold_batch("heartbeats", good, load, lambda _: (), CFG, pack_path=pack_path)
        table.update(result.encoded)
        sizes.append(len(result.encoded["r"]))
    return time.perf_counter() - begin, sizes


def pipeline_costs(
    worlds: list[int],
    events: int,
    repeat: int,
    *,
    pack_events: int,
    batch_records: int,
    plain_cap: int,
) -> dict[int, PipelineCost]:
    """Per-event cost unpacked and packed through decode + fold_batch, per world size.

    Packed records go through twice per repetition: with the heartbeat pack path
    (`processors.core.liveness_pack`) and without it (every inner event on its own).
    ``pack_events`` 0: one record per step of all ranks (``world`` heartbeats).
    """
    out: dict[int, PipelineCost] = {}
    for world in worlds:
        beats = HeartbeatRun(world, events).beats
        plain = beats[: min(len(beats), plain_cap)] if world >= 1024 else beats
        plain_records = _records(plain, 1)
        packed_records = _records(beats, pack_events or world)
        best_plain = best_packed = best_off = math.inf
        sizes: list[int] = []
        plain_batches = packed_batches = 0
        for _ in range(repeat):
            seconds, got = _through_pipeline(world, plain_records, batch_records)
            best_plain, plain_batches = min(best_plain, seconds), len(got)
            seconds, sizes = _through_pipeline(world, packed_records, batch_records)
            best_packed, packed_batches = min(best_packed, seconds), len(sizes)
            seconds, _ = _through_pipeline(world, packed_records, batch_records, pack_path=False)
            best_off = min(best_off, seconds)
        out[world] = PipelineCost(
            unpacked_us=best_plain / len(plain) * 1e6,
            packed_us=best_packed / len(beats) * 1e6,
            packed_off_us=best_off / len(beats) * 1e6,
            unpacked_events=len(plain),
            packed_events=len(beats),
            changelog_bytes_per_batch=round(sum(sizes) / len(sizes)),
            unpacked_batches=plain_batches,
            packed_batches=packed_batches,
        )
    return out


def _huge_beats(world: int, events: int) -> list[Heartbeat]:
    rng = random.Random(0)
    return [
        Heartbeat(
            run_id="r",
            ts_ns=(i // world + 1) * S // 4 + rng.randrange(50_000_000),
            rank=i % world,
            step=i // world + 1,
            step_time_s=0.25,
        )
        for i in range(events)
    ]


def huge_costs(huge: int, events: int, batch_records: int, repeat: int) -> dict[int, float]:
    """Microseconds per unpacked heartbeat through decode + fold_batch, at world 8 and ``huge``.

    The worlds are interleaved within each repetition (the best of ``repeat`` counts), so a
    change in the machine's load affects both alike.
    """
    records = {w: _records(_huge_beats(w, events), 1) for w in (8, huge)}
    best = dict.fromkeys(records, math.inf)
    for _ in range(repeat):
        for world, recs in records.items():
            seconds, _ = _through_pipeline(world, recs, batch_records)
            best[world] = min(best[world], seconds)
    return {w: best[w] / events * 1e6 for w in records}


def huge_main(args: argparse.Namespace) -> None:
    """The ``--huge-only`` case: per-heartbeat cost at world 8 vs ``--huge-world``."""
    costs = huge_costs(args.huge_world, args.huge_events, args.batch_records, args.repeat)
    small, big = costs[8], costs[args.huge_world]
    print(f"unpacked heartbeat through decode+fold_batch, world 8: {small:9.2f} us/event")
    print(f"unpacked heartbeat through decode+fold_batch, world {args.huge_world:,}: {big:9.2f} us")
    print(f"per-heartbeat cost, world {args.huge_world:,} / world 8: {big / small:.2f}x")
    print(
        json.dumps(
            {
                "bench": "core_huge",
                "python": sys.version.split()[0],
                "huge_world": args.huge_world,
                "events_per_world": args.huge_events,
                "batch_records": args.batch_records,
                "repeat": args.repeat,
                "us_per_heartbeat_world8": round(small, 3),
                "us_per_heartbeat_huge": round(big, 3),
                "cost_ratio_huge_over_8": round(big / small, 3),
            },
            sort_keys=True,
        )
    )


def _step_events(
    events: int, cfg: DetectorConfig = CFG
) -> tuple[StepHealthState, list[StepCompleted], list[Provenance]]:
    """A started run's state and ``events`` healthy steps (step times jittered 1 %)."""
    rng = random.Random(0)
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
        flop_config=GPT2,
        peak_flops_per_s=312e12,
        vocab_size=50257,
    )
    state0, _ = fold_step(None, started, sources[0], cfg)
    return state0, steps, sources


def step_rate(events: int, repeat: int, cfg: DetectorConfig = CFG) -> tuple[float, int, int]:
    """Steps/s folded, encoded step state bytes, kept steps (step times jittered 1 %)."""
    state0, steps, sources = _step_events(events, cfg)
    final = [state0]

    def body() -> None:
        state = state0
        for event, source in zip(steps, sources[1:], strict=False):
            state, _ = fold_step(state, event, source, cfg)
        final[0] = state

    rate = best_rate(len(steps), repeat, body)
    return rate, len(encode_state(final[0])), final[0].kept_steps


Fold = Callable[..., Any]


def _timed(name: str, fold: Fold, spent: dict[str, int]) -> Fold:
    """``fold`` adding the thread's CPU time it takes (ns) to ``spent[name]``.

    CPU time, not wall time: a fold takes a microsecond or two, and on a shared machine a
    single preemption inside one would outweigh thousands of them.
    """
    clock = time.thread_time_ns

    def timed(*args: Any) -> Any:
        start = clock()
        out = fold(*args)
        spent[name] += clock() - start
        return out

    return timed


def _timer_overhead_ns() -> float:
    """What `_timed` adds to one call (a no-op fold timed), best of 5."""
    spent = {"noop": 0}
    noop = _timed("noop", lambda *args: None, spent)
    best = math.inf
    for _ in range(5):
        spent["noop"] = 0
        for _ in range(20_000):
            noop(None, None)
        best = min(best, spent["noop"] / 20_000)
    return best


def detector_costs(events: int, repeat: int) -> dict[str, float]:
    """CPU microseconds per event that each registered detector's fold takes (best of ``repeat``).

    Each fold of `STEP_DETECTORS` (over healthy steps) and each heartbeat fold of
    `LIVENESS_DETECTORS` (world 8) is wrapped in a timer for one pass, the reducers'
    registered tuples swapped for the wrapped ones and restored after; a timer's own
    cost is measured on a no-op and subtracted.
    """
    overhead = _timer_overhead_ns()
    best: dict[str, float] = {}
    state0, steps, sources = _step_events(events)
    beats = HeartbeatRun(8, events)
    step_folds, hb_folds = steps_module._FOLDS, liveness_module.HEARTBEAT_FOLDS
    for _ in range(repeat):
        spent = dict.fromkeys([f"step {d.name}" for d in STEP_DETECTORS], 0)
        spent.update((f"heartbeat {d.name}", 0) for d in LIVENESS_DETECTORS if d.heartbeat)
        steps_module._FOLDS = tuple(  # type: ignore[misc]
            (index, _timed(f"step {d.name}", fold, spent))
            for (index, fold), d in zip(step_folds, STEP_DETECTORS, strict=True)
        )
        liveness_module.HEARTBEAT_FOLDS = tuple(  # type: ignore[misc]
            _timed(f"heartbeat {d.name}", d.heartbeat, spent)
            for d in LIVENESS_DETECTORS
            if d.heartbeat
        )
        try:
            state = state0
            for event, source in zip(steps, sources[1:], strict=False):
                state, _ = fold_step(state, event, source, CFG)
            beats.once()
        finally:
            steps_module._FOLDS = step_folds  # type: ignore[misc]
            liveness_module.HEARTBEAT_FOLDS = hb_folds  # type: ignore[misc]
        for name, ns in spent.items():
            n = len(steps) if name.startswith("step") else len(beats.beats)
            best[name] = min(best.get(name, math.inf), max(0.0, ns / n - overhead) / 1e3)
    return best


def baseline_rates(repeat: int) -> tuple[float, float]:
    rng = random.Random(1)
    values = [rng.gauss(0.0, 1.0) for _ in range(20_000)]
    window = 50

    def pure() -> None:
        b = RollingBaseline(window, 10)
        for i, v in enumerate(values):
            b.z_score(v)
            b = b.with_value(v, i)

    def with_numpy() -> None:
        buf = np.empty(0)
        for v in values:
            if buf.size >= 10:
                m = np.median(buf)
                scale = 1.4826 * np.median(np.abs(buf - m))
                _ = (v - m) / scale if scale > 0 else 0.0
            buf = np.append(buf, v)[-window:]

    return best_rate(len(values), repeat, pure), best_rate(
        len(values), max(1, repeat // 2), with_numpy
    )


def print_pipeline(pipe: dict[int, PipelineCost], args: argparse.Namespace) -> None:
    """One line per world: unpacked, packed, packed without the pack path; changelog bytes."""
    for world, c in pipe.items():
        per_batch_plain = c.unpacked_events / c.unpacked_batches
        per_batch_packed = c.packed_events / c.packed_batches
        print(
            f"decode+fold_batch, world {world:>6,}: unpacked {c.unpacked_us:9.2f} us/event, "
            f"packed ({args.pack_events or world}/record) {c.packed_us:7.2f} us/event "
            f"({c.unpacked_us / c.packed_us:6.1f}x; pack path off {c.packed_off_us:7.2f} us, "
            f"{c.packed_off_us / c.packed_us:4.2f}x); changelog {c.changelog_bytes_per_batch:,} "
            f"bytes/run/batch = {c.changelog_bytes_per_batch / per_batch_plain:.2f} B/event "
            f"unpacked, {c.changelog_bytes_per_batch / per_batch_packed:.3f} packed "
            f"(batches of {args.batch_records:,} records)"
        )


def pipeline_main(args: argparse.Namespace) -> None:
    """The ``--pipeline-only`` case: decode + fold_batch per world, then one JSON line."""
    worlds = sorted(int(w) for w in args.worlds.split(","))
    pipe = pipeline_costs(
        worlds,
        args.events,
        args.repeat,
        pack_events=args.pack_events,
        batch_records=args.batch_records,
        plain_cap=args.pipeline_events,
    )
    print_pipeline(pipe, args)
    print(
        json.dumps(
            {
                "bench": "core_pipeline",
                "python": sys.version.split()[0],
                "events": args.events,
                "repeat": args.repeat,
                "pack_events": args.pack_events,
                "batch_records": args.batch_records,
                "unpacked_us_per_event": {str(w): round(c.unpacked_us, 3) for w, c in pipe.items()},
                "packed_us_per_event": {str(w): round(c.packed_us, 3) for w, c in pipe.items()},
                "packed_pack_path_off_us_per_event": {
                    str(w): round(c.packed_off_us, 3) for w, c in pipe.items()
                },
            },
            sort_keys=True,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--worlds", default="8,64,1024,4096,16384")
    parser.add_argument("--pack-events", type=int, default=512, help="events per pack record")
    parser.add_argument("--batch-records", type=int, default=5000, help="records per batch")
    parser.add_argument("--pipeline-events", type=int, default=2000, help="unpacked cap")
    parser.add_argument("--huge-only", action="store_true", help="only world 8 vs --huge-world")
    parser.add_argument("--huge-world", type=int, default=131_072)
    parser.add_argument("--huge-events", type=int, default=5000, help="heartbeats per world")
    parser.add_argument(
        "--pipeline-only", action="store_true", help="only decode+fold_batch per world"
    )
    parser.add_argument(
        "--codec-only", action="store_true", help="only a large run's state encode and decode"
    )
    args = parser.parse_args()
    if args.codec_only:
        codec_main(args)
        return
    if args.huge_only:
        huge_main(args)
        return
    if args.pipeline_only:
        pipeline_main(args)
        return
    worlds = sorted({8, *(int(w) for w in args.worlds.split(","))})
    beats = heartbeat_rates(worlds, args.events, args.repeat)
    for world in worlds:
        rate, verdicts, size, codec = beats[world]
        print(
            f"heartbeats, world {world:>6,}: {rate:>10,.0f} /s  {1e6 / rate:7.2f} us/event  "
            f"state {size:>8,} bytes, encode+decode {codec:8.1f} us  (verdicts {verdicts})"
        )
    hb8 = beats[8][0]
    ratio = hb8 / beats[4096][0] if 4096 in beats else None
    pipe = pipeline_costs(
        worlds,
        args.events,
        max(1, args.repeat // 2),
        pack_events=args.pack_events,
        batch_records=args.batch_records,
        plain_cap=args.pipeline_events,
    )
    print_pipeline(pipe, args)
    steps, state_bytes, kept = step_rate(args.events // 2, args.repeat)
    long_cfg = with_overrides(CFG, {"history_steps": 4096})
    steps_long, long_bytes, _ = step_rate(args.events // 2, args.repeat, long_cfg)
    pure, numpy_rate = baseline_rates(max(1, args.repeat // 2))
    per_detector = detector_costs(min(args.events // 4, 50_000), max(1, args.repeat // 2))
    if ratio is not None:
        print(f"per-event cost, world 4,096 / world 8: {ratio:.2f}x (goal <= 1.5)")
    print(f"steps (MFU, 2 baselines, ledger): {steps:>12,.0f} /s   (kept {kept})")
    print(
        f"baseline z+update, window 50: sorted tuples {pure:,.0f} /s vs numpy {numpy_rate:,.0f} /s "
        f"({pure / numpy_rate:.0f}x)"
    )
    print(f"step state as a table value: {state_bytes:,} bytes (msgpack)")
    print(
        "per detector, us/event (timer cost subtracted): "
        + ", ".join(f"{name} {us:.2f}" for name, us in per_detector.items())
    )
    print(
        f"steps with history_steps 4096: {steps_long:,.0f} /s, state {long_bytes:,} bytes "
        "(cost per step does not depend on the history; its size does)"
    )
    ok = hb8 >= 200_000 and steps >= 100_000 and (ratio is None or ratio <= 1.5)
    print(
        "targets (>= 200k heartbeats/s, >= 100k steps/s, 4,096/8 <= 1.5): "
        f"{'MET' if ok else 'MISSED'}"
    )
    print(
        json.dumps(
            {
                "bench": "core",
                "python": sys.version.split()[0],
                "heartbeats_per_s_world8": round(hb8),
                "heartbeat_us_per_event": {str(w): round(1e6 / b[0], 3) for w, b in beats.items()},
                "liveness_state_bytes": {str(w): b[2] for w, b in beats.items()},
                "cost_ratio_4096_over_8": None if ratio is None else round(ratio, 3),
                "steps_per_s": round(steps),
                "baseline_updates_per_s": round(pure),
                "numpy_baseline_updates_per_s": round(numpy_rate),
                "step_state_bytes": state_bytes,
                "steps_per_s_history_4096": round(steps_long),
                "step_state_bytes_history_4096": long_bytes,
                "liveness_codec_us": {str(w): round(b[3], 1) for w, b in beats.items()},
                "pipeline_unpacked_us_per_event": {
                    str(w): round(c.unpacked_us, 3) for w, c in pipe.items()
                },
                "pipeline_packed_us_per_event": {
                    str(w): round(c.packed_us, 3) for w, c in pipe.items()
                },
                "pipeline_packed_pack_path_off_us_per_event": {
                    str(w): round(c.packed_off_us, 3) for w, c in pipe.items()
                },
                "changelog_bytes_per_run_per_batch": {
                    str(w): c.changelog_bytes_per_batch for w, c in pipe.items()
                },
                "pack_events": args.pack_events,
                "detector_us_per_event": {k: round(v, 3) for k, v in per_detector.items()},
                "batch_records": args.batch_records,
                "targets_met": ok,
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
