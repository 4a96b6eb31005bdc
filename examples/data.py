"""A small deterministic byte-level corpus and a sampler that survives a change of world size.

The corpus is generated, not shipped: a tiny grammar expanded by a seeded ``random.Random``
(whose integer-seeded sequence is stable across CPython versions), so every rank, every
incarnation and every test sees the same bytes. Its SHA-256 is pinned in a unit test.

The sampler is a pure function of ``(seed, global position, world size, rank)``. Global
position ``g`` counts samples consumed by the whole gang since the run began; epoch
``g // n_samples`` shuffles the sample ids with ``numpy.random.default_rng([seed, epoch])``.
At a step starting at ``g`` with global batch ``B`` on ``W`` ranks, rank ``r`` takes the
positions ``g + r*B/W ... g + (r+1)*B/W - 1``. The whole gang always consumes
``[g, g + B)``, whatever ``W`` is, so a resume on another world size neither skips nor
repeats a sample as long as ``B`` stays fixed.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import numpy as np
import torch

from runwatch.schemas.events import LoaderState

VOCAB_SIZE = 256
"""Byte-level vocabulary: every byte value is a token."""

_SUBJECTS = (
    "the fox",
    "a heron",
    "the old miller",
    "my sister",
    "the small robot",
    "a crow",
    "the river",
    "our neighbour",
    "the clockmaker",
    "a tired dog",
)
_VERBS = (
    "watches",
    "carries",
    "paints",
    "follows",
    "forgets",
    "repairs",
    "counts",
    "finds",
    "sings to",
    "waits for",
)
_ADJECTIVES = ("green", "quiet", "broken", "golden", "heavy", "tiny", "distant", "warm")
_OBJECTS = (
    "lantern",
    "bridge",
    "letter",
    "garden",
    "wheel",
    "song",
    "window",
    "harbour",
    "basket",
    "mountain",
)
_ADVERBS = ("slowly", "again", "at dawn", "without a word", "every winter", "by the sea")


def generate_corpus(n_sentences: int = 3000, seed: int = 1234) -> bytes:
    """Expand the grammar into ASCII text; a pure function of its arguments.

    Args:
        n_sentences: Sentences to generate (about 45 bytes each).
        seed: Seed of the grammar's random choices.

    Returns:
        The corpus as bytes.
    """
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(n_sentences):
        words = [rng.choice(_SUBJECTS), rng.choice(_VERBS)]
        words.append(rng.choice(("the", "a", "one")))
        if rng.random() < 0.6:
            words.append(rng.choice(_ADJECTIVES))
        words.append(rng.choice(_OBJECTS))
        if rng.random() < 0.5:
            words.append(rng.choice(_ADVERBS))
        lines.append(" ".join(words) + rng.choice((".", ".", "!", "?")))
    return "\n".join(lines).encode("ascii")


@functools.lru_cache(maxsize=4)
def _epoch_permutation(seed: int, epoch: int, n_samples: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n_samples)


def sample_ids(seed: int, n_samples: int, global_start: int, count: int) -> list[int]:
    """Sample ids at global positions ``global_start .. global_start + count - 1``.

    Args:
        seed: Data seed (selects the per-epoch shuffles).
        n_samples: Samples per epoch.
        global_start: First global position.
        count: Number of positions.

    Returns:
        One sample id per position, in position order.
    """
    ids: list[int] = []
    for g in range(global_start, global_start + count):
        epoch, pos = divmod(g, n_samples)
        ids.append(int(_epoch_permutation(seed, epoch, n_samples)[pos]))
    return ids


def rank_positions(global_start: int, global_batch: int, world_size: int, rank: int) -> range:
    """The global positions rank ``rank`` consumes in a step that starts at ``global_start``.

    Args:
        global_start: Global position of the step's first sample.
        global_batch: Samples per step for the whole gang.
        world_size: Ranks in the gang; must divide ``global_batch``.
        rank: This rank.

    Returns:
        A contiguous range of ``global_batch // world_size`` positions.

    Raises:
        ValueError: If ``world_size`` does not divide ``global_batch``.
    """
    if global_batch % world_size:
        raise ValueError(f"global batch {global_batch} not divisible by world size {world_size}")
    per_rank = global_batch // world_size
    first = global_start + rank * per_rank
    return range(first, first + per_rank)


@dataclass(frozen=True)
class WindowDataset:
    """Fixed windows of ``seq_len + 1`` bytes, cut every ``seq_len`` bytes of the corpus.

    Attributes:
        corpus: The token stream (bytes).
        seq_len: Tokens per input sequence.
        seed: Data seed for the sampler.
    """

    corpus: bytes
    seq_len: int
    seed: int

    @functools.cached_property
    def _tokens(self) -> torch.Tensor:
        return torch.frombuffer(bytearray(self.corpus), dtype=torch.uint8).long()

    @property
    def n_samples(self) -> int:
        """Windows per epoch."""
        return (len(self.corpus) - 1) // self.seq_len

    def batch(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets for the given sample ids.

        Args:
            ids: Sample ids.

        Returns:
            ``(x, y)``, both ``long`` of shape ``(len(ids), seq_len)``.
        """
        rows = torch.stack(
            [self._tokens[i * self.seq_len : i * self.seq_len + self.seq_len + 1] for i in ids]
        )
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def rank_batch(
        self, global_start: int, global_batch: int, world_size: int, rank: int
    ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """This rank's slice of the global batch that starts at ``global_start``.

        Args:
            global_start: Global position of the step's first sample.
            global_batch: Samples per step for the whole gang.
            world_size: Ranks in the gang.
            rank: This rank.

        Returns:
            ``(sample ids, x, y)``.
        """
        pos = rank_positions(global_start, global_batch, world_size, rank)
        ids = sample_ids(self.seed, self.n_samples, pos.start, len(pos))
        x, y = self.batch(ids)
        return ids, x, y

    def loader_state(
        self, *, global_sample: int, step: int, world_size: int, rank: int
    ) -> LoaderState:
        """The loader position of one rank after ``step`` steps, as the event schema has it.

        ``batch_idx`` counts the batches this rank's loader produced since the run began
        (one per optimizer step), so it equals ``step``; ``global_sample`` is what a resume
        actually uses.

        Args:
            global_sample: Samples consumed by the gang so far.
            step: Optimizer steps completed.
            world_size: Ranks in the gang.
            rank: The rank.

        Returns:
            The rank's `LoaderState`.
        """
        return LoaderState(
            seed=self.seed,
            epoch=global_sample // self.n_samples,
            rank=rank,
            world_size=world_size,
            batch_idx=step,
            global_sample=global_sample,
        )
