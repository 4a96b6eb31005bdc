from __future__ import annotations

import hashlib

import pytest

from examples.data import WindowDataset, generate_corpus, rank_positions, sample_ids

pytestmark = pytest.mark.torch

CORPUS_SHA256 = "c5b842a3b78455a793a973e3235daaaba89f997a9064ee8bf6da013a47095d2b"


def test_corpus_is_pinned():
    corpus = generate_corpus()
    assert hashlib.sha256(corpus).hexdigest() == CORPUS_SHA256
    assert set(corpus) <= set(range(32, 127)) | {10}


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_ranks_partition_the_global_batch_whatever_the_world_size(world_size):
    data = WindowDataset(generate_corpus(), seq_len=64, seed=7)
    gang = [i for r in range(world_size) for i in data.rank_batch(48, 16, world_size, r)[0]]
    assert gang == sample_ids(7, data.n_samples, 48, 16)


def test_positions_are_contiguous_per_rank():
    assert rank_positions(32, 16, 4, 2) == range(40, 44)
    with pytest.raises(ValueError, match="divisible"):
        rank_positions(0, 16, 3, 0)


def test_each_epoch_is_a_permutation_and_epochs_differ():
    n = 50
    first, second = sample_ids(1, n, 0, n), sample_ids(1, n, n, n)
    assert sorted(first) == sorted(second) == list(range(n))
    assert first != second
    assert sample_ids(1, n, 45, 10) == first[45:] + second[:5]
    assert sample_ids(2, n, 0, n) != first


def test_batches_are_next_token_pairs():
    data = WindowDataset(generate_corpus(), seq_len=8, seed=0)
    x, y = data.batch([0, 3])
    assert x.shape == y.shape == (2, 8)
    assert bytes(x[1].tolist()) == generate_corpus()[24:32]
    assert (x[:, 1:] == y[:, :-1]).all()


def test_loader_state_is_global():
    data = WindowDataset(generate_corpus(), seq_len=64, seed=7)
    state = data.loader_state(global_sample=data.n_samples + 3, step=9, world_size=2, rank=1)
    assert (state.epoch, state.batch_idx, state.global_sample) == (1, 9, data.n_samples + 3)
