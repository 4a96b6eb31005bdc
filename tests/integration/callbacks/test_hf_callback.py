"""`RunwatchTrainerCallback` in a real `transformers.Trainer`: a tiny GPT-2 built from its
config, six steps on CPU, events read back from the session broker."""

from __future__ import annotations

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

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.integration

SEQ, BATCH, STEPS, VOCAB = 16, 2, 6, 97


class Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_trainer_callback_reports_steps_heartbeats_checkpoints_and_end(
    tmp_path: Path, kafka_bootstrap: str, topic_prefix: str, make_topics: Any
) -> None:
    from runwatch.producers.callbacks.hf import RunwatchTrainerCallback

    make_topics(topic_prefix)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=1, n_head=2
    )
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-3,
        logging_steps=1,
        logging_nan_inf_filter=False,
        save_strategy="steps",
        save_steps=3,
        include_num_input_tokens_seen=True,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    callback = RunwatchTrainerCallback(
        run_id="hf-run",
        bootstrap=kafka_bootstrap,
        topic_prefix=topic_prefix,
        peak_flops_per_s_per_rank=1e12,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(64), callbacks=[callback]
    )
    trainer.train()
    assert callback.reporter is None  # closed at on_train_end, after delivering

    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["step"] for h in logged] == list(range(1, STEPS + 1))
    topics = names(topic_prefix)

    runs = read_all(kafka_bootstrap, topics.runs)
    assert [type(e) for e in runs] == [RunStarted, RunEnded]
    started, ended = runs
    assert started.run_id == "hf-run" and started.world_size == 1
    assert started.flop_config is not None
    assert (started.flop_config.n_layer, started.flop_config.n_head) == (1, 2)
    assert (started.flop_config.d_model, started.flop_config.seq_len) == (32, SEQ)
    assert started.vocab_size == VOCAB and started.dtype == "fp32"
    assert started.peak_flops_per_s == 1e12 and started.tags["framework"] == "transformers"
    assert ended.status == "completed" and ended.final_step == STEPS

    steps = [e for e in read_all(kafka_bootstrap, topics.steps) if isinstance(e, StepCompleted)]
    assert [s.step for s in steps] == list(range(1, STEPS + 1))
    assert [s.loss for s in steps] == [h["loss"] for h in logged]  # exactly what HF logged
    assert [s.grad_norm for s in steps] == [h["grad_norm"] for h in logged]
    assert [s.lr for s in steps] == [h["learning_rate"] for h in logged]
    assert all(s.tokens == BATCH * SEQ and s.examples == BATCH for s in steps)
    assert all(s.step_time_s > 0 and s.rank == 0 for s in steps)
    assert all(s.restart_from_step is None for s in steps)

    beats = [e for e in read_all(kafka_bootstrap, topics.heartbeats) if isinstance(e, Heartbeat)]
    assert [(b.rank, b.step) for b in beats] == [(0, s) for s in range(1, STEPS + 1)]

    ckpts = read_all(kafka_bootstrap, topics.checkpoints)
    assert [(c.step, Path(c.path).name) for c in ckpts if isinstance(c, CheckpointCommitted)] == [
        (3, "checkpoint-3"),
        (6, "checkpoint-6"),
    ]
    assert all(Path(c.path).is_dir() and c.size_bytes > 0 for c in ckpts)
