"""bench/real_curves.py records deterministically: re-recording a curve gives the corpus.

On the machine type that recorded it, bit for bit. Elsewhere torch's CPU kernels (chosen by
the instruction set: AVX2, AVX512) round the last bit differently now and then: measured on
an AVX512 box against the corpus, at most 8e-7 relative over 1,200 steps. So the check is
to `RTOL` relative, with non-finite values at the very same steps.
"""

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


RTOL = 1e-5


def assert_same_curve(got: np.ndarray, recorded: np.ndarray) -> None:
    assert np.array_equal(np.isfinite(got), np.isfinite(recorded))
    np.testing.assert_allclose(got, recorded, rtol=RTOL, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", ["mlp-sgd-s2", "f-mlp-nan-s2"])
def test_rerecording_reproduces_the_corpus(name: str) -> None:
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    if torch.__version__ not in manifest["made_by"]:
        pytest.skip(f"corpus recorded with another torch ({manifest['made_by']})")
    rc = _recorder()
    curve = next(c for c in rc.CURVES if c.name == name)
    got = rc.train(curve)
    with np.load(CORPUS / "curves.npz") as data:
        assert_same_curve(np.asarray(got.loss, np.float32), data[f"{name}/loss"])
        assert_same_curve(np.asarray(got.grad_norm, np.float32), data[f"{name}/grad_norm"])
        assert np.array_equal(np.asarray(got.restart_from), data[f"{name}/restart_from"])


def test_the_manifest_lists_every_recorded_curve() -> None:
    rc = _recorder()
    manifest = json.loads((CORPUS / "manifest.json").read_text())
    assert [c["name"] for c in manifest["curves"]] == [c.name for c in rc.CURVES]
    assert sum(p.stat().st_size for p in CORPUS.iterdir()) < 2_000_000
