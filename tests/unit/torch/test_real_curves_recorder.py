"""bench/real_curves.py records deterministically: re-recording a curve gives the corpus bits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "bench" / "data" / "real_curves"


def _recorder():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import real_curves  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return real_curves


@pytest.mark.parametrize("name", ["mlp-sgd-s2", "f-mlp-nan-s2"])
def test_rerecording_reproduces_the_corpus(name: str) -> None:
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    if torch.__version__ not in manifest["made_by"]:
        pytest.skip(f"corpus recorded with another torch ({manifest['made_by']})")
    rc = _recorder()
    curve = next(c for c in rc.CURVES if c.name == name)
    got = rc.train(curve)
    with np.load(CORPUS / "curves.npz") as data:
        assert np.array_equal(
            np.asarray(got.loss, np.float32), data[f"{name}/loss"], equal_nan=True
        )
        assert np.array_equal(
            np.asarray(got.grad_norm, np.float32), data[f"{name}/grad_norm"], equal_nan=True
        )
        assert np.array_equal(np.asarray(got.restart_from), data[f"{name}/restart_from"])


def test_the_manifest_lists_every_recorded_curve() -> None:
    rc = _recorder()
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    assert [c["name"] for c in manifest["curves"]] == [c.name for c in rc.CURVES]
    assert sum(p.stat().st_size for p in CORPUS.iterdir()) < 2_000_000
