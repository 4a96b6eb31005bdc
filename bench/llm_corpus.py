"""Build the local LLM-pretraining corpus from public training logs (nothing fetched is committed).

The committed manifest (`bench/data/llm_curves/manifest.json`) names, per run, the public
repository, the commit and the git blob of every log file it was read from, how to parse
it, and our own labels (split, healthy step ranges, incidents). This script reads those
blobs from local copies of the repositories and writes the per-step columns to a local
corpus (default ``~/.runwatch/corpora/llm``), in the column conventions of
`bench/data/real_curves`:

* ``<run>/step``, ``<run>/loss``, ``<run>/grad_norm`` (NaN where the log has none),
  ``<run>/step_time_s`` (NaN where the log has none), ``<run>/tokens``,
  ``<run>/restart_from`` (-1, or on a resumed segment's first row the step resumed from),
  ``<run>/skipped`` (0);
* ``build.json``: the manifest's sha256 and each run's rows, so a bench can tell a corpus
  built from another manifest.

The build also checks the labels against the logs: every incident's evidence line must hold
its step, and the ``benign_spike`` labels must be exactly what their rule finds
(`benign_spike_steps`).

A repository is read from ``<mirrors>/<owner>+<name>/repo`` (a bare git dir, as a fetch
tool leaves it), ``<mirrors>/<owner>+<name>/.git`` or ``<mirrors>/<owner>/<name>/.git`` (a
plain ``git clone``); a single file may instead sit at ``<raw>/<owner>+<name>/<path>``.
Either way its git blob id must equal the manifest's, so the corpus is the same bytes
wherever it was built. Every run whose sources are missing is named with the repository
and commit to fetch; the others are built.

    .venv/bin/python bench/llm_corpus.py [--mirrors DIR] [--raw DIR] [--out DIR] [--list]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from spike_census import WINDOW, trailing_median

MANIFEST = Path(__file__).resolve().parent / "data" / "llm_curves" / "manifest.json"
DEFAULT_ROOT = Path(os.environ.get("RUNWATCH_LLM_CORPUS", "~/.runwatch/corpora/llm")).expanduser()
DEFAULT_MIRRORS = Path(os.environ.get("RUNWATCH_MIRRORS", "/work/.mirror"))
CORPUS_FILE = "curves.npz"
BUILD_FILE = "build.json"
BUILDER_VERSION = 1
BENIGN_SPIKE_RATIO = 1.08
BENIGN_SPIKE_GAP = 3


@dataclass(frozen=True)
class LogFormat:
    """How one kind of training log prints a step.

    Attributes:
        pattern: Regex with named groups ``step`` and ``loss``, optionally ``grad_norm``
            and ``dt_ms`` (the step's wall time in milliseconds); matched per line.
        grad_norm: The format logs the grad norm.
        step_time: The format logs the step time.
    """

    pattern: re.Pattern[str]
    grad_norm: bool
    step_time: bool


_NUM = r"[-+]?(?:nan|inf|[\d.]+(?:[eE][-+]?\d+)?)"
FORMATS: Mapping[str, LogFormat] = {
    # karpathy/build-nanogpt's stdout: "step    12 | loss: 9.78 | lr 1.09e-05 | norm: 2.99 |
    # dt: 413.32ms | tok/sec: ..." (a logging prefix before "step" is allowed)
    "build_nanogpt_stdout": LogFormat(
        re.compile(
            rf"(?:^|\s)step\s+(?P<step>\d+) \| loss: (?P<loss>{_NUM}) \| lr \S+ \| "
            rf"norm: (?P<grad_norm>{_NUM}) \| dt: (?P<dt_ms>{_NUM})ms",
            re.M,
        ),
        grad_norm=True,
        step_time=True,
    ),
    # a build-nanogpt variant: "step 12 || loss: 9.78 || norm: 2.99 || elapsed_time: dt=413ms"
    "build_nanogpt_pipes": LogFormat(
        re.compile(
            rf"^step (?P<step>\d+) \|\| loss: (?P<loss>{_NUM}) \|\| norm: (?P<grad_norm>{_NUM})"
            rf" \|\| elapsed_time: dt=(?P<dt_ms>{_NUM})ms",
            re.M,
        ),
        grad_norm=True,
        step_time=True,
    ),
    # build-nanogpt's log.txt: "12 train 9.781719" (val and hella lines are skipped)
    "build_nanogpt_logtxt": LogFormat(
        re.compile(rf"^(?P<step>\d+) train (?P<loss>{_NUM})$", re.M),
        grad_norm=False,
        step_time=False,
    ),
    # karpathy/llm.c's main.log: "s:12 trl:9.7936 lr:0.000011 norm:3.05"
    "llmc_main": LogFormat(
        re.compile(
            rf"^s:(?P<step>\d+) trl:(?P<loss>{_NUM}) lr:\S+ norm:(?P<grad_norm>{_NUM})$", re.M
        ),
        grad_norm=True,
        step_time=False,
    ),
    # llm.c's stdout: "step   12/19560 | loss 9.79 (+0.1z)| norm 2.99 (+0.2z)| lr 1e-05 | 4215 ms"
    "llmc_stdout": LogFormat(
        re.compile(
            rf"^step\s+(?P<step>\d+)/\d+ \| loss\s+(?P<loss>{_NUM}) \([^)]*\)\| "
            rf"norm\s+(?P<grad_norm>{_NUM}) \([^)]*\)\| lr \S+ \| (?P<dt_ms>{_NUM}) ms",
            re.M,
        ),
        grad_norm=True,
        step_time=True,
    ),
}
"""Every log format a manifest source may name (``format``)."""


class SourceMissing(Exception):
    """A run's log file is not available locally (or not the manifest's bytes)."""


class BadLog(ValueError):
    """A log file does not parse as its manifest entry says."""


@dataclass(frozen=True)
class Rows:
    """One log segment's steps, parsed (``line``: the 1-based line of each step)."""

    step: np.ndarray
    loss: np.ndarray
    grad_norm: np.ndarray
    step_time_s: np.ndarray
    line: np.ndarray


