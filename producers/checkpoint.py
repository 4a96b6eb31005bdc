"""Asynchronous DCP checkpoints of a whole training state, committed atomically.

What is saved (one ``torch.distributed.checkpoint`` directory, wrapper-agnostic FQN keys from
``get_state_dict``, so a checkpoint reshards to another world size):

* ``model.*``: model parameters and buffers;
* ``optim.*``: optimizer state, keyed by parameter name;
* ``progress``: JSON ``{"step", "world_size"}`` of the saving gang;
* ``rank<r>.loader``: JSON of rank r's `LoaderState` (``global_sample`` is what resumes);
* ``rank<r>.rng.{torch,cuda,python,numpy}``: rank r's random generator states.

How the training loop is spared the write: `AsyncCheckpointer.save` calls
``torch.distributed.checkpoint.async_save``, which copies the state dict into fresh CPU
storage on the calling thread (the only part that blocks the loop, reported as ``blocked_s``
together with any wait for the previous save) and runs ``save`` on a background thread. The
background save's collectives run on a process group of their own (gloo), so they never
interleave with the training loop's collectives on the default group. The write goes to
``step_N.tmp``; when it is done, the coordinator renames it to ``step_N`` (see
`common.checkpoint_layout` for the commit protocol) and prunes old checkpoints.

Every rank of the gang must construct the `AsyncCheckpointer` (it creates a process group)
and call `AsyncCheckpointer.save` for the same steps.
"""

from __future__ import annotations

import os
import queue
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import msgspec
import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save

from runwatch.common.checkpoint_layout import (
    commit_checkpoint,
    directory_size_bytes,
    latest_complete_checkpoint,
    prune_checkpoints,
    staging_dir,
)
from runwatch.schemas.events import LoaderState

__all__ = [
    "AsyncCheckpointer",
    "CheckpointResult",
    "RestoredState",
    "latest_complete_checkpoint",
    "load_checkpoint",
    "training_state_dict",
]


