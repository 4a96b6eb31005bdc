"""Detection quality of the core: synthetic runs with injected faults, and real curves.

Each run is a gang of 8 ranks training for a few thousand steps with a noisy but healthy
loss (decaying trend, a slow wave, Gaussian noise whose level drifts) and noisy grad
norms and step times. Faults are injected at random, well separated steps: loss and
grad-norm spikes, NaN loss and grad norm, divergence and collapse, a rank that stops
reporting while its peers go on (elastic), a gang that hangs (every rank silent; the
controller then resumes from the last checkpoint), a straggler, and resumes that dropped
state (the loss jumps or drifts) next to resumes that did not.

Every verdict is matched to the injection whose window it falls in; the first verdict
of the expected kind is the detection (delay in steps, or seconds of log time for a
hang). A verdict outside every window, or of an unexpected kind, is a false positive;
false positives are counted all together and those that page (severity warning or
critical; a lone grad-norm spike is info).

Then the same configuration judges the real-curve corpus (`bench/real_curves.py`, judged
by `bench/real_quality.py`): paging false positives per 10k healthy steps by kind, info
verdicts, recall and delay per real fault, for the tuning and the held-out curves apart.
Then the LLM-pretraining corpus (`bench/llm_corpus.py` builds it locally from public logs;
`bench/llm_quality.py` judges it): pages per 10k healthy steps by kind, commands on healthy
rows, labelled incidents and injected faults, tuning and held-out apart, and the census of
the benign spikes. Without a local LLM corpus that section says so and how to build it.
Prints the tables, then one JSON line.

``--set NAME=VALUE`` (repeatable) replays every section with a detector setting changed,
as ``runwatch replay --set`` takes it.

    .venv/bin/python bench/detection_quality.py [--runs 24] [--steps 3000] [--seed 0]
        [--set loss_z_thresh=8] [--llm-corpus DIR] [--no-llm] [--no-llm-faults]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llm_corpus import DEFAULT_ROOT as LLM_ROOT
from llm_quality import FAULTS as LLM_FAULTS
from llm_quality import RESUME_JUMP, llm_section
from real_quality import CORPUS, evaluate, real_target_met, severity_of, summarize

from runwatch.cmd.processors import parse_overrides
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.replay import Record, replay
from runwatch.schemas.events import (
    AnomalyDetected,
    Event,
    Heartbeat,
    Provenance,
    RunEnded,
    RunStarted,
    StepCompleted,
    Tick,
)

S = 1_000_000_000
WORLD = 8
VOCAB = 50257
STEP_S = 0.5
TICK_S = 10
CHECKPOINT_EVERY = 100
FAULTS = (
    "loss_spike",
    "grad_norm_spike",
    "nonfinite_loss",
    "nonfinite_grad_norm",
    "loss_divergence",
    "loss_collapse",
    "dead_rank",
    "hang",
    "straggler",
    "bad_resume_jump",
    "bad_resume_drift",
    "good_resume",
)
EXPECTED = {
    "loss_spike": "loss_spike",
    "grad_norm_spike": "grad_norm_spike",
    "nonfinite_loss": "nonfinite_loss",
    "nonfinite_grad_norm": "nonfinite_grad_norm",
    "loss_divergence": "loss_divergence",
    "loss_collapse": "loss_collapse",
    "dead_rank": "dead_rank",
    "hang": "hang",
    "straggler": "straggler",
    "bad_resume_jump": "restart_discontinuity",
    "bad_resume_drift": "restart_discontinuity",
    "good_resume": None,
}
CONSEQUENCES = {
    "loss_divergence": {"loss_spike"},
    "loss_collapse": {"loss_spike"},
    "hang": {"dead_rank"},
    "bad_resume_jump": {"loss_spike"},
    "bad_resume_drift": {"loss_spike"},
}
"""Other verdicts an injection legitimately causes (not counted as false positives)."""
WINDOW_STEPS = {"dead_rank": 200, "straggler": 80, "loss_collapse": 60}


@dataclass
class Injection:
    fault: str
    run_id: str
    step: int
    ts_ns: int = 0
    end_ts_ns: int = 0
    detected_step: int | None = None
    detected_ts_ns: int | None = None
    verdicts: list[AnomalyDetected] = field(default_factory=list)


@dataclass
class Sim:
    """One run being simulated: emits steps, heartbeats and ticks into its partition."""

    run_id: str
    partition: int
    rng: random.Random
    records: list[Record]
    offsets: dict[str, int] = field(default_factory=dict)
    t_ns: int = 0
    next_tick_ns: int = 0
    incarnation: int = 0
    phase: float = 0.0
    noise_key: str = ""

    def emit(self, role: str, event: Event) -> None:
        offset = self.offsets.get(role, 0)
        self.offsets[role] = offset + 1
        source = Provenance(topic=f"bench.{role}", partition=self.partition, offset=offset)
        self.records.append((role, source, event))  # type: ignore[arg-type]

    def advance(self, seconds: float) -> None:
        self.t_ns += int(seconds * S)
        while self.next_tick_ns <= self.t_ns:
            self.emit(
                "heartbeats", Tick(run_id="*", ts_ns=self.next_tick_ns, partition=self.partition)
            )
            self.next_tick_ns += TICK_S * S

    def start(self) -> None:
        ev = RunStarted(
            run_id=self.run_id,
            ts_ns=self.t_ns,
            world_size=WORLD,
            vocab_size=VOCAB,
            incarnation=self.incarnation,
        )
        self.emit("steps", ev)
        self.emit("heartbeats", ev)

    def end(self) -> None:
        ev = RunEnded(run_id=self.run_id, ts_ns=self.t_ns, status="stopped")
        self.emit("steps", ev)
        self.emit("heartbeats", ev)

    def healthy_loss(self, step: int) -> float:
        """The run's true loss curve at a step (deterministic per step: a resume redoes it)."""
        r = random.Random(zlib.crc32(f"{self.noise_key}:{step}:loss".encode()))
        sigma = 0.015 + 0.01 * math.sin(step / 700.0) ** 2
        return (
            2.4
            + 1.5 * math.exp(-step / 800.0)
            + 0.03 * math.sin(step / 90.0 + self.phase)
            + r.gauss(0.0, sigma)
        )

    def healthy_grad(self, step: int) -> float:
        r = random.Random(zlib.crc32(f"{self.noise_key}:{step}:grad".encode()))
        return (0.8 + 0.2 * math.exp(-step / 500.0)) * math.exp(r.gauss(0.0, 0.08))


