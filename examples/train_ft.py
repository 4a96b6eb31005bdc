"""Train `TinyLM` under torchft DDP: replica groups that drop out of a step and heal.

Start it with ``runwatch launch --fault-tolerance torchft --replica-groups N
--nproc-per-group 1 -- python examples/train_ft.py ...`` (`controller.torchft_launcher`):
each replica group is its own gang (torchrun's variables inside the group), and the groups
meet per step in the quorum of a torchft Lighthouse (``TORCHFT_LIGHTHOUSE``,
``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS``). A group that dies is left out of the next
steps; the others go on. When it is started again it heals from a live peer's state
(torchft's checkpoint transport: model, optimizer and step), not from a checkpoint.

Data is a pure function of (seed, replica group, step), so a step redone by a healed group
reads what it would have read. Steps are numbered from 1 (torchft's committed steps).
Checkpoints (``--checkpoint-every``) are async DCP, written by the group that is replica
rank 0 of the step's quorum, kept for rollbacks: ``RUNWATCH_RESTART_FROM`` (a gang
restart after a NaN or a divergence) makes every group load the same one.

Each step is reported once, by group rank 0 of the quorum's first group: StepCompleted with
its ``replica_group`` and the step's ``participants`` (one tiny all-reduce of a one-hot
vector over the quorum: a group that is healing contributes nothing); every rank emits a
Heartbeat under its global rank
(group x ranks per group + group rank). At the end each rank prints and writes
(``--checksum-dir``) a checksum of its weights: every group must end equal.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from torch.distributed import ReduceOp
from torch.nn import functional as F  # noqa: N812

from examples.data import VOCAB_SIZE, WindowDataset, generate_corpus
from examples.instrument import make_emitter
from examples.tinylm import TinyLM, TinyLMConfig
from runwatch.common.checkpoint_layout import latest_complete_checkpoint
from runwatch.common.launch_env import LaunchEnv
from runwatch.producers.backend import get_training_backend
from runwatch.producers.checkpoint import AsyncCheckpointer, CheckpointResult, load_checkpoint
from runwatch.producers.torch_helpers import flop_config_from_causal_lm
from runwatch.producers.torchft_backend import TorchFTDDPBackend, floor_thresholds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    launch = LaunchEnv.from_environ()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="train until this committed step")
    p.add_argument("--seed", type=int, default=0, help="model init and data")
    p.add_argument("--batch", type=int, default=8, help="sequences per step per replica group")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=1)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--checkpoint-dir", type=Path, default=launch.checkpoint_dir)
    p.add_argument("--checkpoint-every", type=int, default=0, help="0: none")
    p.add_argument("--keep-checkpoints", type=int, default=None, metavar="N")
    p.add_argument("--step-delay-s", type=float, default=0.0, help="sleep per step")
    p.add_argument("--timeout-s", type=float, default=30.0, help="quorum/collective timeout")
    p.add_argument("--checksum-dir", type=Path, help="write group<G>.rank<R>.txt here at the end")
    p.add_argument(
        "--stop-file",
        type=Path,
        help="when it exists, it holds the last step (every group reads the same one)",
    )
    p.add_argument(
        "--hang-file",
        type=Path,
        help="when it exists and holds this rank's replica group, the group's first start "
        "stops stepping (alive, in a sleep): a hung group, for tests",
    )
    p.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a detector threshold the run announces (RunStarted.thresholds), repeatable",
    )
    p.add_argument("--run-id", default=launch.run_id or "tinylm-ft")
    p.add_argument("--no-emit", action="store_true")
    return p.parse_args(argv)


def weights_checksum(model: torch.nn.Module) -> str:
    """sha256 over the parameters in name order (equal weights, equal checksum)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class FTTrainer:
    """One rank of one replica group: model, torchft wrappers, data, checkpoints, events."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        env = LaunchEnv.from_environ()
        torch.set_num_threads(1)
        backend = get_training_backend("torchft-ddp")
        assert isinstance(backend, TorchFTDDPBackend)
        self.backend = backend
        backend.init(env, timeout_s=args.timeout_s)
        assert backend.replica is not None
        self.group, self.groups = backend.replica.group, backend.replica.groups
        self.group_rank, self.group_size = env.rank, env.world_size
        self.first_start = backend.replica.restarts == 0
        self.rank = self.group * self.group_size + self.group_rank
        self.manager = backend.manager
        cfg = TinyLMConfig(
            vocab_size=VOCAB_SIZE,
            seq_len=args.seq_len,
            d_model=args.d_model,
            n_layer=args.n_layer,
            n_head=args.n_head,
        )
        self.data = WindowDataset(generate_corpus(), args.seq_len, args.seed)
        torch.manual_seed(args.seed)
        self.model = TinyLM(cfg)
        self.flop_config = flop_config_from_causal_lm(self.model, args.seq_len)
        self.ddp = backend.wrap_model(self.model)
        self.inner_opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr)
        self.optimizer = backend.wrap_optimizer(self.inner_opt)
        backend.register_state("model", self.model.load_state_dict, self.model.state_dict)
        backend.register_state("optim", self.inner_opt.load_state_dict, self.inner_opt.state_dict)
        self.ckpt = (
            AsyncCheckpointer(args.checkpoint_dir, keep=args.keep_checkpoints)
            if args.checkpoint_dir and args.checkpoint_every
            else None
        )
        self.restart_from = self._resume(env)
        self.emitter = make_emitter(
            enabled=env.bootstrap is not None and not args.no_emit,
            run_id=args.run_id,
            rank=self.rank,
            world_size=self.groups * self.group_size,
            trace_path=None,
        )

    def _resume(self, env: LaunchEnv) -> int | None:
        """A gang restart from DCP (``RUNWATCH_RESTART_FROM``); a group respawn heals instead."""
        if not env.restart_from or self.args.checkpoint_dir is None:
            return None
        found = latest_complete_checkpoint(self.args.checkpoint_dir, at_or_before=env.restart_from)
        if found is None:
            return None
        restored = load_checkpoint(found[1], self.model, self.inner_opt)
        self.manager.load_state_dict({"step": restored.step, "batches_committed": 0})
        print(f"group {self.group}: resumed from {found[1]} at step {restored.step}", flush=True)
        return restored.step

    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This group rank's batch of ``step``: a function of (seed, group, step) only."""
        rng = np.random.default_rng([self.args.seed, self.group, self.group_rank, step])
        ids = [int(i) for i in rng.integers(0, self.data.n_samples, self.args.batch)]
        return self.data.batch(ids)

    def _step(self, step: int) -> tuple[float, tuple[int, ...], bool]:
        """Forward, backward, quorum all-reduces, commit: ``(loss, participants, committed)``."""
        x, y = self._batch(step)
        self.optimizer.zero_grad()  # starts the step's quorum
        loss = F.cross_entropy(self.ddp(x).flatten(0, 1), y.flatten())
        loss.backward()  # torchft's DDP all-reduces the gradients over the quorum
        present = torch.zeros(self.groups + 1, dtype=torch.float32)
        present[self.group] = 1.0
        present[-1] = loss.item()
        self.manager.allreduce(present, reduce_op=ReduceOp.SUM).wait()
        before = self.manager.current_step()
        self.optimizer.step()  # should_commit: the quorum agrees, or nobody steps
        committed = self.manager.current_step() > before
        groups = tuple(g for g in range(self.groups) if present[g].item() > 0.5)
        mean_loss = present[-1].item() / max(1, len(groups))
        return mean_loss, groups, committed

    def _checkpoint(self, step: int) -> None:
        if self.ckpt is None or step % self.args.checkpoint_every:
            return
        if self.manager.participating_rank() != 0:  # one group writes: the quorum's first
            return
        state = self.data.loader_state(
            global_sample=step * self.args.batch, step=step, world_size=1, rank=0
        )
        self.ckpt.save(step, self.model, self.inner_opt, loader_state=state)

    def _report(self, results: list[CheckpointResult]) -> None:
        for r in results:
            if r.status == "committed":
                self.emitter.checkpoint_committed(r.step, r.path, size_bytes=r.size_bytes)
                print(f"checkpoint step {r.step} committed {r.path}", flush=True)

    def _announce(self) -> None:
        self.emitter.run_started(
            flop_config=self.flop_config,
            plan=self.backend.plan(),
            dtype="fp32",
            vocab_size=VOCAB_SIZE,
            tags={"model": "tinylm", "backend": self.backend.capabilities.name},
            backend=self.backend.capabilities.declaration(),
            thresholds=self._thresholds() or None,
        )

    def _thresholds(self) -> dict[str, float]:
        """What the run announces: the launch's floor of groups, then ``--threshold``."""
        out = floor_thresholds()
        for pair in self.args.threshold:
            key, _, value = pair.partition("=")
            out[key.strip()] = float(value)
        return out

    def _hang_if_asked(self) -> None:
        """``--hang-file``: a first start of the group it names sleeps here for good."""
        hang = self.args.hang_file
        if hang is None or not self.first_start or not hang.exists():
            return
        if hang.read_text().strip() != str(self.group):
            return
        print(f"group {self.group}: hanging (--hang-file)", flush=True)
        while True:  # alive, not stepping: torchft's own threads still heartbeat
            time.sleep(3600)

    def _last_step(self) -> int:
        """``--steps``, or the earlier step ``--stop-file`` names once it exists."""
        stop = self.args.stop_file
        if stop is None or not stop.exists():
            return int(self.args.steps)
        text = stop.read_text().strip()
        return min(int(self.args.steps), int(text)) if text else int(self.args.steps)

    def run(self) -> str:
        """Train until ``--steps`` committed steps; returns the RunEnded status."""
        args = self.args
        if self.rank == 0 and self.manager.current_step() == 0:
            self._announce()
        while self.manager.current_step() < self._last_step():
            self._hang_if_asked()
            t0 = time.perf_counter()
            step = self.manager.current_step() + 1
            loss, groups, committed = self._step(step)
            dt = time.perf_counter() - t0
            if committed:
                step = self.manager.current_step()
                self._checkpoint(step)
                self.emitter.heartbeat(step, step_time_s=dt)
                # one report per step: the quorum's first group (the steps reducer
                # reads a step reported twice as a resume)
                if self.group_rank == 0 and self.manager.participating_rank() == 0:
                    self.emitter.step(
                        step,
                        loss=loss,
                        step_time_s=dt,
                        tokens=len(groups) * args.batch * args.seq_len * self.group_size,
                        examples=len(groups) * args.batch * self.group_size,
                        local_tokens=args.batch * args.seq_len,
                        local_examples=args.batch,
                        restart_from_step=self.restart_from,
                        data_parallel_size=max(1, len(groups)) * self.group_size,
                        replica_group=self.group,
                        participants=groups,
                    )
                    self.restart_from = None
                if self.group_rank == 0:
                    print(
                        f"group {self.group} step {step} loss {loss:.4f} dt {dt:.3f}s "
                        f"participants {list(groups)}",
                        flush=True,
                    )
            else:
                print(f"group {self.group}: step {step} not committed; retrying", flush=True)
            if self.ckpt:
                self._report(self.ckpt.poll())
            if args.step_delay_s:
                time.sleep(args.step_delay_s)
        if self.ckpt:
            self._report(self.ckpt.close(timeout_s=60.0))
        self._finish()
        return "completed"

    def _finish(self) -> None:
        step = self.manager.current_step()
        checksum = weights_checksum(self.model)
        print(f"group {self.group} rank {self.group_rank} final step {step} weights {checksum}")
        if self.args.checksum_dir:
            self.args.checksum_dir.mkdir(parents=True, exist_ok=True)
            out = self.args.checksum_dir / f"group{self.group}.rank{self.group_rank}.txt"
            out.write_text(f"{step} {checksum}\n")
        if self.rank == 0:
            self.emitter.run_ended("completed", final_step=step)
        self.emitter.close(timeout_s=10.0)


def main(argv: list[str] | None = None) -> int:
    """Train, then leave at once: torchft's server threads and the group's store would keep
    the interpreter alive, and a rank that failed must *exit* (its exit is the evidence the
    controller acts on), not linger with a live heartbeat and no steps."""
    code = 1
    try:
        FTTrainer(parse_args(argv)).run()
        code = 0
    except SystemExit as exc:  # argparse: --help, a bad flag
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())


__all__: list[Any] = ["FTTrainer", "main", "weights_checksum"]