@dataclass(frozen=True)
class CheckpointResult:
    """How one rank's part of one checkpoint ended.

    Attributes:
        step: The step the checkpoint holds.
        path: The committed directory (coordinator, committed) or the staging one.
        status: ``committed`` (coordinator: complete on disk on every rank), ``written``
            (another rank: its shards are written) or ``failed``.
        blocked_s: Seconds the training loop waited in `AsyncCheckpointer.save`.
        write_s: Seconds from the end of staging to the end of the background write.
        size_bytes: Bytes in the committed directory (coordinator only).
        loader_states: Every rank's loader state, as given to `AsyncCheckpointer.save`.
        error: One line when ``status`` is ``failed``.
    """

    step: int
    path: str
    status: Literal["committed", "written", "failed"]
    blocked_s: float
    write_s: float
    size_bytes: int = 0
    loader_states: tuple[LoaderState, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class RestoredState:
    """What `load_checkpoint` restored, for the caller to resume from.

    Attributes:
        step: The step the checkpoint holds; training continues at ``step + 1``.
        loader: This rank's loader state, or rank 0's when the checkpoint has no entry for
            this rank (a resume on a larger gang); use its ``global_sample``.
        saved_world_size: World size of the gang that saved it.
        optimizer_restored: False when the optimizer state was deliberately not loaded.
        rng_restored: False when the checkpoint had no RNG state for this rank.
    """

    step: int
    loader: LoaderState
    saved_world_size: int
    optimizer_restored: bool
    rng_restored: bool


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _rng_states() -> dict[str, Any]:
    """Tensors for torch's generators; JSON strings (DCP leaves) for Python's and numpy's."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    np_state["state"]["key"] = np_state["state"]["key"].tolist()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": msgspec.json.encode([version, internal, gauss]).decode(),
        "numpy": msgspec.json.encode(np_state).decode(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"])
    if "python" in states:
        version, internal, gauss = msgspec.json.decode(states["python"])
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in states:
        np_state = msgspec.json.decode(states["numpy"])
        np_state["state"]["key"] = np.asarray(np_state["state"]["key"], dtype=np.uint32)
        np.random.set_state(np_state)


def training_state_dict(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    loader_state: LoaderState,
    world_size: int,
) -> dict[str, Any]:
    """This rank's view of the whole training state, in the layout of the module docstring.

    Args:
        model: The (possibly DDP-wrapped) model.
        optimizer: Its optimizer.
        step: The last completed step.
        loader_state: This rank's loader state after ``step``.
        world_size: Ranks in the gang.

    Returns:
        A state dict for ``dcp.save`` / ``dcp.async_save`` (tensors are live, not copies).
    """
    model_sd, optim_sd = get_state_dict(model, optimizer)
    rank = loader_state.rank
    return {
        "model": model_sd,
        "optim": optim_sd,
        "progress": msgspec.json.encode({"step": step, "world_size": world_size}).decode(),
        f"rank{rank}": {
            "loader": msgspec.json.encode(loader_state).decode(),
            "rng": _rng_states(),
        },
    }


WRITER_EXIT_S = 10.0
"""How long `AsyncCheckpointer.close` waits for DCP's writer thread to end after its write
(it ends at once: DCP shuts its one-thread executor down when the save's future is done)."""


class AsyncCheckpointer:
    """Writes checkpoints in the background; at most one write is in flight per gang.

    Args:
        root: Checkpoint root directory (shared by all ranks).
        keep: Keep this many newest committed checkpoints; None keeps all.
        coordinator_rank: The rank that commits and prunes (DCP's coordinator, rank 0).
    """

    def __init__(
        self, root: str | os.PathLike[str], *, keep: int | None = None, coordinator_rank: int = 0
    ) -> None:
        self.root = Path(root)
        self.keep = keep
        self.rank = _rank()
        self.coordinator_rank = coordinator_rank
        self._distributed = dist.is_available() and dist.is_initialized()
        self.process_group: dist.ProcessGroup | None = (
            cast(dist.ProcessGroup, dist.new_group(backend="gloo")) if self._distributed else None
        )
        self._inflight: threading.Event | None = None  # set when the write is committed
        self._writer: threading.Thread | None = None  # the thread that ran the last write
        self._results: queue.Queue[CheckpointResult] = queue.Queue()
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def is_coordinator(self) -> bool:
        """True on the rank that commits checkpoints and reports them."""
        return self.rank == self.coordinator_rank

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        loader_state: LoaderState,
        gang_loader_states: Sequence[LoaderState] = (),
        world_size: int = 1,
    ) -> float:
        """Stage the training state and start writing it in the background.

        Waits first for the previous write, if it is still running (so at most one is in
        flight); that wait counts as blocked time.

        Args:
            step: The last completed step.
            model: The (possibly DDP-wrapped) model.
            optimizer: Its optimizer.
            loader_state: This rank's loader state after ``step``.
            gang_loader_states: Every rank's loader state, reported on commit.
            world_size: Ranks in the gang.

        Returns:
            Seconds the caller was blocked.
        """
        t0 = time.perf_counter()
        if self._inflight is not None:
            self._inflight.wait()  # the previous write, its commit and pruning
            self._inflight = None
        tmp = staging_dir(self.root, step)
        state = training_state_dict(
            model, optimizer, step=step, loader_state=loader_state, world_size=world_size
        )
        future = async_save(
            state,
            checkpoint_id=str(tmp),
            process_group=self.process_group,
            no_dist=not self._distributed,
        )
        staged = time.perf_counter()
        blocked_s = staged - t0
        states = tuple(gang_loader_states)

        finished = threading.Event()

        def on_done(fut: Future[Any]) -> None:
            self._writer = threading.current_thread()
            try:
                self._results.put(self._finish(fut, step, tmp, blocked_s, staged, states))
            finally:
                finished.set()

        assert isinstance(future, Future)  # no custom stager: a plain upload future
        self._inflight = finished
        future.add_done_callback(on_done)
        return blocked_s

    def _finish(
        self,
        fut: Future[Any],
        step: int,
        tmp: Path,
        blocked_s: float,
        staged: float,
        states: tuple[LoaderState, ...],
    ) -> CheckpointResult:
        error = fut.exception()
        write_s = time.perf_counter() - staged
        if error is not None:
            return CheckpointResult(
                step,
                str(tmp),
                "failed",
                blocked_s,
                write_s,
                loader_states=states,
                error=_one_line(error),
            )
        if not self.is_coordinator:
            return CheckpointResult(
                step, str(tmp), "written", blocked_s, write_s, loader_states=states
            )
        try:
            final = commit_checkpoint(self.root, step)
            size = directory_size_bytes(final)
            if self.keep is not None:
                prune_checkpoints(self.root, self.keep)
        except OSError as exc:
            return CheckpointResult(
                step,
                str(tmp),
                "failed",
                blocked_s,
                write_s,
                loader_states=states,
                error=_one_line(exc),
            )
        write_s = time.perf_counter() - staged
        return CheckpointResult(step, str(final), "committed", blocked_s, write_s, size, states)

    def poll(self) -> list[CheckpointResult]:
        """Results of writes that finished since the last call; never blocks."""
        done: list[CheckpointResult] = []
        while True:
            try:
                done.append(self._results.get_nowait())
            except queue.Empty:
                return done

    def wait(self, timeout_s: float | None = None) -> list[CheckpointResult]:
        """Wait for the write in flight (if any), then return everything unreported.

        Args:
            timeout_s: Give up waiting after this long; None waits indefinitely.

        Returns:
            As `poll`.
        """
        if self._inflight is not None and self._inflight.wait(timeout_s):
            self._inflight = None
        return self.poll()

    def close(self, timeout_s: float | None = None) -> list[CheckpointResult]:
        """Wait for the write in flight and release the process group.

        DCP's writer thread holds the save's arguments, this group among them, until its
        callbacks (ours included) have run; it is joined here, so that the group is freed
        and its gloo threads end now, not while the interpreter tears down at exit.

        Args:
            timeout_s: As in `wait` (then up to `WRITER_EXIT_S` for the writer thread).

        Returns:
            As `wait`.
        """
        results = self.wait(timeout_s)
        if self.process_group is not None and self._inflight is None:
            dist.destroy_process_group(self.process_group)
            self.process_group = None
            writer = self._writer
            if writer is not None and writer is not threading.current_thread():
                writer.join(WRITER_EXIT_S)
        return results


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


def load_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    process_group: dist.ProcessGroup | None = None,
) -> RestoredState:
    """Load a checkpoint into ``model`` (and ``optimizer``) on every rank; restore RNG state.

    Every rank of the gang calls it. The gang may have another size than the one that saved:
    model and optimizer state are resharded by DCP; loader position is global
    (``global_sample``); a rank without an entry in the checkpoint takes rank 0's loader state
    and keeps its own RNG (returned as ``rng_restored=False``, so the caller can reseed).

    Args:
        path: A complete checkpoint directory.
        model: The (possibly DDP-wrapped) model to load into.
        optimizer: Its optimizer; None leaves the optimizer untouched (a resume that drops
            optimizer state, on purpose).
        process_group: Group for DCP's collectives (e.g. `AsyncCheckpointer.process_group`);
            None: the default group.

    Returns:
        What was restored.
    """
    rank = _rank()
    distributed = dist.is_available() and dist.is_initialized()
    keys = set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    own = f"rank{rank}" if f"rank{rank}.loader" in keys else "rank0"
    state: dict[str, Any] = {"progress": "", own: {"loader": ""}}
    rngs = {
        name: value
        for name, value in _rng_states().items()
        if own == f"rank{rank}" and f"{own}.rng.{name}" in keys
    }
    if rngs:
        state[own]["rng"] = rngs
    if optimizer is not None:
        state["model"], state["optim"] = get_state_dict(model, optimizer)
    else:
        state["model"] = get_model_state_dict(model)
    dcp_load(state, checkpoint_id=str(path), process_group=process_group, no_dist=not distributed)
    if optimizer is not None:
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    else:
        set_model_state_dict(model, state["model"])
    rng = state[own].get("rng", {})
    _set_rng_states(rng)
    progress = msgspec.json.decode(state["progress"])
    return RestoredState(
        step=int(progress["step"]),
        loader=msgspec.json.decode(state[own]["loader"], type=LoaderState),
        saved_world_size=int(progress["world_size"]),
        optimizer_restored=optimizer is not None,
        rng_restored=bool(rng),
    )