def simulate_run(
    index: int, steps: int, rng: random.Random, records: list[Record]
) -> list[Injection]:
    sim = Sim(
        f"run-{index:03d}",
        index,
        rng,
        records,
        phase=rng.random() * 6.28,
        noise_key=f"{index}:{rng.getrandbits(32)}",
    )
    faults = list(FAULTS)
    rng.shuffle(faults)
    gap = steps // (len(faults) + 1)
    plan = {gap * (k + 1) + rng.randint(-gap // 4, gap // 4): f for k, f in enumerate(faults)}
    injections: list[Injection] = []
    sim.start()
    step = 0
    last_checkpoint = 0
    silent: dict[int, int] = {}  # rank -> first step it reports again
    slow: dict[int, int] = {}  # rank -> last slow step
    loss_offset: dict[int, float] = {}  # step -> added loss (episodes)
    grad_factor: dict[int, float] = {}
    restart_from: int | None = None
    while step < steps:
        step += 1
        fault = plan.pop(step, None)
        if fault is not None:
            inj = Injection(fault, sim.run_id, step, sim.t_ns)
            injections.append(inj)
            if fault == "loss_spike":
                loss_offset[step] = rng.uniform(0.3, 0.8)
            elif fault == "grad_norm_spike":
                grad_factor[step] = rng.uniform(5.0, 20.0)
            elif fault == "nonfinite_loss":
                loss_offset[step] = math.nan
            elif fault == "nonfinite_grad_norm":
                grad_factor[step] = math.inf
            elif fault == "loss_divergence":
                for k in range(3):
                    loss_offset[step + k] = 25.0
            elif fault == "loss_collapse":
                for k in range(40):
                    loss_offset[step + k] = (
                        math.log(VOCAB) - sim.healthy_loss(step + k) + rng.gauss(0, 0.02)
                    )
            elif fault == "dead_rank":
                silent[rng.randrange(WORLD)] = step + 120
            elif fault == "straggler":
                slow[rng.randrange(WORLD)] = step + 40
            elif fault == "hang":
                sim.advance(700.0)  # every rank silent; ticks go on
                sim.end()
                sim.advance(30.0)
                inj.end_ts_ns = sim.t_ns  # the controller resumes the gang here
            if fault in {"hang", "bad_resume_jump", "bad_resume_drift", "good_resume"}:
                if fault != "hang":
                    sim.end()
                    sim.advance(30.0)
                sim.incarnation += 1
                sim.start()
                inj.step = last_checkpoint + 1
                restart_from, step = last_checkpoint, last_checkpoint + 1
                if fault == "bad_resume_jump":
                    for k in range(60):
                        loss_offset[step + k] = 0.4 * math.exp(-k / 30.0)
                elif fault == "bad_resume_drift":
                    for k in range(60):
                        loss_offset[step + k] = (
                            0.15 * (1.0 - math.exp(-k / 4.0)) * math.exp(-k / 40.0)
                        )
        dt = STEP_S * (1.0 + rng.gauss(0.0, 0.02))
        sim.advance(dt)
        loss = sim.healthy_loss(step) + loss_offset.get(step, 0.0)
        grad = sim.healthy_grad(step) * grad_factor.get(step, 1.0)
        sim.emit(
            "steps",
            StepCompleted(
                run_id=sim.run_id,
                ts_ns=sim.t_ns,
                step=step,
                loss=loss,
                grad_norm=grad,
                step_time_s=dt,
                tokens=WORLD * 8 * 1024,
                restart_from_step=restart_from,
            ),
        )
        restart_from = None
        for rank in range(WORLD):
            if silent.get(rank, 0) > step:
                continue
            factor = 2.0 if slow.get(rank, 0) > step else 1.0
            sim.emit(
                "heartbeats",
                Heartbeat(
                    run_id=sim.run_id,
                    ts_ns=sim.t_ns + rank * 1000,
                    rank=rank,
                    step=step,
                    step_time_s=dt * factor * (1.0 + rng.gauss(0.0, 0.03)),
                ),
            )
        if step % CHECKPOINT_EVERY == 0:
            last_checkpoint = step
    return injections


def window_end(inj: Injection) -> tuple[int, int]:
    """(last step, last ts) of an injection's window."""
    if inj.fault == "hang":
        return inj.step, inj.end_ts_ns
    return inj.step + WINDOW_STEPS.get(inj.fault, 25), 0


def match(injections: list[Injection], anomalies: list[AnomalyDetected]) -> list[AnomalyDetected]:
    """Attach verdicts to injections; return the unmatched ones (false positives)."""
    by_run: dict[str, list[Injection]] = {}
    for inj in injections:
        by_run.setdefault(inj.run_id, []).append(inj)
    unmatched = []
    for a in anomalies:
        owner = None
        for inj in by_run.get(a.run_id, []):
            expected = EXPECTED[inj.fault]
            allowed = ({expected} if expected else set()) | CONSEQUENCES.get(inj.fault, set())
            last_step, last_ts = window_end(inj)
            in_window = inj.step <= a.step <= last_step or (
                inj.fault == "hang" and inj.ts_ns <= a.ts_ns <= last_ts
            )
            if in_window and a.kind in allowed:
                owner = inj
                break
        if owner is None:
            unmatched.append(a)
            continue
        owner.verdicts.append(a)
        if a.kind == EXPECTED[owner.fault] and owner.detected_step is None:
            # a spike episode is about its first step but known when decided
            decided = a.step if a.decided_step is None else a.decided_step
            owner.detected_step, owner.detected_ts_ns = decided, a.ts_ns
    return unmatched


def _fmt(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.0f} {unit}"


def print_real(real: dict[str, Any]) -> None:
    """The real-curve table: tuning and held-out side by side."""
    tun, held = real["tuning"], real["heldout"]
    print(
        f"real curves: tuning {tun['curves']} curves / {tun['healthy_steps']} healthy steps, "
        f"held-out {held['curves']} / {held['healthy_steps']}"
    )
    print(f"{'':<24}{'tuning':>26}{'held-out':>26}")
    print(
        f"{'paging FP per 10k':<24}{tun['false_positives_per_10k_healthy_steps']:>26.2f}"
        f"{held['false_positives_per_10k_healthy_steps']:>26.2f}"
    )
    kinds = sorted(set(tun["fp_per_10k_by_kind"]) | set(held["fp_per_10k_by_kind"]))
    for kind in kinds:
        a, b = tun["fp_per_10k_by_kind"].get(kind, 0.0), held["fp_per_10k_by_kind"].get(kind, 0.0)
        print(f"{'  ' + kind:<24}{a:>26.2f}{b:>26.2f}")
    kinds = sorted(set(tun["info_per_10k_by_kind"]) | set(held["info_per_10k_by_kind"]))
    for kind in kinds:
        a = tun["info_per_10k_by_kind"].get(kind, 0.0)
        b = held["info_per_10k_by_kind"].get(kind, 0.0)
        print(f"{'info ' + kind + ' /10k':<24}{a:>26.2f}{b:>26.2f}")

    def cell(f: dict[str, Any]) -> str:
        if not f["injected"]:
            return "-"
        med = "-" if f["delay_median"] is None else f"{f['delay_median']:g}"
        mx = "-" if f["delay_max"] is None else f"{f['delay_max']:.0f}"
        return f"{f['found']}/{f['injected']} delay {med} (max {mx})"

    for fault in tun["faults"]:
        print(f"{fault:<24}{cell(tun['faults'][fault]):>26}{cell(held['faults'][fault]):>26}")
        for split in (tun, held):
            for name, effect in split["faults"][fault]["immaterial"].items():
                print(f"  {name}: no material effect (loss {effect:+.1%}), not counted")


def parse_args() -> argparse.Namespace:
    """The bench's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="real-curve corpus")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="detector setting for every section, as `runwatch replay --set` (repeatable)",
    )
    parser.add_argument("--llm-corpus", type=Path, default=LLM_ROOT, help="local LLM corpus")
    parser.add_argument("--no-llm", action="store_true", help="skip the LLM corpus")
    parser.add_argument(
        "--no-llm-faults", action="store_true", help="LLM corpus without injected faults"
    )
    parser.add_argument(
        "--resume-jump",
        type=float,
        default=RESUME_JUMP,
        help="modelled loss jump of an injected LLM resume without optimizer state",
    )
    return parser.parse_args()


def fault_table(injections: list[Injection]) -> dict[str, dict[str, float | int | str | None]]:
    """Print recall and delay per injected synthetic fault; the same as figures."""
    print(f"{'fault':<22}{'injected':>9}{'found':>7}{'recall':>8}{'median delay':>14}{'max':>11}")
    summary: dict[str, dict[str, float | int | str | None]] = {}
    for fault in FAULTS:
        group = [i for i in injections if i.fault == fault]
        if EXPECTED[fault] is None:
            flagged = sum(
                1 for i in group if any(v.kind == "restart_discontinuity" for v in i.verdicts)
            )
            print(f"{fault:<22}{len(group):>9}{'-':>7}{'-':>8}   false alarms: {flagged}")
            summary[fault] = {"injected": len(group), "false_alarms": flagged}
            continue
        found = [i for i in group if i.detected_step is not None]
        if fault == "hang":
            delays = [((i.detected_ts_ns or 0) - i.ts_ns) / S for i in found]
            unit = "s"
        else:
            delays = [float((i.detected_step or 0) - i.step) for i in found]
            unit = "steps"
        med = statistics.median(delays) if delays else None
        mx = max(delays) if delays else None
        recall = len(found) / len(group) if group else 0.0
        print(
            f"{fault:<22}{len(group):>9}{len(found):>7}{recall:>8.0%}"
            f"{_fmt(med, unit):>14}{_fmt(mx, unit):>11}"
        )
        summary[fault] = {
            "injected": len(group),
            "found": len(found),
            "recall": recall,
            "delay_median": med,
            "delay_max": mx,
            "delay_unit": unit,
        }
    return summary


def synthetic_section(args: argparse.Namespace, cfg: DetectorConfig) -> dict[str, Any]:
    """Simulate, replay and judge the synthetic runs; print them; the JSON figures."""
    rng = random.Random(args.seed)
    records: list[Record] = []
    injections: list[Injection] = []
    for i in range(args.runs):
        injections += simulate_run(i, args.steps, rng, records)
    result = replay(records, cfg)
    false_positives = match(injections, result.anomalies)
    observed = sum(s.steps_observed for s in result.steps.values())
    faulty_steps = sum(
        window_end(i)[0] - i.step + 1 for i in injections if i.fault != "good_resume"
    )
    healthy = max(1, observed - faulty_steps)
    print(
        f"{args.runs} runs x ~{args.steps} steps, world {WORLD}: {observed} steps observed, "
        f"{healthy} healthy, {len(result.anomalies)} verdicts, config {result.config_hash}"
    )
    summary = fault_table(injections)
    fp_rate = len(false_positives) * 10_000 / healthy
    paging = [a for a in false_positives if severity_of(a) != "info"]
    paging_rate = len(paging) * 10_000 / healthy
    print(
        f"false positives: {len(false_positives)} ({fp_rate:.2f} per 10k healthy steps), "
        f"paging: {len(paging)} ({paging_rate:.2f} per 10k)"
    )
    for a in false_positives[:10]:
        print(f"  {a.run_id} {a.kind} ({severity_of(a)}) step {a.step} rank {a.rank}: {a.detail}")
    all_found = all(s.get("recall", 1.0) == 1.0 for s in summary.values())
    good_ok = summary["good_resume"]["false_alarms"] == 0
    synthetic_met = all_found and good_ok and fp_rate <= 1.0
    print(
        f"synthetic target (every fault found, <= 1 FP per 10k healthy steps): "
        f"{'MET' if synthetic_met else 'MISSED'}"
    )
    return {
        "runs": args.runs,
        "steps_observed": observed,
        "healthy_steps": healthy,
        "false_positives": len(false_positives),
        "false_positives_per_10k_healthy_steps": round(fp_rate, 3),
        "paging_false_positives_per_10k_healthy_steps": round(paging_rate, 3),
        "kinds": summary,
        "config_hash": result.config_hash,
        "synthetic_target_met": synthetic_met,
    }


def main() -> None:
    args = parse_args()
    cfg = with_overrides(DetectorConfig(), parse_overrides(args.overrides))
    synthetic = synthetic_section(args, cfg)
    real = summarize(evaluate(cfg, args.corpus))
    print_real(real)
    real_met = real_target_met(real)
    print(
        f"real target (every material real fault found, <= 1 paging FP per 10k healthy "
        f"steps, tuning and held-out): {'MET' if real_met else 'MISSED'}"
    )
    llm: dict[str, Any] = {"skipped": True}
    if not args.no_llm:
        llm = llm_section(
            cfg,
            args.llm_corpus,
            faults=() if args.no_llm_faults else tuple(LLM_FAULTS),
            resume_jump=args.resume_jump,
        )
    print(
        json.dumps(
            {
                "bench": "detection_quality",
                **synthetic,
                "real": real,
                "real_target_met": real_met,
                "llm": llm,
                "overrides": parse_overrides(args.overrides),
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
