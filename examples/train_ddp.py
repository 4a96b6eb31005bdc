"""Train `TinyLM` with DDP, checkpoint asynchronously, and report to runwatch.

Launch one process per rank with torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), e.g. by ``torchrun`` or ``runwatch launch``;
without it the script runs as a gang of one. Steps are numbered from 1; the checkpoint of
step S holds the state after step S, and a resume from it continues with step S + 1.

Resuming: ``--resume`` takes the latest complete checkpoint in ``--checkpoint-dir`` (none: a
fresh start); ``--resume-from`` (or ``RUNWATCH_RESTART_FROM``, as set by the controller) is a
checkpoint directory, or a step number meaning "the latest complete checkpoint at or before
that step" (none: a fresh start). Checkpoints newer than the step resumed from belong to the
abandoned history: they are moved aside, never deleted, into
``<checkpoint-dir>/rolled_back/inc<incarnation>-<utc time>/`` (``runwatch checkpoints prune``
deletes them). Without either flag, a checkpoint directory that already holds checkpoints is
an error unless ``--fresh`` says to start over. Faults to
inject are described in `examples.faults`.

Rank 0 prints ``step 12 loss 3.1234 dt 0.041s`` per step, emits RunStarted, StepCompleted,
CheckpointCommitted and RunEnded; every rank emits a Heartbeat per step.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
from torch.nn import functional as F  # noqa: N812

from examples.data import VOCAB_SIZE, WindowDataset, generate_corpus
from examples.faults import GARBAGE_TOKEN, FaultPlan, parse_faults
from examples.instrument import Emitter, make_emitter
from examples.tinylm import TinyLM, TinyLMConfig
from runwatch.common.checkpoint_layout import (
    CheckpointMoveError,
    checkpoint_step,
    is_complete_checkpoint,
    latest_complete_checkpoint,
    set_aside_after,
)
from runwatch.common.launch_env import LaunchEnv
from runwatch.producers.backend import DistributedTrainingBackend, get_training_backend
from runwatch.producers.checkpoint import AsyncCheckpointer, CheckpointResult, load_checkpoint
from runwatch.producers.rank_done import mark_training_done
from runwatch.producers.torch_helpers import StepTimer, flop_config_from_causal_lm, grad_norm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    launch = LaunchEnv.from_environ()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="train until this step")
    p.add_argument("--seed", type=int, default=0, help="model init and data order")
    p.add_argument(
        "--backend", default="torch-ddp", help="training backend (producers.backend registry)"
    )
    p.add_argument("--global-batch", type=int, default=16, help="sequences per step, whole gang")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--clip", type=float, default=1.0, help="grad-norm clip; 0 disables")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=launch.checkpoint_dir,
        help="checkpoint root (default: RUNWATCH_CHECKPOINT_DIR, as set by "
        "`runwatch launch --checkpoint-dir`)",
    )
    p.add_argument("--checkpoint-every", type=int, default=0, help="0: only at the end")
    p.add_argument("--keep-checkpoints", type=int, default=None, metavar="N")
    p.add_argument("--resume", action="store_true", help="resume from the latest checkpoint")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start from scratch even if --checkpoint-dir holds checkpoints (they are moved "
        "aside into rolled_back/, not deleted)",
    )
    p.add_argument(
        "--resume-from",
        default=None if launch.restart_from is None else str(launch.restart_from),
        metavar="PATH|STEP",
    )
    p.add_argument(
        "--drop-optimizer-state",
        action="store_true",
        help="on resume, load the model but not the optimizer (a provoked failure)",
    )
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="fault to inject, e.g. nan@12, spike@20, kill@15:rank=1, hang@15:rank=1",
    )
    p.add_argument(
        "--skip-nonfinite",
        action="store_true",
        help="skip the optimizer update when the grad norm is NaN/Inf",
    )
    p.add_argument("--stop-at", type=int, default=None, help="checkpoint and stop after it")
    p.add_argument("--step-delay-s", type=float, default=0.0, help="sleep per step (demos)")
    p.add_argument("--no-emit", action="store_true", help="do not emit even if Kafka is set")
    p.add_argument("--run-id", default=launch.run_id or "tinylm")
    p.add_argument(
        "--peak-flops-per-rank",
        type=float,
        default=5e10,
        help="nominal peak FLOP/s of one rank (RunStarted sums over the gang)",
    )
    p.add_argument("--tag", action="append", default=[], metavar="K=V")
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--trace-dir", type=Path, help="write events, samples and metrics here")
    p.add_argument("--pg-timeout-s", type=float, default=120.0)
    p.add_argument(
        "--hold-after-step",
        type=int,
        metavar="K",
        help="test gate: after step K of the first incarnation, every rank waits while "
        "--hold-file exists (a resumed incarnation never holds)",
    )
    p.add_argument("--hold-file", type=Path, metavar="PATH", help="see --hold-after-step")
    args = p.parse_args(argv)
    if (args.hold_after_step is None) != (args.hold_file is None):
        p.error("--hold-after-step and --hold-file go together")
    args.inject = [*args.inject, os.environ.get("RUNWATCH_INJECT", "")]
    return args


class StopFlag:
    """Set by SIGTERM / SIGINT; the gang agrees on it through the per-step all-reduce."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._set)

    def _set(self, signum: int, frame: Any) -> None:
        self.requested = True