def git_blob_id(data: bytes) -> str:
    """The git blob id (sha1) of a file's bytes, as ``git hash-object`` prints it."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def repo_dirs(mirrors: Path, repo: str) -> Iterator[Path]:
    """Candidate git dirs of ``owner/name`` under ``mirrors``."""
    owner, name = repo.split("/", 1)
    yield mirrors / f"{owner}+{name}" / "repo"
    yield mirrors / f"{owner}+{name}" / ".git"
    yield mirrors / owner / name / ".git"


def read_source(
    source: Mapping[str, Any], segment: Mapping[str, Any], mirrors: Path, raw: Path
) -> bytes:
    """The bytes of one manifest segment, checked against its git blob id.

    Raises:
        SourceMissing: Neither a mirror nor a raw copy holds those bytes.
    """
    repo, blob, path = str(source["repo"]), str(segment["blob"]), str(segment["path"])
    owner, name = repo.split("/", 1)
    raw_file = raw / f"{owner}+{name}" / path
    if raw_file.is_file():
        data = raw_file.read_bytes()
        if git_blob_id(data) == blob:
            return data
    for git_dir in repo_dirs(mirrors, repo):
        if not git_dir.is_dir():
            continue
        got = subprocess.run(
            ["git", f"--git-dir={git_dir}", "cat-file", "blob", blob],
            capture_output=True,
            check=False,
        )
        if got.returncode == 0 and git_blob_id(got.stdout) == blob:
            return got.stdout
    raise SourceMissing(
        f"{repo}@{source['commit'][:12]}:{path} (blob {blob[:12]}) not found under "
        f"{mirrors} or {raw}"
    )


def parse_log(text: str, fmt_name: str) -> Rows:
    """Parse one log segment; steps must strictly increase.

    Raises:
        BadLog: Unknown format, no step lines, or steps out of order.
    """
    if fmt_name not in FORMATS:
        raise BadLog(f"unknown log format {fmt_name!r}; known: {', '.join(FORMATS)}")
    fmt = FORMATS[fmt_name]
    newlines = np.fromiter((m.start() for m in re.finditer("\n", text)), dtype=np.int64)
    steps: list[int] = []
    loss: list[float] = []
    grad: list[float] = []
    dt: list[float] = []
    at: list[int] = []
    for m in fmt.pattern.finditer(text):
        step = int(m["step"])
        line = int(np.searchsorted(newlines, m.start("step"), side="right")) + 1
        if steps and step <= steps[-1]:
            raise BadLog(f"{fmt_name}: step {step} at line {line} after step {steps[-1]}")
        steps.append(step)
        at.append(line)
        loss.append(float(m["loss"]))
        grad.append(float(m["grad_norm"]) if fmt.grad_norm else math.nan)
        dt.append(float(m["dt_ms"]) / 1000.0 if fmt.step_time else math.nan)
    if not steps:
        raise BadLog(f"no {fmt_name} step lines")
    return Rows(
        step=np.asarray(steps, dtype=np.int64),
        loss=np.asarray(loss, dtype=np.float64),
        grad_norm=np.asarray(grad, dtype=np.float64),
        step_time_s=np.asarray(dt, dtype=np.float64),
        line=np.asarray(at, dtype=np.int64),
    )


def build_run(
    run: Mapping[str, Any], mirrors: Path, raw: Path
) -> tuple[dict[str, np.ndarray], set[tuple[int, str, int]]]:
    """The corpus columns of one manifest run (segments concatenated, resumes marked).

    Returns:
        The columns, and ``(step, path, line)`` of every row (to check the labels' evidence).
    """
    parts: list[Rows] = []
    markers: list[np.ndarray] = []
    where: set[tuple[int, str, int]] = set()
    for segment in run["source"]["segments"]:
        data = read_source(run["source"], segment, mirrors, raw)
        rows = parse_log(data.decode("utf-8", errors="replace"), segment["format"])
        marker = np.full(len(rows.step), -1, dtype=np.int64)
        if segment.get("restart_from_step") is not None:
            marker[0] = int(segment["restart_from_step"])
        parts.append(rows)
        markers.append(marker)
        where |= {
            (int(st), segment["path"], int(ln)) for st, ln in zip(rows.step, rows.line, strict=True)
        }
    n = sum(len(p.step) for p in parts)
    name = run["name"]
    grad = np.concatenate([p.grad_norm for p in parts])
    skipped = np.zeros(n, dtype=np.int8)
    if run.get("amp_overflow_skipped"):
        skipped[np.isinf(grad)] = 1
    cols = {
        f"{name}/step": np.concatenate([p.step for p in parts]),
        f"{name}/loss": np.concatenate([p.loss for p in parts]),
        f"{name}/grad_norm": grad,
        f"{name}/step_time_s": np.concatenate([p.step_time_s for p in parts]),
        f"{name}/tokens": np.full(n, int(run.get("tokens_per_step") or 0), dtype=np.int64),
        f"{name}/restart_from": np.concatenate(markers),
        f"{name}/skipped": skipped,
    }
    return cols, where


def benign_spike_steps(step: np.ndarray, loss: np.ndarray) -> list[int]:
    """The manifest's mechanical rule for ``benign_spike`` labels, applied to one run.

    A row is a candidate when its loss is at least `BENIGN_SPIKE_RATIO` times the median of
    the `WINDOW` rows before it; a candidate within `BENIGN_SPIKE_GAP` rows of the previous
    labelled one belongs to it. (That each came back alone is read in the log and said in the
    label's note; the rule only finds them.)
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = loss / trailing_median(loss, WINDOW)
    out: list[int] = []
    last = -(10**9)
    for row in np.flatnonzero(ratio >= BENIGN_SPIKE_RATIO):
        if row - last <= BENIGN_SPIKE_GAP:
            continue
        out.append(int(step[row]))
        last = int(row)
    return out


def label_problems(
    run: Mapping[str, Any], cols: Mapping[str, np.ndarray], where: set[tuple[int, str, int]]
) -> list[str]:
    """What is wrong with a run's labels: evidence lines that do not hold their step, and
    ``benign_spike`` labels other than the rule's."""
    name = run["name"]
    found: list[str] = []
    labelled = []
    for inc in run.get("incidents", ()):
        ev = inc["evidence"]
        if (int(inc["step"]), ev["path"], int(ev["line"])) not in where:
            found.append(f"{name}: step {inc['step']} is not at {ev['path']}:{ev['line']}")
        if inc["kind"] == "benign_spike":
            labelled.append(int(inc["step"]))
    rule = benign_spike_steps(cols[f"{name}/step"], cols[f"{name}/loss"])
    if sorted(labelled) != rule:
        found.append(f"{name}: benign_spike labels {sorted(labelled)}, the rule finds {rule}")
    return found


def logs_grad_norm(run: Mapping[str, Any]) -> bool:
    """Every log format of the run prints the grad norm."""
    return all(FORMATS[seg["format"]].grad_norm for seg in run["source"]["segments"])


def manifest_sha256(path: Path = MANIFEST) -> str:
    """The sha256 of the manifest file's bytes (recorded in ``build.json``)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    """The committed manifest."""
    return dict(json.loads(path.read_text()))


@dataclass(frozen=True)
class BuildReport:
    """What a build did.

    Attributes:
        built: Rows per run built.
        not_built: Why, per run not built.
        label_problems: Labels that do not match the logs (the corpus is written anyway).
    """

    built: dict[str, int]
    not_built: dict[str, str]
    label_problems: list[str]


def build(
    mirrors: Path, raw: Path, out: Path, only: set[str] | None = None, manifest: Path = MANIFEST
) -> BuildReport:
    """Build the corpus (the runs whose sources are available) and check the labels."""
    runs = [r for r in load_manifest(manifest)["runs"] if not only or r["name"] in only]
    arrays: dict[str, np.ndarray] = {}
    built: dict[str, int] = {}
    missing: dict[str, str] = {}
    problems: list[str] = []
    for run in runs:
        try:
            cols, where = build_run(run, mirrors, raw)
        except (SourceMissing, BadLog) as exc:
            missing[run["name"]] = str(exc)
            continue
        problems += label_problems(run, cols, where)
        arrays.update(cols)
        built[run["name"]] = len(cols[f"{run['name']}/step"])
        if run.get("rows") is not None and built[run["name"]] != run["rows"]:
            missing[run["name"]] = f"parsed {built[run['name']]} rows, manifest says {run['rows']}"
            del built[run["name"]]
            for key in cols:
                del arrays[key]
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / CORPUS_FILE, **arrays)  # type: ignore[arg-type]
    info = {
        "manifest_sha256": manifest_sha256(manifest),
        "builder_version": BUILDER_VERSION,
        "rows": built,
        "not_built": missing,
        "label_problems": problems,
    }
    (out / BUILD_FILE).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    return BuildReport(built=built, not_built=missing, label_problems=problems)


def fetch_list(manifest: Path = MANIFEST) -> list[tuple[str, str]]:
    """``(repository, commit)`` of every source the manifest reads, once each."""
    seen: dict[str, str] = {}
    for run in load_manifest(manifest)["runs"]:
        seen.setdefault(run["source"]["repo"], run["source"]["commit"])
    return sorted(seen.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=Path, default=DEFAULT_MIRRORS, help="git copies")
    parser.add_argument("--raw", type=Path, default=DEFAULT_ROOT / "raw", help="single files")
    parser.add_argument("--out", type=Path, default=DEFAULT_ROOT, help="corpus directory")
    parser.add_argument("--only", nargs="*", default=None, help="build these runs only")
    parser.add_argument("--list", action="store_true", help="print the repositories to fetch")
    args = parser.parse_args()
    if args.list:
        for repo, commit in fetch_list():
            print(f"{repo} {commit}")
        return
    report = build(args.mirrors, args.raw, args.out, set(args.only or ()))
    built, missing = report.built, report.not_built
    for name, rows in built.items():
        print(f"built {name}: {rows} rows")
    for name, why in missing.items():
        print(f"NOT built {name}: {why}", file=sys.stderr)
    for problem in report.label_problems:
        print(f"label problem: {problem}", file=sys.stderr)
    print(
        json.dumps(
            {
                "bench": "llm_corpus",
                "out": str(args.out),
                "runs": len(built),
                "rows": sum(built.values()),
                "not_built": sorted(missing),
                "label_problems": len(report.label_problems),
            },
            sort_keys=True,
        )
    )
    if missing or report.label_problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
