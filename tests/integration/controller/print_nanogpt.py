"""An unmodified training script, as far as runwatch knows: it only prints nanoGPT lines.

No runwatch import, no Kafka. Every rank prints ``iter N: loss L, time T ms, mfu M%`` for
N in 1..--steps (losses a deterministic function of the step, so an incarnation that starts
over prints the same ones), with banners and evaluation lines in between that must not be
taken for steps. ``--spike-at S`` prints a loss spike at step S; ``--die-at S`` makes rank
``--die-rank`` SIGKILL itself at step S of the first incarnation
(``RUNWATCH_INCARNATION`` 0, set by the launcher: the script does not need to know more).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import time


def loss_at(step: int) -> float:
    return 2.0 + 2.0 * math.exp(-step / 30.0) + 0.01 * math.sin(step)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-delay-s", type=float, default=0.1)
    p.add_argument("--spike-at", type=int, default=0)
    p.add_argument("--die-at", type=int, default=0)
    p.add_argument("--die-rank", type=int, default=1)
    a = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    first = os.environ.get("RUNWATCH_INCARNATION", "0") == "0"
    print(f"rank {rank}: number of parameters: 0.12M", flush=True)
    for step in range(1, a.steps + 1):
        if first and a.die_at and step == a.die_at and rank == a.die_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.perf_counter()
        time.sleep(a.step_delay_s)
        loss = loss_at(step) * (4.0 if step == a.spike_at else 1.0)
        dt_ms = (time.perf_counter() - t0) * 1000
        print(f"iter {step}: loss {loss:.4f}, time {dt_ms:.2f}ms, mfu 1.00%", flush=True)
        if step % 10 == 0:
            print(f"step {step}: train loss {loss:.4f}, val loss {loss + 0.1:.4f}", flush=True)


if __name__ == "__main__":
    main()
