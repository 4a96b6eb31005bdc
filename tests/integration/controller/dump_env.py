"""A rank that writes what it was started with to ``OUT.rank<RANK>.json`` and exits.

``python dump_env.py OUT [--raise-on-rank R]``: the file holds the environment, ``argv``,
the interpreter and its own command line (``sys.orig_argv``: ``-u`` or not). With ``--raise-on-rank R``,
rank R then raises ``ValueError`` inside torch's ``@record`` entry point, which writes it
to ``TORCHELASTIC_ERROR_FILE`` and exits 1 (the other ranks exit 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def dump(out: str) -> None:
    rank = os.environ.get("RANK", "none")
    seen = {
        "env": dict(os.environ),
        "argv": sys.argv,
        "executable": sys.executable,
        "interpreter_argv": sys.orig_argv[1:],
    }
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(seen))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--raise-on-rank", type=int)
    args = parser.parse_args()
    dump(args.out)
    if args.raise_on_rank is None:
        return
    # imported only here: torch's import would double the plain dump's start-up
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def step() -> None:
        print("step: 1, loss: 2.5, dt: 0.1", flush=True)
        if os.environ["RANK"] == str(args.raise_on_rank):
            raise ValueError(f"rank {args.raise_on_rank} found batch 7 empty")

    step()


if __name__ == "__main__":
    main()
