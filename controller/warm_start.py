"""A warm spare: a rank's process started before it is needed, its heavy imports done.

Most of a respawn's time on a small gang is new ranks importing torch (about 2.5 s of the
3-4 s from the restart to the first resumed step on this project's CPU benchmark). A node
agent started with ``runwatch launch --warm-spares`` keeps one spare per local rank slot
(`controller.spares`); on a restart each rank of the next incarnation starts in a spare
instead of a fresh interpreter.

This file is the spare. It is run **as a file** (``python [flags] .../warm_start.py``) by
the interpreter of the training command, so it imports only the standard library and
needs nothing of runwatch installed where the ranks run. The protocol:

1. The agent starts it under the gang's exit-status wrapper, in its own session, with the
   agent's environment (the ``--env`` extras included, the command key scrubbed), stdin a
   pipe, and output to the spare's own log. Arguments: ``--preload MOD[,MOD...]``,
   ``--ready-file PATH`` and ``--script PATH`` or ``--module NAME`` (what it will run).
2. It imports the preload modules and the modules the script imports at its top level
   (read from its source, not run; one that fails to import is skipped, the script will
   say why when it runs), then writes its pid to the ready file (atomically: ``PATH.tmp``
   renamed) and blocks reading one line from stdin.
3. End of input (the agent closed the pipe, or died): it exits 0 without running anything.
   A line is the assignment, a JSON object ``{"argv": [...], "env": {...}, "cwd": str,
   "log": str}``: ``argv`` is the training command without its interpreter and flags
   (``["train.py", "--x", "1"]`` or ``["-m", "pkg.train", "--x", "1"]``), ``env`` the
   rank's whole environment, ``log`` the rank's output file.
4. It appends its stdout and stderr to ``log``, replaces ``os.environ`` with ``env``,
   changes to ``cwd``, sets ``sys.argv`` and ``sys.path[0]`` as the interpreter would
   have, and runs the script as ``__main__``. Its exit status is the script's.

What differs from a cold start: the preloaded modules were imported with the agent's
environment rather than the rank's, so a variable read at import time must not differ
between ranks (the per-rank contract, ``RANK``, ``MASTER_PORT`` and the rest, is read
when the process group is made, after the assignment).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import os
import runpy
import sys
import time
from typing import Any


def _redirect(log_path: str) -> None:
    """Input from /dev/null and output to the rank's log, as a cold rank has them."""
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (the process's stdin)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _run(assignment: dict[str, Any]) -> None:
    argv = [str(a) for a in assignment["argv"]]
    _redirect(str(assignment["log"]))
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in assignment["env"].items()})
    os.chdir(str(assignment["cwd"]))
    if argv[0] == "-m":
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]  # runpy sets argv[0] to the module's file
        sys.path[0] = os.getcwd()
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, args = argv[0], argv[1:]
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


def script_imports(source: str) -> list[str]:
    """The absolute imports a script makes at its top level (in ``if``/``try`` too).

    Args:
        source: The script's text.

    Returns:
        Module names in the order they appear, each once; ``from . import x`` is left out.
    """
    names: list[str] = []
    todo = list(ast.parse(source).body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.If):
            todo[:0] = [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            handlers = [stmt for handler in node.handlers for stmt in handler.body]
            todo[:0] = [*node.body, *handlers, *node.orelse, *node.finalbody]
    return list(dict.fromkeys(names))


def _source_of(script: str | None, module: str | None) -> str:
    try:
        if module:
            spec = importlib.util.find_spec(module)
            script = spec.origin if spec is not None else None
        if script:
            with open(script, encoding="utf-8") as f:
                return f.read()
    except (ImportError, OSError, ValueError):
        pass
    return ""


def preload(modules: list[str], source: str) -> tuple[list[str], list[str]]:
    """Import ``modules`` and the top-level imports of ``source``.

    Returns:
        The names imported and the names that failed (skipped: the script itself will
        import them again, and fail there with its own traceback if it must).
    """
    done, failed = [], []
    for name in dict.fromkeys([*modules, *script_imports(source)]):
        try:
            importlib.import_module(name)
        except Exception:  # a preload is a guess; the run decides
            failed.append(name)
        else:
            done.append(name)
    return done, failed


def main() -> None:
    """Preload, announce readiness, wait for the assignment and run it (or exit on EOF)."""
    # Run as a file, this directory is sys.path[0]: never let it shadow the user's modules.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path[0] = os.getcwd()
    parser = argparse.ArgumentParser(description="a warm spare rank process")
    parser.add_argument("--preload", default="", help="comma-separated modules to import")
    parser.add_argument("--ready-file", required=True, help="written with the pid when warm")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--script", help="the script the spare will run (its imports preload)")
    target.add_argument("--module", help="the module the spare will run (-m)")
    args = parser.parse_args()
    started = time.monotonic()
    modules = [m.strip() for m in args.preload.split(",") if m.strip()]
    if args.script:
        sys.path[0] = os.path.dirname(os.path.abspath(args.script))
    done, failed = preload(modules, _source_of(args.script, args.module))
    tmp = f"{args.ready_file}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(tmp, args.ready_file)
    print(
        f"warm spare {os.getpid()}: ready in {time.monotonic() - started:.2f} s, preloaded "
        f"{len(done)} modules" + (f" (not importable here: {', '.join(failed)})" if failed else ""),
        flush=True,
    )
    line = sys.stdin.readline()
    if not line.strip():
        return  # released: the agent closed the pipe or is gone
    _run(json.loads(line))


if __name__ == "__main__":
    main()
