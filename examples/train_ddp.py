"""Train `TinyLM` with DDP, checkpoint asynchronously, and report to runwatch.

Launch one process per rank with torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), e.g. by ``torchrun`` or ``runwatch launch``;
without it the script runs as a gang of one. Steps are numbered from 1; the checkpoint of
step S holds the state after step S, and a resume from it continues with step S + 1.

Resuming: ``--resume`` takes the latest complete checkpoint in ``--checkpoint-dir`` (none: a
fresh start); ``--resume-from`` (or ``RUNWATCH_RESTART_FROM``, as set by the controller) is a
checkpoint directory, or a step number meaning "the latest complete checkpoint at or before
that step". Checkpoints newer than the step resumed from are deleted: they belong to the
abandoned history. Faults to inject are described in `examples.faults`.

Rank 0 prints ``step 12 loss 3.1234 dt 0.041s`` per step, emits RunStarted, StepCompleted,
CheckpointCommitted and RunEnded; every rank emits a Heartbeat per step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
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
from producers.backend import LaunchEnv, TorchDDPBackend
from producers.checkpoint import AsyncCheckpointer, CheckpointResult, load_checkpoint
from producers.checkpoint_layout import (
    discard_checkpoints_after,
    is_complete_checkpoint,
    latest_complete_checkpoint,
    remove_staging_dirs,
)
from producers.torch_helpers import StepTimer, flop_config_from_causal_lm, grad_norm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="train until this step")
    p.add_argument("--seed", type=int, default=0, help="model init and data order")
    p.add_argument("--global-batch", type=int, default=16, help="sequences per step, whole gang")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--clip", type=float, default=1.0, help="grad-norm clip; 0 disables")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--checkpoint-dir", type=Path)
    p.add_argument("--checkpoint-every", type=int, default=0, help="0: only at the end")
    p.add_argument("--keep-checkpoints", type=int, default=None, metavar="N")
    p.add_argument("--resume", action="store_true", help="resume from the latest checkpoint")
    p.add_argument("--resume-from", default=os.environ.get("RUNWATCH_RESTART_FROM") or None,
                   metavar="PATH|STEP")
    p.add_argument("--drop-optimizer-state", action="store_true",
                   help="on resume, load the model but not the optimizer (a provoked failure)")
    p.add_argument("--inject", action="append", default=[], metavar="SPEC",
                   help="fault to inject, e.g. nan@12, spike@20, kill@15:rank=1, hang@15:rank=1")
    p.add_argument("--skip-nonfinite", action="store_true",
                   help="skip the optimizer update when the grad norm is NaN/Inf")
    p.add_argument("--stop-at", type=int, default=None, help="checkpoint and stop after it")
    p.add_argument("--step-delay-s", type=float, default=0.0, help="sleep per step (demos)")
    p.add_argument("--no-emit", action="store_true", help="do not emit even if Kafka is set")
    p.add_argument("--run-id", default=os.environ.get("RUNWATCH_RUN_ID") or "tinylm")
    p.add_argument("--peak-flops-per-rank", type=float, default=5e10,
                   help="nominal peak FLOP/s of one rank (RunStarted sums over the gang)")
    p.add_argument("--tag", action="append", default=[], metavar="K=V")
    p.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--trace-dir", type=Path, help="write events, samples and metrics here")
    p.add_argument("--pg-timeout-s", type=float, default=120.0)
    args = p.parse_args(argv)
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
    if args.resume and root is not None:
        found = latest_complete_checkpoint(root)
        return found[1] if found else None
    return None


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def report_checkpoints(results: list[CheckpointResult], emitter: Emitter, rank: int) -> None:
    for r in results:
        if r.status == "committed":
            emitter.checkpoint_committed(r.step, r.path, loader_states=r.loader_states,
                                         size_bytes=r.size_bytes, write_s=r.write_s,
                                         blocked_s=r.blocked_s)
            print(f"checkpoint step {r.step} committed {r.path} size {r.size_bytes}B "
                  f"blocked {r.blocked_s:.4f}s write {r.write_s:.4f}s", flush=True)
        elif r.status == "failed":
            emitter.checkpoint_failed(r.step, r.path, r.error)
            print(f"checkpoint step {r.step} FAILED on rank {rank}: {r.error}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = LaunchEnv.from_environ()
    rank, ws = env.rank, env.world_size
    incarnation = int(os.environ.get("RUNWATCH_INCARNATION") or 0)
    faults = FaultPlan(parse_faults(args.inject), rank, incarnation)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    backend = TorchDDPBackend()
    backend.init(env, timeout_s=args.pg_timeout_s)
    stop = StopFlag()

    cfg = TinyLMConfig(vocab_size=VOCAB_SIZE, seq_len=args.seq_len, d_model=args.d_model,
                       n_layer=args.n_layer, n_head=args.n_head, dropout=args.dropout)
    data = WindowDataset(generate_corpus(), args.seq_len, args.seed)
    torch.manual_seed(args.seed)
    model = TinyLM(cfg)
    flop_config = flop_config_from_causal_lm(model, args.seq_len)
    ddp = backend.wrap_model(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    ckpt = AsyncCheckpointer(args.checkpoint_dir, keep=args.keep_checkpoints) \
        if args.checkpoint_dir else None

    start_step, global_sample, restart_from = 0, 0, None
    resume_path = broadcast(resolve_resume(args) if rank == 0 else None)
    if resume_path is not None:
        restored = load_checkpoint(resume_path, ddp,
                                   None if args.drop_optimizer_state else optimizer,
                                   process_group=ckpt.process_group if ckpt else None)
        start_step = restart_from = restored.step
        global_sample = restored.loader.global_sample
        if restored.loader.seed != args.seed:
            raise SystemExit(f"checkpoint data seed {restored.loader.seed} != --seed {args.seed}")
        if not restored.rng_restored:
            torch.manual_seed(args.seed * 1_000_003 + start_step * 101 + rank)
        if rank == 0:
            print(f"resumed from {resume_path} at step {start_step} (saved by "
                  f"{restored.saved_world_size} ranks, now {ws}; optimizer "
                  f"{'restored' if restored.optimizer_restored else 'DROPPED'})", flush=True)
    if rank == 0 and args.checkpoint_dir:
        remove_staging_dirs(args.checkpoint_dir)
        for gone in discard_checkpoints_after(args.checkpoint_dir, start_step):
            print(f"discarded checkpoint {gone} (newer than step {start_step})", flush=True)

    trace = args.trace_dir
    emitter = make_emitter(
        enabled=bool(os.environ.get("RUNWATCH_BOOTSTRAP")) and not args.no_emit,
        run_id=args.run_id, rank=rank, world_size=ws,
        trace_path=trace / f"events.rank{rank}.jsonl" if trace else None)
    samples_log = (trace / f"samples.rank{rank}.jsonl").open("a") if trace else None
    metrics: dict[str, Any] = {"world_size": ws, "incarnation": incarnation,
                               "resumed_from": restart_from, "losses": {}, "grad_norms": {},
                               "step_time_s": {}, "checkpoints": []}
    if rank == 0:
        emitter.run_started(
            flop_config=flop_config, plan=backend.plan(),
            peak_flops_per_s=args.peak_flops_per_rank * ws, dtype="fp32",
            vocab_size=VOCAB_SIZE,
            tags={"model": "tinylm", "backend": backend.capabilities.name,
                  **dict(t.split("=", 1) for t in args.tag)},
            thresholds={k: float(v) for k, v in (t.split("=", 1) for t in args.threshold)})

    per_rank = args.global_batch // ws
    timer = StepTimer(backend.device)
    step, done, status, reason = start_step, start_step, "completed", ""
    try:
        for step in range(start_step + 1, args.steps + 1):
            faults.before_step(step)
            timer.start()
            ids, x, y = data.rank_batch(global_sample, args.global_batch, ws, rank)
            if faults.has("spike", step):
                y = torch.full_like(y, GARBAGE_TOKEN)
            x, y = x.to(backend.device), y.to(backend.device)
            lr = args.lr * min(1.0, step / max(1, args.warmup_steps))
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
            if faults.has("nan", step):
                loss = loss * float("nan")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = grad_norm(model.parameters(), args.clip or None)
            skipped = args.skip_nonfinite and not math.isfinite(gnorm)
            if not skipped:
                optimizer.step()
            stop_now = stop.requested or step == args.stop_at or step == args.steps
            stats = torch.tensor([loss.item(), float(stop_now)], dtype=torch.float64,
                                 device=backend.device)
            dist.all_reduce(stats)
            gang_loss, stop_now = stats[0].item() / ws, bool(stats[1].item() > 0)
            global_sample += args.global_batch
            if ckpt and (stop_now or (args.checkpoint_every
                                      and step % args.checkpoint_every == 0)):
                gang = tuple(data.loader_state(global_sample=global_sample, step=step,
                                               world_size=ws, rank=r) for r in range(ws))
                ckpt.save(step, ddp, optimizer, loader_state=gang[rank],
                          gang_loader_states=gang, world_size=ws)
            dt = timer.stop()
            emitter.heartbeat(step, step_time_s=dt)
            if samples_log:
                samples_log.write(json.dumps({"step": step, "ids": ids}) + "\n")
                samples_log.flush()
            if rank == 0:
                emitter.step(step, loss=gang_loss, step_time_s=dt, grad_norm=gnorm,
                             tokens=args.global_batch * args.seq_len,
                             examples=args.global_batch, local_tokens=per_rank * args.seq_len,
                             local_examples=per_rank, lr=lr, skipped=skipped,
                             restart_from_step=restart_from, data_parallel_size=ws)
                print(f"step {step} loss {gang_loss:.4f} dt {dt:.3f}s", flush=True)
                metrics["losses"][step] = gang_loss
                metrics["grad_norms"][step] = gnorm
                metrics["step_time_s"][step] = dt
            restart_from, done = None, step
            if ckpt:
                results = ckpt.poll()
                report_checkpoints(results, emitter, rank)
                metrics["checkpoints"] += [vars(r) | {"loader_states": None} for r in results]
            if args.step_delay_s:
                time.sleep(args.step_delay_s)
            if stop_now:
                status = "completed" if step == args.steps else "stopped"
                break
        if ckpt:
            results = ckpt.close(timeout_s=300.0)
            report_checkpoints(results, emitter, rank)
            metrics["checkpoints"] += [vars(r) | {"loader_states": None} for r in results]
    except Exception as exc:
        status, reason = "failed", f"{type(exc).__name__}: {exc}".splitlines()[0]
        print(f"rank {rank} failed at step {step}: {reason}", file=sys.stderr, flush=True)
        if ckpt:  # a write in flight may still commit; the gang's collectives decide
            report_checkpoints(ckpt.wait(timeout_s=5.0), emitter, rank)
    finally:
        if rank == 0:
            emitter.run_ended(status, final_step=done if done > 0 else None, reason=reason)
            if trace:
                metrics.update(status=status, final_step=done)
                (trace / "metrics.json").write_text(json.dumps(metrics, indent=1))
        emitter.close(timeout_s=10.0)
        if samples_log:
            samples_log.close()
    if status == "failed":
        os._exit(1)  # peers may be dead: skip process-group teardown, which can block
    backend.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
