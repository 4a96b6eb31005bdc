"""A rank tells its agent that its training finished, before the interpreter's teardown.

A rank that finished its last step can still die on the way out: torch frees a process
group's threads when the group object is freed, and a program that never destroyed its
group (the transformers Trainer, accelerate and Lightning scripts do not) frees it in
whatever order the interpreter's exit takes, which can abort the process ("terminate
called without an active exception", SIGABRT). To its agent that is a signalled exit like
a crash: the run it completed was reported failed, and an exit that reached the processors
before rank 0's RunEnded paged ``dead_rank`` and could restart a finished run.

So each rank writes a small file when its training is done (the agent names it in
``RUNWATCH_DONE_FILE``, one per rank and incarnation:
`controller.state.ControllerState.done_path`). A signal that kills the rank after that is
its teardown: the agent counts the exit as clean for the run's completion and publishes
its `RankExited` with ``finished`` set, which the processors take as a clean exit. An exit
code after it is still a failure: the script raised after training (a final save, an
upload), which is its own to report. The file says nothing the rank could not say by
exiting 0, so it gives a rank's code no power it did not have.

Call `mark_training_done` on every rank once training ended well: the runwatch callbacks
(`producers.callbacks`) call it from their train-end hooks and ``examples/train_ddp.py``
after its last step. Not after a failure: a rank whose training failed must exit as what
it is.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from runwatch.producers.settings import EmitterEnv


def mark_training_done(
    final_step: int | None = None, *, path: str | os.PathLike[str] | None = None
) -> Path | None:
    """Tell this rank's agent that its training finished; never raises.

    Written whole or not at all (a temporary file renamed into place), so the agent never
    reads half of it. A rank started without an agent (no ``RUNWATCH_DONE_FILE``) writes
    nothing. A file that cannot be written is a line on stderr, never an error at the end
    of a training that went well: the agent then treats a teardown abort as it did before.

    Args:
        final_step: The last step this rank completed (for the agent's log), if known.
        path: The file; None reads ``RUNWATCH_DONE_FILE``.

    Returns:
        The file written, or None when none is configured or it could not be written.
    """
    try:
        target = path if path is not None else EmitterEnv.from_env().done_file
    except ValueError as exc:  # a malformed RANK or WORLD_SIZE: the emitter says so too
        print(f"runwatch: could not mark training done: {exc}", file=sys.stderr)
        return None
    if not target:
        return None
    done = Path(target)
    scratch = done.with_name(f".{done.name}.{os.getpid()}.tmp")
    try:
        step = None if final_step is None else int(final_step)  # a numpy integer too
        body = {"pid": os.getpid(), "final_step": step, "ts_ns": time.time_ns()}
        scratch.write_text(json.dumps(body) + "\n", encoding="utf-8")
        os.replace(scratch, done)
    except (OSError, TypeError, ValueError) as exc:
        print(f"runwatch: could not mark training done in {done}: {exc}", file=sys.stderr)
        scratch.unlink(missing_ok=True)
        return None
    return done


__all__ = ["mark_training_done"]
