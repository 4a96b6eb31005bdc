"""A tiny data-parallel fit on gloo with a runwatch callback, run as one rank of a gang.

Started by ``runwatch launch --nproc 2`` (torchrun's environment plus ``RUNWATCH_*``), so
the callback needs no arguments: its ranks come from the library's own distributed state,
the run and broker from the environment. ``--framework hf`` trains a GPT-2 built from a
config with the transformers Trainer; ``lightning`` a small module with Lightning's DDP.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
import torch

STEPS, SEQ, VOCAB = 4, 8, 61


def tokens(n: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))


def end_process_group() -> None:
    """Free and destroy the process group the framework made, so the rank exits clean.

    The transformers Trainer (accelerate) does not destroy its group, and gloo's threads
    still running when the interpreter tears the group down abort the rank now and then
    ("terminate called without an active exception", SIGABRT after the last step: a
    gang that is then dead, for a run that completed; docs/controller.md, "A clean exit
    must be clean"). `TorchDDPBackend.shutdown` destroys it and says on stderr when gloo
    threads outlive it.
    """
    import gc

    from runwatch.producers.backend import TorchDDPBackend

    gc.collect()  # the DDP wrapper sits in reference cycles
    TorchDDPBackend().shutdown()


def hf(out: Path) -> None:
    import transformers

    from runwatch.producers.callbacks.hf import RunwatchTrainerCallback

    class Data(torch.utils.data.Dataset):
        ids = tokens(32)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2
    )
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        ddp_backend="gloo",
    )
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=Data(),
        callbacks=[RunwatchTrainerCallback()],
    )
    trainer.train()
    assert trainer.args.world_size == 2, trainer.args.world_size
    del trainer  # the Trainer holds the DDP model, and the model its process group
    end_process_group()


def lightning(out: Path) -> None:
    import lightning.pytorch as pl

    from runwatch.producers.callbacks.lightning import RunwatchLightningCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB)
            )

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            (ids,) = batch
            logits = self.net(ids[:, :-1])
            return torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1)
            )

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=int(os.environ["WORLD_SIZE"]),
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out),
        callbacks=[RunwatchLightningCallback()],
    )
    data = torch.utils.data.TensorDataset(tokens(32))
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=2))
    assert trainer.world_size == 2, trainer.world_size
    del trainer
    end_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=("hf", "lightning"), required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    (hf if a.framework == "hf" else lightning)(a.out)