def resolve_resume(args: argparse.Namespace) -> Path | None:
    """The checkpoint to resume from (decided on rank 0), or None for a fresh start."""
    root = args.checkpoint_dir
    spec = args.resume_from
    if spec and spec.isdigit():
        if root is None:
            raise SystemExit("--resume-from STEP needs --checkpoint-dir")
        found = latest_complete_checkpoint(root, at_or_before=int(spec))
        return found[1] if found else None
    if spec:
        if not is_complete_checkpoint(spec):
            raise SystemExit(f"{spec} is not a complete checkpoint")
        return Path(spec)
    found = latest_complete_checkpoint(root) if root is not None else None
    if args.resume or found is None:
        return found[1] if found else None
    if args.fresh:
        return None
    raise SystemExit(
        f"{root} holds checkpoints up to step {found[0]}: pass --resume to "
        f"continue from them or --fresh to move them aside and start over"
    )


PEER_FAILURE_MARKERS = (
    "gloo",
    "nccl",
    "connection reset",
    "connection closed",
    "broken pipe",
    "processgroup",
    "timed out",
    "timeout",
)


def is_peer_failure(exc: BaseException) -> bool:
    """True if ``exc`` is a collective failing because a peer died or hung, not a local bug."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(m in text for m in PEER_FAILURE_MARKERS)


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class Trace:
    """Per-rank files under ``--trace-dir``: sample ids per step, and rank 0's metrics.json."""

    def __init__(self, root: Path | None, rank: int, **header: Any) -> None:
        self.root, self.rank = root, rank
        self.metrics: dict[str, Any] = {
            **header,
            "losses": {},
            "grad_norms": {},
            "step_time_s": {},
            "checkpoints": [],
        }
        self._samples = (root / f"samples.rank{rank}.jsonl").open("a") if root else None

    def step(self, step: int, ids: list[int], loss: float, gnorm: float, dt: float) -> None:
        if self._samples:
            self._samples.write(json.dumps({"step": step, "ids": ids}) + "\n")
            self._samples.flush()
        self.metrics["losses"][step] = loss
        self.metrics["grad_norms"][step] = gnorm
        self.metrics["step_time_s"][step] = dt

    def checkpoints(self, results: list[CheckpointResult]) -> None:
        self.metrics["checkpoints"] += [vars(r) | {"loader_states": None} for r in results]

    def close(self, **footer: Any) -> None:
        if self._samples:
            self._samples.close()
        if self.root:  # which clients this rank ran (`runwatch launch --relay`: no Kafka)
            loaded = {"kafka_loaded": "kafka" in sys.modules}
            (self.root / f"process.rank{self.rank}.json").write_text(json.dumps(loaded))
        if self.root and self.rank == 0:
            self.metrics.update(footer)
            (self.root / "metrics.json").write_text(json.dumps(self.metrics, indent=1))


