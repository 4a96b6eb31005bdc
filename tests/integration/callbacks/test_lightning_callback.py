"""`RunwatchLightningCallback` in a real Lightning `Trainer`: a tiny causal LM module, six
optimizer steps on CPU (one run with gradient accumulation), events read back from Kafka."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from runwatch.schemas.events import (
    CheckpointCommitted,
    Heartbeat,
    RunEnded,
    RunStarted,
    StepCompleted,
)
from runwatch.schemas.topics import names

from .conftest import read_all

L = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.integration

SEQ, BATCH, VOCAB, WIDTH = 8, 2, 50, 16


class TinyLM(L.LightningModule):  # type: ignore[misc]
    """A one-block causal LM with a GPT-style shape on itself (n_layer, n_head, n_embd)."""

    n_layer, n_head, n_embd, vocab_size = 1, 2, WIDTH, VOCAB

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.block = torch.nn.TransformerEncoderLayer(WIDTH, 2, 32, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(WIDTH, VOCAB)
        self.losses: list[float] = []
        self.norms: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (ids,) = batch
        mask = torch.nn.Transformer.generate_square_subsequent_mask(SEQ - 1)
        logits = self.head(self.block(self.embed(ids[:, :-1]), src_mask=mask, is_causal=True))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        self.losses.append(float(loss.detach()))
        return loss

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.norms.append(float(torch.nn.utils.get_total_norm(grads)))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _fit(tmp_path: Path, bootstrap: str, prefix: str, run_id: str, accumulate: int) -> TinyLM:
    from runwatch.producers.callbacks.lightning import RunwatchLightningCallback

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randint(0, VOCAB, (64, SEQ)))
    module = TinyLM()
    trainer = L.Trainer(
        max_steps=6,
        accelerator="cpu",
        devices=1,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=0.01,  # clips hard: the reported norm must be the one before
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[
            L.callbacks.ModelCheckpoint(
                dirpath=str(tmp_path / "ckpt"), every_n_train_steps=3, save_top_k=-1
            ),
            RunwatchLightningCallback(
                run_id=run_id,
                bootstrap=bootstrap,
                topic_prefix=prefix,
                seq_len=SEQ - 1,
                tokens_per_step=BATCH * (SEQ - 1) * accumulate,
            ),
        ],
    )
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=BATCH))
    return module


def test_lightning_callback_reports_steps_heartbeats_checkpoints_and_end(
    tmp_path: Path, kafka_bootstrap: str, topic_prefix: str, make_topics: Any
) -> None:
    make_topics(topic_prefix)
    module = _fit(tmp_path, kafka_bootstrap, topic_prefix, "pl-run", accumulate=1)
    topics = names(topic_prefix)

    runs = read_all(kafka_bootstrap, topics.runs)
    assert [type(e) for e in runs] == [RunStarted, RunEnded]
    started, ended = runs
    assert started.world_size == 1 and started.tags["framework"] == "lightning"
    assert started.flop_config is not None
    cfg = started.flop_config
    assert (cfg.n_layer, cfg.n_head, cfg.d_model, cfg.seq_len) == (1, 2, WIDTH, SEQ - 1)
    assert started.vocab_size is None or started.vocab_size == VOCAB
    assert ended.status == "completed" and ended.final_step == 6

    steps = [e for e in read_all(kafka_bootstrap, topics.steps) if isinstance(e, StepCompleted)]
    assert [s.step for s in steps] == [1, 2, 3, 4, 5, 6]
    assert [s.loss for s in steps] == module.losses  # what training_step returned
    assert [s.grad_norm for s in steps] == pytest.approx(module.norms, rel=1e-6)
    assert all(n > 0.01 for n in module.norms)  # so these are norms before the clip
    assert all(s.lr == 0.05 and s.tokens == BATCH * (SEQ - 1) for s in steps)

    beats = [e for e in read_all(kafka_bootstrap, topics.heartbeats) if isinstance(e, Heartbeat)]
    assert [(b.rank, b.step) for b in beats] == [(0, s) for s in range(1, 7)]

    ckpts = [c for c in read_all(kafka_bootstrap, topics.checkpoints)]
    assert all(isinstance(c, CheckpointCommitted) for c in ckpts)
    assert [c.step for c in ckpts] == [3, 6]
    assert all(
        Path(c.path).is_file() and c.size_bytes == Path(c.path).stat().st_size for c in ckpts
    )
    assert all(f"step={c.step}" in Path(c.path).name for c in ckpts)


def test_lightning_callback_averages_the_microbatches_of_a_step(
    tmp_path: Path, kafka_bootstrap: str, topic_prefix: str, make_topics: Any
) -> None:
    make_topics(topic_prefix)
    module = _fit(tmp_path, kafka_bootstrap, topic_prefix, "pl-accum", accumulate=2)
    steps = [
        e
        for e in read_all(kafka_bootstrap, names(topic_prefix).steps)
        if isinstance(e, StepCompleted)
    ]
    assert [s.step for s in steps] == [1, 2, 3, 4, 5, 6]
    assert len(module.losses) == 12
    pairs = [(module.losses[2 * i] + module.losses[2 * i + 1]) / 2 for i in range(6)]
    assert [s.loss for s in steps] == pytest.approx(pairs, rel=1e-6)
    assert all(s.accumulation_steps == 2 and not math.isnan(s.loss) for s in steps)
