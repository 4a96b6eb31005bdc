"""The LLM-corpus builder: log formats, blob-checked sources, resumes, the committed manifest.

Every log here is written by the test (a few lines in each format); no fetched data.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from pathlib import Path

import llm_corpus
import numpy as np
import pytest

MANIFEST = json.loads(llm_corpus.MANIFEST.read_text())

LINES = {
    "build_nanogpt_stdout": [
        "using fused AdamW: True",
        "step     0 | loss: 10.950000 | lr 8.0000e-07 | norm: 15.0000 | dt: 2000.00ms | tok/sec: 1.0",
        "validation loss: 10.9",
        "2024-01-01 00:00:00,000 train.py step     1 | loss: 10.900000 | lr 1.0e-06 | norm: 14.5000 | dt: 410.50ms | tok/sec: 2.0",
        "step     2 | loss: nan | lr 2.0e-06 | norm: inf | dt: 400.00ms | tok/sec: 3.0",
    ],
    "build_nanogpt_pipes": [
        "step 0 || loss: 10.9500 || norm: 15.0000 || elapsed_time: dt=2000.0000ms || tok/sec: 1.0",
        "step 1 || loss: 10.9000 || norm: 14.5000 || elapsed_time: dt=410.5000ms || tok/sec: 2.0",
        "step 2 || loss: nan || norm: inf || elapsed_time: dt=400.0000ms || tok/sec: 3.0",
    ],
    "build_nanogpt_logtxt": ["0 val 10.9", "0 train 10.950000", "1 train 10.900000", "2 train nan"],
    "llmc_main": [
        "s:0 tel:11.0",
        "s:0 trl:10.9500 lr:0.000001 norm:15.00",
        "s:1 trl:10.9000 lr:0.000002 norm:14.50",
        "s:2 trl:nan lr:0.000003 norm:inf",
    ],
    "llmc_stdout": [
        "| device | GPU |",
        "step    0/9 | loss 10.950000 (+nanz)| norm 15.0000 (+nanz)| lr 8.57e-07 | 2000.00 ms | 30% bf16 MFU | 1 tok/s",
        "step    1/9 | loss 10.900000 (+1.0z)| norm 14.5000 (-0.2z)| lr 1.71e-06 | 410.50 ms | 30% bf16 MFU | 1 tok/s",
        "step    2/9 | loss     nan (+nanz)| norm    inf (+nanz)| lr 2.57e-06 | 400.00 ms | 30% bf16 MFU | 1 tok/s",
        "step    3/9 | loss     nan (+nanz)|slurmstepd: error: *** JOB CANCELLED ***",
    ],
}


STEP_LINES = {
    "build_nanogpt_stdout": [2, 4, 5],
    "build_nanogpt_pipes": [1, 2, 3],
    "build_nanogpt_logtxt": [2, 3, 4],
    "llmc_main": [2, 3, 4],
    "llmc_stdout": [2, 3, 4],
}


@pytest.mark.parametrize("fmt", sorted(LINES))
def test_every_format_parses_its_steps(fmt: str) -> None:
    assert set(LINES) == set(llm_corpus.FORMATS)
    rows = llm_corpus.parse_log("\n".join(LINES[fmt]) + "\n", fmt)
    spec = llm_corpus.FORMATS[fmt]
    assert rows.step.tolist() == [0, 1, 2]  # a line cut short (cancelled job) is not a step
    assert rows.line.tolist() == STEP_LINES[fmt]
    assert rows.loss[:2].tolist() == [10.95, 10.9] and math.isnan(rows.loss[2])
    if spec.grad_norm:
        assert rows.grad_norm[:2].tolist() == [15.0, 14.5] and math.isinf(rows.grad_norm[2])
    else:
        assert np.isnan(rows.grad_norm).all()
    if spec.step_time:
        assert rows.step_time_s[1] == pytest.approx(0.4105)
    else:
        assert np.isnan(rows.step_time_s).all()


def test_a_log_whose_steps_go_back_is_a_clear_error() -> None:
    text = "0 train 3.0\n1 train 2.9\n1 train 2.8\n"
    with pytest.raises(llm_corpus.BadLog, match="step 1 at line 3 after step 1"):
        llm_corpus.parse_log(text, "build_nanogpt_logtxt")
    with pytest.raises(llm_corpus.BadLog, match="unknown log format"):
        llm_corpus.parse_log(text, "tensorboard")
    with pytest.raises(llm_corpus.BadLog, match="no llmc_main step lines"):
        llm_corpus.parse_log(text, "llmc_main")


def test_git_blob_id_is_what_git_computes(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0 train 3.0\n")
    out = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True)
    assert llm_corpus.git_blob_id(b"0 train 3.0\n") == out.stdout.strip()


def _git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t")
    env |= {
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def mirrors(tmp_path: Path) -> Path:
    """A plain git clone layout, <mirrors>/owner/name/.git, holding two log segments."""
    repo = tmp_path / "mirrors" / "someone" / "gpt"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "logs").mkdir()
    (repo / "logs" / "a.log").write_text(
        "".join(
            f"step {i:5d} | loss: {3.0 - i / 100:.6f} | lr 6e-04 | norm: "
            f"{'inf' if i == 3 else '0.3000'} | dt: 500.00ms | tok/sec: 1.0\n"
            for i in range(6)
        )
    )
    (repo / "logs" / "b.log").write_text(
        "loaded checkpoint\n"
        + "".join(
            f"step {i:5d} | loss: {2.9 - i / 100:.6f} | lr 6e-04 | norm: 0.3000 | "
            f"dt: 500.00ms | tok/sec: 1.0\n"
            for i in range(5, 9)
        )
    )
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "logs")
    return tmp_path / "mirrors"


def _manifest(mirrors: Path, tmp_path: Path, **run_extra: object) -> Path:
    repo = mirrors / "someone" / "gpt"
    commit = _git(repo, "rev-parse", "HEAD")
    blob = {p: _git(repo, "rev-parse", f"HEAD:logs/{p}") for p in ("a.log", "b.log")}
    run = {
        "name": "r1",
        "split": "tuning",
        "family": "build-nanogpt",
        "tokens_per_step": 1024,
        "source": {
            "repo": "someone/gpt",
            "commit": commit,
            "segments": [
                {"path": "logs/a.log", "blob": blob["a.log"], "format": "build_nanogpt_stdout"},
                {
                    "path": "logs/b.log",
                    "blob": blob["b.log"],
                    "format": "build_nanogpt_stdout",
                    "restart_from_step": 4,
                },
            ],
        },
        **run_extra,
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"runs": [run]}))
    return path


def test_build_reads_blob_checked_segments_and_marks_the_resume(
    mirrors: Path, tmp_path: Path
) -> None:
    manifest = _manifest(mirrors, tmp_path, amp_overflow_skipped=True, rows=10)
    out = tmp_path / "corpus"
    report = llm_corpus.build(mirrors, tmp_path / "raw", out, manifest=manifest)
    assert (report.built, report.not_built, report.label_problems) == ({"r1": 10}, {}, [])
    with np.load(out / llm_corpus.CORPUS_FILE) as data:
        assert data["r1/step"].tolist() == [0, 1, 2, 3, 4, 5, 5, 6, 7, 8]
        assert data["r1/restart_from"].tolist() == [-1] * 6 + [4, -1, -1, -1]
        assert data["r1/skipped"].tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]  # the inf norm
        assert data["r1/tokens"].tolist() == [1024] * 10
        assert data["r1/step_time_s"].tolist() == [0.5] * 10
    info = json.loads((out / llm_corpus.BUILD_FILE).read_text())
    assert info["manifest_sha256"] == llm_corpus.manifest_sha256(manifest)
    assert info["rows"] == {"r1": 10}


def test_a_raw_copy_counts_only_when_its_bytes_are_the_blob(mirrors: Path, tmp_path: Path) -> None:
    manifest = _manifest(mirrors, tmp_path)
    raw = tmp_path / "raw" / "someone+gpt" / "logs"
    raw.mkdir(parents=True)
    src = mirrors / "someone" / "gpt" / "logs"
    (raw / "a.log").write_bytes((src / "a.log").read_bytes())
    (raw / "b.log").write_bytes((src / "b.log").read_bytes() + b"edited\n")
    report = llm_corpus.build(
        tmp_path / "none", tmp_path / "raw", tmp_path / "o", manifest=manifest
    )
    missing = report.not_built
    assert report.built == {} and "logs/b.log" in missing["r1"] and "not found" in missing["r1"]
    (raw / "b.log").write_bytes((src / "b.log").read_bytes())
    report = llm_corpus.build(
        tmp_path / "none", tmp_path / "raw", tmp_path / "o", manifest=manifest
    )
    assert report.built == {"r1": 10} and report.not_built == {}


def test_a_row_count_other_than_the_manifests_is_not_built(mirrors: Path, tmp_path: Path) -> None:
    manifest = _manifest(mirrors, tmp_path, rows=11)
    report = llm_corpus.build(mirrors, tmp_path / "raw", tmp_path / "o", manifest=manifest)
    assert report.built == {} and report.not_built == {"r1": "parsed 10 rows, manifest says 11"}
    with np.load(tmp_path / "o" / llm_corpus.CORPUS_FILE) as data:
        assert data.files == []


def test_labels_are_checked_against_the_log(tmp_path: Path) -> None:
    loss = np.full(120, 3.0)
    loss[80] = 3.3  # 1.1x the trailing median: the benign-spike rule's
    loss[82] = 3.3  # within 3 rows of the last one: the same spike
    step = np.arange(120)
    assert llm_corpus.benign_spike_steps(step, loss) == [80]
    cols = {"r/step": step, "r/loss": loss}
    where = {(int(s), "a.log", int(s) + 10) for s in step}
    run = {
        "name": "r",
        "incidents": [
            {"kind": "benign_spike", "step": 80, "evidence": {"path": "a.log", "line": 90}}
        ],
    }
    assert llm_corpus.label_problems(run, cols, where) == []
    run["incidents"][0]["evidence"]["line"] = 91
    assert llm_corpus.label_problems(run, cols, where) == ["r: step 80 is not at a.log:91"]
    run["incidents"] = []
    assert llm_corpus.label_problems(run, cols, where) == [
        "r: benign_spike labels [], the rule finds [80]"
    ]


# ---- the committed manifest (no fetched data needed)


def test_the_manifest_names_every_source_exactly() -> None:
    hex40 = re.compile(r"^[0-9a-f]{40}$")
    names = [r["name"] for r in MANIFEST["runs"]]
    assert len(names) == len(set(names)) and len(names) >= 20
    for run in MANIFEST["runs"]:
        src = run["source"]
        assert hex40.match(src["commit"]) and "/" in src["repo"], run["name"]
        assert run["license"] and run["rows"] > 0 and run["split"] in {"tuning", "heldout"}
        for seg in src["segments"]:
            assert hex40.match(seg["blob"]) and seg["format"] in llm_corpus.FORMATS
        for inc in run.get("incidents", []):
            assert inc["kind"] in {"nonfinite", "divergence", "benign_spike", "healthy_resume"}
            assert inc["evidence"]["line"] > 0
            assert inc["evidence"]["path"] in {s["path"] for s in src["segments"]}
    for inc in MANIFEST["unreplayed_incidents"]:
        lo, hi = inc["source"]["lines"]
        assert 0 < lo <= hi and hex40.match(inc["source"]["commit"])


def test_the_split_holds_out_whole_families_and_owners() -> None:
    runs = MANIFEST["runs"]
    split_of_owner: dict[str, set[str]] = {}
    for run in runs:
        split_of_owner.setdefault(run["owner"], set()).add(run["split"])
    assert all(len(s) == 1 for s in split_of_owner.values()), split_of_owner
    llmc = {r["split"] for r in runs if r["family"] == "llm.c"}
    assert llmc == {"heldout"}
    held = sum(r["rows"] for r in runs if r["split"] == "heldout")
    assert 0.25 <= held / sum(r["rows"] for r in runs) <= 0.4


def test_fetch_list_names_each_repository_once() -> None:
    pairs = llm_corpus.fetch_list()
    assert (
        len(pairs)
        == len({r for r, _ in pairs})
        == len({r["source"]["repo"] for r in MANIFEST["runs"]})
    )