class Trainer:
    """One rank of the gang: model, data, optimizer, checkpoints, emitter, and the loop."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        env = LaunchEnv.from_environ()
        self.rank, self.ws = env.rank, env.world_size
        self.incarnation = env.incarnation
        self.faults = FaultPlan(parse_faults(args.inject), self.rank, self.incarnation)
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        self.backend = get_training_backend(args.backend)
        self.backend.init(env, timeout_s=args.pg_timeout_s)
        self.stop = StopFlag()
        cfg = TinyLMConfig(
            vocab_size=VOCAB_SIZE,
            seq_len=args.seq_len,
            d_model=args.d_model,
            n_layer=args.n_layer,
            n_head=args.n_head,
            dropout=args.dropout,
        )
        self.data = WindowDataset(generate_corpus(), args.seq_len, args.seed)
        torch.manual_seed(args.seed)
        self.model = TinyLM(cfg)
        self.flop_config = flop_config_from_causal_lm(self.model, args.seq_len)
        self.ddp = self.backend.wrap_model(self.model)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0
        )
        self.ckpt = (
            AsyncCheckpointer(args.checkpoint_dir, keep=args.keep_checkpoints)
            if args.checkpoint_dir
            else None
        )
        self.step, self.global_sample, self.restart_from = 0, 0, None
        self._resume()
        self.emitter = make_emitter(
            enabled=env.bootstrap is not None and not args.no_emit,
            run_id=args.run_id,
            rank=self.rank,
            world_size=self.ws,
            trace_path=args.trace_dir / f"events.rank{self.rank}.jsonl" if args.trace_dir else None,
        )
        self.trace = Trace(
            args.trace_dir,
            self.rank,
            world_size=self.ws,
            incarnation=self.incarnation,
            resumed_from=self.restart_from,
        )

    def _resume(self) -> None:
        args, rank = self.args, self.rank
        decision: Path | SystemExit | None = None
        if rank == 0:
            try:
                decision = resolve_resume(args)
                self._set_aside_future(decision)
            except SystemExit as exc:
                decision = exc
        path = broadcast(decision)
        if isinstance(path, SystemExit):
            raise path
        if path is not None:
            drop_optimizer = args.drop_optimizer_state or self.faults.active("dropopt")
            restored = load_checkpoint(
                path,
                self.ddp,
                None if drop_optimizer else self.optimizer,
                process_group=self.ckpt.process_group if self.ckpt else None,
            )
            if restored.loader.seed != args.seed:
                raise SystemExit(
                    f"checkpoint data seed {restored.loader.seed} != --seed {args.seed}"
                )
            self.step = self.restart_from = restored.step
            self.global_sample = restored.loader.global_sample
            if not restored.rng_restored:  # a rank the saving gang did not have
                torch.manual_seed(args.seed * 1_000_003 + self.step * 101 + rank)
            if rank == 0:
                print(
                    f"resumed from {path} at step {self.step} (saved by "
                    f"{restored.saved_world_size} ranks, now {self.ws}; optimizer "
                    f"{'restored' if restored.optimizer_restored else 'DROPPED'})",
                    flush=True,
                )

    def _set_aside_future(self, resume_from: Path | None) -> None:
        """Rank 0, before the gang loads: move what lies past the resume point aside.

        Nothing is deleted; a failed move ends the run (every rank) with the reason.
        """
        root = self.args.checkpoint_dir
        if root is None:
            return
        step = 0 if resume_from is None else checkpoint_step(resume_from) or 0
        label = f"inc{self.incarnation}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        try:
            moved = set_aside_after(root, step, label=label)
        except CheckpointMoveError as exc:
            raise SystemExit(str(exc)) from exc
        for path in moved:
            print(f"moved {path.name} aside to {path.parent} (past step {step})", flush=True)

    def _announce(self) -> None:
        args = self.args
        self.emitter.run_started(
            flop_config=self.flop_config,
            plan=self.backend.plan(),
            peak_flops_per_s=args.peak_flops_per_rank * self.ws,
            dtype="fp32",
            vocab_size=VOCAB_SIZE,
            tags={
                "model": "tinylm",
                "backend": self.backend.capabilities.name,
                **dict(t.split("=", 1) for t in args.tag),
            },
            thresholds={k: float(v) for k, v in (t.split("=", 1) for t in args.threshold)},
            backend=self.backend.capabilities.declaration(),
        )

    def _train_step(self, step: int) -> tuple[list[int], float, float, bool, float, bool]:
        """Forward, backward, update, gang all-reduce: ``(ids, loss, gnorm, skipped, lr, stop)``."""
        args, device = self.args, self.backend.device
        ids, x, y = self.data.rank_batch(self.global_sample, args.global_batch, self.ws, self.rank)
        if self.faults.has("spike", step):
            y = torch.full_like(y, GARBAGE_TOKEN)
        lr = args.lr * min(1.0, step / max(1, args.warmup_steps))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = F.cross_entropy(self.ddp(x.to(device)).flatten(0, 1), y.to(device).flatten())
        if self.faults.has("nan", step):
            loss = loss * float("nan")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = grad_norm(self.model.parameters(), args.clip or None)
        skipped = args.skip_nonfinite and not math.isfinite(gnorm)
        if not skipped:
            self.optimizer.step()
        stop = self.stop.requested or step == args.stop_at or step == args.steps
        # One all-reduce gives the gang's loss and agreement on stopping.
        stats = torch.tensor([loss.item(), float(stop)], dtype=torch.float64, device=device)
        dist.all_reduce(stats)
        self.global_sample += args.global_batch
        return ids, stats[0].item() / self.ws, gnorm, skipped, lr, bool(stats[1].item() > 0)

    def _save(self, step: int) -> None:
        assert self.ckpt is not None
        gang = tuple(
            self.data.loader_state(
                global_sample=self.global_sample, step=step, world_size=self.ws, rank=r
            )
            for r in range(self.ws)
        )
        self.ckpt.save(
            step,
            self.ddp,
            self.optimizer,
            loader_state=gang[self.rank],
            gang_loader_states=gang,
            world_size=self.ws,
        )

    def _report_checkpoints(self, results: list[CheckpointResult]) -> None:
        report_checkpoints(results, self.emitter, self.rank)
        self.trace.checkpoints(results)

    def _hold(self, step: int) -> None:
        """Wait at the test gate after ``--hold-after-step`` (the first incarnation only).

        Every rank waits while ``--hold-file`` exists or until a stop is requested: alive,
        reporting nothing (a test raises the run's liveness thresholds for that).
        """
        args = self.args
        if step != args.hold_after_step or self.incarnation != 0:
            return
        while args.hold_file.exists() and not self.stop.requested:
            time.sleep(0.05)  # polling a file the test removes

    def run(self) -> str:
        """Train until ``--steps`` (or a stop); returns the RunEnded status."""
        args, rank, ws = self.args, self.rank, self.ws
        per_rank = args.global_batch // ws
        timer = StepTimer(self.backend.device)
        done, status, reason, peer_failed = self.step, "completed", "", False
        if rank == 0:
            self._announce()
        try:
            for step in range(self.step + 1, args.steps + 1):
                self.faults.before_step(step)
                timer.start()
                ids, loss, gnorm, skipped, lr, stop = self._train_step(step)
                if self.ckpt and (
                    stop or (args.checkpoint_every and step % args.checkpoint_every == 0)
                ):
                    self._save(step)
                dt = timer.stop()
                self.emitter.heartbeat(step, step_time_s=dt)
                self.trace.step(step, ids, loss, gnorm, dt)
                if rank == 0:
                    self.emitter.step(
                        step,
                        loss=loss,
                        step_time_s=dt,
                        grad_norm=gnorm,
                        tokens=args.global_batch * args.seq_len,
                        examples=args.global_batch,
                        local_tokens=per_rank * args.seq_len,
                        local_examples=per_rank,
                        lr=lr,
                        skipped=skipped,
                        restart_from_step=self.restart_from,
                        data_parallel_size=ws,
                    )
                    print(f"step {step} loss {loss:.4f} dt {dt:.3f}s", flush=True)
                self.restart_from, done = None, step
                if self.ckpt:
                    self._report_checkpoints(self.ckpt.poll())
                self._hold(step)
                if args.step_delay_s:
                    time.sleep(args.step_delay_s)
                if stop:
                    status = "completed" if step == args.steps else "stopped"
                    break
            if self.ckpt:
                self._report_checkpoints(self.ckpt.close(timeout_s=300.0))
        except Exception as exc:
            status, reason = "failed", f"{type(exc).__name__}: {exc}".splitlines()[0]
            # A peer died or hung: this rank failed, the run did not end. Announcing
            # RunEnded would suspend the processors' liveness checks, and the dead_rank
            # verdict that makes the controller respawn the gang would never come.
            peer_failed = is_peer_failure(exc)
            print(
                f"rank {rank} failed after step {done}"
                f"{' (a peer failed; no RunEnded)' if peer_failed else ''}:",
                file=sys.stderr,
                flush=True,
            )
            traceback.print_exc()
            if self.ckpt:  # a write in flight may still commit; the gang's collectives decide
                self._report_checkpoints(self.ckpt.wait(timeout_s=5.0))
        finally:
            if rank == 0 and not peer_failed:
                self.emitter.run_ended(status, final_step=done if done > 0 else None, reason=reason)
            self.emitter.close(timeout_s=10.0)
            self.trace.close(status=status, final_step=done)
        return status


def report_checkpoints(results: list[CheckpointResult], emitter: Emitter, rank: int) -> None:
    for r in results:
        if r.status == "committed":
            emitter.checkpoint_committed(
                r.step,
                r.path,
                loader_states=r.loader_states,
                size_bytes=r.size_bytes,
                write_s=r.write_s,
                blocked_s=r.blocked_s,
            )
            print(
                f"checkpoint step {r.step} committed {r.path} size {r.size_bytes}B "
                f"blocked {r.blocked_s:.4f}s write {r.write_s:.4f}s",
                flush=True,
            )
        elif r.status == "failed":
            emitter.checkpoint_failed(r.step, r.path, r.error)
            print(f"checkpoint step {r.step} FAILED on rank {rank}: {r.error}", flush=True)


def train(args: argparse.Namespace) -> tuple[DistributedTrainingBackend, str]:
    """Run a trainer to its end; returns its backend and the RunEnded status.

    The trainer (its DDP model, optimizer and checkpointer, which hold the process groups)
    is freed when this returns, so that `main`'s shutdown frees the groups and joins their
    threads while the interpreter is whole, not during its teardown at exit.
    """
    trainer = Trainer(args)
    return trainer.backend, trainer.run()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backend, status = train(args)
    if status == "failed":
        os._exit(1)  # peers may be dead: skip process-group teardown, which can block
    mark_training_done()  # to the agent: a crash in the teardown below is not a failure
    gc.collect()  # a reference cycle through the model would keep its group alive
    backend.shutdown()
    launch = LaunchEnv.from_environ()
    FaultPlan(parse_faults(args.inject), launch.rank, launch.incarnation).at_exit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
