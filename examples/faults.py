"""Fault injection for chaos tests and the demo: what goes wrong, where and when.

A fault is written ``KIND@STEP[:key=value]...``, several separated by commas or spaces, given
with ``--inject`` (repeatable) or the ``RUNWATCH_INJECT`` environment variable:

* ``nan@12``: the loss of step 12 is multiplied by NaN before ``backward()``, so the loss,
  the gradients and (unless ``--skip-nonfinite``) the weights turn NaN, as in a real blow-up.
* ``spike@20``: step 20 trains on a garbage batch (every target is byte 255, which the corpus
  never contains), so the loss and the gradient norm really spike, then recover.
* ``kill@15:rank=1``: rank 1 sends itself SIGKILL at the start of step 15.
* ``hang@15:rank=1:secs=600``: rank 1 sleeps ``secs`` seconds (default 3600) at the start of
  step 15; the rest of the gang blocks in the next collective.
* ``dropopt@0:incarnation=2``: when incarnation 2 resumes from a checkpoint it loads the model
  but not the optimizer state (``--drop-optimizer-state`` for one incarnation only; the step
  is ignored). The demo uses it to provoke a resume that breaks continuity.
* ``abort@0:rank=1``: rank 1 finishes its training, tells its agent so, shuts its process
  group down, then aborts (SIGABRT) as a C++ destructor does in an interpreter's teardown
  ("terminate called without an active exception"); the step is ignored. A completed run
  must stay completed, with no ``dead_rank``.
* ``stuck@0:rank=1:secs=600``: rank 1 finishes its training, tells its agent so, shuts its
  process group down, then does not exit for ``secs`` seconds, as a rank whose NCCL
  destructor waits on a peer that left; the step is ignored. Its agent warns, and with
  ``runwatch launch --teardown-timeout`` stops it: the run completes.

Keys: ``rank`` (default: every rank), ``incarnation`` (default 0: a fault fires only in the
first launch, so a restarted gang does not re-inject it; the incarnation comes from
``RUNWATCH_INCARNATION``), ``secs`` (hang and stuck only).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

FaultKind = Literal["nan", "spike", "kill", "hang", "dropopt", "abort", "stuck"]
KINDS: tuple[FaultKind, ...] = ("nan", "spike", "kill", "hang", "dropopt", "abort", "stuck")
GARBAGE_TOKEN = 255
"""The target byte of a spike batch: absent from the corpus, so the model rates it unlikely."""

_SPEC = re.compile(r"^(?P<kind>[a-z]+)@(?P<step>\d+)(?P<opts>(?::[a-z]+=[0-9.]+)*)$")


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    Attributes:
        kind: What happens.
        step: The step it happens at.
        rank: The rank it happens on; None: every rank.
        incarnation: The gang incarnation it fires in.
        secs: How long a hang (or a rank stuck in its teardown) sleeps.
    """

    kind: FaultKind
    step: int
    rank: int | None = None
    incarnation: int = 0
    secs: float = 3600.0

    def fires(self, step: int, rank: int, incarnation: int) -> bool:
        """True if this fault applies to ``rank`` at ``step`` in ``incarnation``."""
        return (
            self.step == step
            and self.incarnation == incarnation
            and (self.rank is None or self.rank == rank)
        )


def parse_fault(spec: str) -> Fault:
    """Parse one ``KIND@STEP[:key=value]...`` spec.

    Args:
        spec: The spec, e.g. ``"kill@15:rank=1"``.

    Returns:
        The fault.

    Raises:
        ValueError: On a malformed spec, an unknown kind or an unknown key.
    """
    match = _SPEC.match(spec.strip())
    if not match or match["kind"] not in KINDS:
        raise ValueError(
            f"bad fault spec {spec!r}; expected KIND@STEP[:key=value] with KIND "
            f"in {', '.join(KINDS)}"
        )
    opts: dict[str, str] = dict(part.split("=", 1) for part in match["opts"].split(":") if part)
    unknown = set(opts) - {"rank", "incarnation", "secs"}
    if unknown:
        raise ValueError(f"bad fault spec {spec!r}: unknown keys {sorted(unknown)}")
    kind: FaultKind = match["kind"]  # type: ignore[assignment]
    return Fault(
        kind=kind,
        step=int(match["step"]),
        rank=int(opts["rank"]) if "rank" in opts else None,
        incarnation=int(opts.get("incarnation", "0")),
        secs=float(opts.get("secs", "3600")),
    )


def parse_faults(specs: Iterable[str]) -> tuple[Fault, ...]:
    """Parse specs, each possibly holding several faults separated by commas or spaces."""
    return tuple(parse_fault(part) for spec in specs for part in re.split(r"[,\s]+", spec) if part)


@dataclass(frozen=True)
class FaultPlan:
    """The faults of one rank of one incarnation.

    Attributes:
        faults: Every fault given.
        rank: This rank.
        incarnation: This incarnation.
    """

    faults: tuple[Fault, ...]
    rank: int
    incarnation: int

    def has(self, kind: FaultKind, step: int) -> bool:
        """True if a fault of ``kind`` fires here at ``step``."""
        return any(
            f.kind == kind and f.fires(step, self.rank, self.incarnation) for f in self.faults
        )

    def active(self, kind: FaultKind) -> bool:
        """True if a fault of ``kind`` applies to this rank and incarnation at any step."""
        return any(
            f.kind == kind and f.fires(f.step, self.rank, self.incarnation) for f in self.faults
        )

    def at_exit(self) -> None:
        """Apply the teardown faults (stuck, then abort) that apply here."""
        for fault in self.faults:
            if fault.kind == "stuck" and fault.fires(fault.step, self.rank, self.incarnation):
                stuck_s = fault.secs
                print(f"[inject] rank {self.rank} stuck {stuck_s:g}s in its teardown", flush=True)
                time.sleep(stuck_s)
        if self.active("abort"):
            print(f"[inject] rank {self.rank} aborts in its teardown", flush=True)
            os.abort()

    def before_step(self, step: int) -> None:
        """Apply the process-level faults (kill, hang) due at the start of ``step``."""
        for fault in self.faults:
            if not fault.fires(step, self.rank, self.incarnation):
                continue
            if fault.kind == "kill":
                print(f"[inject] rank {self.rank} SIGKILL at step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            elif fault.kind == "hang":
                print(f"[inject] rank {self.rank} hangs {fault.secs:g}s at step {step}", flush=True)
                time.sleep(fault.secs)
