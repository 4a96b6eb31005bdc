"""Record a corpus of real training curves (healthy and with real faults) on one CPU core.

Every curve is a real training of a tiny model with torch: a transformer LM (the project's
`examples.tinylm.TinyLM` on `examples.data`'s corpus, one configuration exactly as
``examples/train_ddp.py`` defaults), an MLP on Gaussian clusters, a CNN on generated
16x16 images, and a character LSTM; AdamW or SGD with momentum, several learning rates,
with and without warmup, cosine decay and grad-norm clipping. Per step it records the loss,
the grad norm before clipping (`producers.torch_helpers.grad_norm`, as producers report it),
the step time, the tokens (or examples) of the step and the restart marker.

Faults are made by real means in separate runs of a configuration:

* ``garbage_batch``: at step S the batch is garbage (random targets and, for images,
  inputs scaled x50);
* ``lr_blowup``: from step S the learning rate is 100 times the schedule's;
* ``nan_loss``: at step S the loss is computed through ``log`` of a probability forced to 0
  (an LM) or on an input holding ``inf`` (the classifiers): the loss is non-finite, the
  update is skipped (as ``--skip-nonfinite`` does) and training goes on;
* ``resume_no_optimizer``: model and optimizer state are saved after step S; the run goes on
  to S+40, "crashes", and resumes from the save with the model but a fresh optimizer; its
  first step carries ``restart_from_step=S`` as producers mark it. ``good_resume`` is the
  control: the same resume with the optimizer state (no fault, nothing should fire).

Determinism: seeded models and data (every batch is a pure function of seed and step, so a
resume redoes the same batches), one thread, ``torch.use_deterministic_algorithms``. Loss and
grad norm are float32 tensors in torch and are stored as float32, so they are exact; the
step time is measured wall time, the one column that is not reproducible (no step-health
detector reads it).

The split into tuning and held-out curves is fixed in `CURVES` (and the manifest): held-out
curves use other seeds, and the LSTM family only appears there.

    .venv/bin/python bench/real_curves.py [--out bench/data/real_curves] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from examples.data import VOCAB_SIZE, WindowDataset, generate_corpus
from examples.tinylm import TinyLM, TinyLMConfig
from runwatch.producers.torch_helpers import grad_norm

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "real_curves"
RESUME_CRASH_AFTER = 40
"""A resume fault's run goes this many steps past the save before it "crashes"."""


@dataclass(frozen=True)
class Curve:
    """How one curve is made (this is what the manifest records).

    Attributes:
        name: Unique name, also the key in the corpus file.
        split: ``tuning`` or ``heldout``.
        family: ``lm`` (TinyLM), ``mlp``, ``cnn`` or ``lstm``.
        optimizer: ``adamw`` or ``sgd`` (momentum 0.9).
        lr: Peak learning rate.
        warmup: Linear warmup steps (0: none).
        schedule: ``const`` or ``cosine`` (decay to 10 % of the peak at ``steps``).
        clip: Grad-norm clip (0: none).
        seed: Model init and data seed.
        steps: Steps trained (a resume redoes some on top).
        fault: None (healthy), or the fault's kind.
        fault_step: S: the step the fault is made at (a resume: the step saved after).
        size: ``small`` or ``ddp`` (the LM exactly as ``examples/train_ddp.py`` defaults).
    """

    name: str
    split: str
    family: str
    optimizer: str
    lr: float
    warmup: int = 0
    schedule: str = "const"
    clip: float = 0.0
    seed: int = 0
    steps: int = 1200
    fault: str | None = None
    fault_step: int | None = None
    size: str = "small"


def _c(name: str, split: str, family: str, opt: str, lr: float, **kw: Any) -> Curve:
    return Curve(name=name, split=split, family=family, optimizer=opt, lr=lr, **kw)


T, H = "tuning", "heldout"
CURVES: tuple[Curve, ...] = (
    # ---- tuning: healthy (lm, mlp, cnn; seeds 0 and 1)
    _c("lm-ddp-s0", T, "lm", "adamw", 2e-3, warmup=20, clip=1.0, seed=0, size="ddp"),
    _c("lm-adamw-s0", T, "lm", "adamw", 3e-3, warmup=50, schedule="cosine", clip=1.0, seed=0),
    _c("lm-adamw-noclip-s1", T, "lm", "adamw", 1e-3, seed=1),
    _c("lm-sgd-s0", T, "lm", "sgd", 0.3, warmup=100, clip=1.0, seed=0),
    _c("mlp-adamw-s0", T, "mlp", "adamw", 1e-3, seed=0),
    _c("mlp-sgd-s1", T, "mlp", "sgd", 0.05, warmup=50, schedule="cosine", clip=1.0, seed=1),
    _c("mlp-adamw-clip-s1", T, "mlp", "adamw", 3e-3, warmup=100, clip=0.5, seed=1),
    _c("cnn-sgd-s0", T, "cnn", "sgd", 0.02, seed=0),
    _c("cnn-adamw-s1", T, "cnn", "adamw", 2e-3, warmup=50, schedule="cosine", clip=1.0, seed=1),
    # ---- tuning: faults
    _c("f-lm-garbage-s0", T, "lm", "adamw", 2e-3, warmup=20, clip=1.0, seed=0,
       steps=900, fault="garbage_batch", fault_step=700),
    _c("f-cnn-garbage-s1", T, "cnn", "sgd", 0.02, seed=1, steps=900,
       fault="garbage_batch", fault_step=650),
    _c("f-mlp-lr-s1", T, "mlp", "adamw", 1e-3, seed=1, steps=800,
       fault="lr_blowup", fault_step=700),
    _c("f-lm-lr-s1", T, "lm", "sgd", 0.3, warmup=100, clip=1.0, seed=1, steps=800,
       fault="lr_blowup", fault_step=700),
    _c("f-cnn-nan-s0", T, "cnn", "adamw", 2e-3, warmup=50, clip=1.0, seed=0, steps=900,
       fault="nan_loss", fault_step=600),
    _c("f-lm-nan-s1", T, "lm", "adamw", 1e-3, seed=1, steps=900,
       fault="nan_loss", fault_step=650),
    _c("f-lm-resume-s1", T, "lm", "adamw", 2e-3, warmup=20, clip=1.0, seed=1, steps=900,
       fault="resume_no_optimizer", fault_step=600),
    _c("f-mlp-resume-s0", T, "mlp", "adamw", 1e-3, seed=0, steps=900,
       fault="resume_no_optimizer", fault_step=600),
    _c("f-lm-goodresume-s0", T, "lm", "adamw", 2e-3, warmup=20, clip=1.0, seed=0, steps=900,
       fault="good_resume", fault_step=600),
    # ---- held-out: healthy (other seeds; the lstm family is never tuned on)
    _c("lm-ddp-s2", H, "lm", "adamw", 2e-3, warmup=20, clip=1.0, seed=2, size="ddp"),
    _c("lm-adamw-s3", H, "lm", "adamw", 2e-3, warmup=20, schedule="cosine", clip=1.0, seed=3),
    _c("mlp-sgd-s2", H, "mlp", "sgd", 0.1, seed=2),
    _c("cnn-adamw-s3", H, "cnn", "adamw", 1e-3, seed=3),
    _c("lstm-adamw-s2", H, "lstm", "adamw", 3e-3, clip=1.0, seed=2),
    _c("lstm-sgd-s3", H, "lstm", "sgd", 1.0, warmup=50, clip=0.25, seed=3),
    _c("lstm-adamw-noclip-s3", H, "lstm", "adamw", 1e-3, warmup=50, schedule="cosine", seed=3),
    # ---- held-out: faults
    _c("f-lstm-garbage-s2", H, "lstm", "adamw", 3e-3, clip=1.0, seed=2, steps=900,
       fault="garbage_batch", fault_step=700),
    _c("f-mlp-garbage-s3", H, "mlp", "sgd", 0.1, seed=3, steps=900,
       fault="garbage_batch", fault_step=600),
    _c("f-lstm-lr-s3", H, "lstm", "sgd", 1.0, warmup=50, clip=0.25, seed=3, steps=800,
       fault="lr_blowup", fault_step=650),
    _c("f-cnn-lr-s2", H, "cnn", "adamw", 1e-3, seed=2, steps=800,
       fault="lr_blowup", fault_step=600),
    _c("f-lstm-nan-s2", H, "lstm", "adamw", 3e-3, clip=1.0, seed=2, steps=900,
       fault="nan_loss", fault_step=700),
    _c("f-mlp-nan-s2", H, "mlp", "sgd", 0.1, seed=2, steps=900,
       fault="nan_loss", fault_step=500),
    _c("f-lstm-resume-s3", H, "lstm", "adamw", 1e-3, warmup=50, seed=3, steps=900,
       fault="resume_no_optimizer", fault_step=600),
    _c("f-lm-resume-s2", H, "lm", "adamw", 2e-3, warmup=20, clip=1.0, seed=2, steps=900,
       fault="resume_no_optimizer", fault_step=650, size="ddp"),
    _c("f-lstm-goodresume-s2", H, "lstm", "adamw", 3e-3, clip=1.0, seed=2, steps=900,
       fault="good_resume", fault_step=600),
)  # fmt: skip


# --------------------------------------------------------------------------- tasks


@dataclass
class Task:
    """A model with its batch source: ``batch(step)`` is a pure function of seed and step."""

    model: nn.Module
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    tokens_per_step: int
    n_classes: int
    vocab_size: int | None = None
    garbage: Callable[[torch.Tensor, torch.Tensor, torch.Generator], Any] = field(default=None)  # type: ignore[assignment]


def _gen(seed: int, step: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step * 7919 + salt)


def _label_noise(y: torch.Tensor, classes: int, g: torch.Generator) -> torch.Tensor:
    """10 % of the labels replaced by random ones: the loss has a floor, as real data has."""
    flip = torch.rand(y.shape, generator=g) < 0.1
    return torch.where(flip, torch.randint(0, classes, y.shape, generator=g), y)


class CharLSTM(nn.Module):
    """Embedding, one LSTM layer, a linear head over bytes."""

    def __init__(self, vocab: int = VOCAB_SIZE, d: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, time, vocab)``."""
        out, _ = self.lstm(self.emb(idx))
        return self.head(out)


def _lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def _cls_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y)


def make_task(c: Curve) -> Task:
    """The model and data of a curve's family (seeded by the curve's seed)."""
    torch.manual_seed(c.seed)
    if c.family in ("lm", "lstm"):
        seq_len, batch = (64, 16) if c.size == "ddp" else (32, 8)
        data = WindowDataset(generate_corpus(), seq_len, c.seed)
        model: nn.Module
        if c.family == "lm":
            d = 64 if c.size == "ddp" else 32
            model = TinyLM(TinyLMConfig(vocab_size=VOCAB_SIZE, seq_len=seq_len, d_model=d))
        else:
            model = CharLSTM()

        def lm_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            _, x, y = data.rank_batch((step - 1) * batch, batch, 1, 0)
            return x, y

        def lm_garbage(x: torch.Tensor, y: torch.Tensor, g: torch.Generator) -> Any:
            return x, torch.randint(0, VOCAB_SIZE, y.shape, generator=g)

        return Task(model, lm_batch, _lm_loss, batch * seq_len, VOCAB_SIZE, VOCAB_SIZE, lm_garbage)
    if c.family == "mlp":
        dim, classes, batch = 32, 10, 32
        centres = torch.randn(classes, dim, generator=_gen(c.seed, 0, 1)) * 0.4
        model = nn.Sequential(
            nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, classes)
        )

        def mlp_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            g = _gen(c.seed, step, 2)
            y = torch.randint(0, classes, (batch,), generator=g)
            x = centres[y] + torch.randn(batch, dim, generator=g)
            return x, _label_noise(y, classes, g)

        def cls_garbage(x: torch.Tensor, y: torch.Tensor, g: torch.Generator) -> Any:
            return x, torch.randint(0, classes, y.shape, generator=g)

        return Task(model, mlp_batch, _cls_loss, batch, classes, None, cls_garbage)
    if c.family == "cnn":
        classes, batch, side = 4, 32, 16
        grid = torch.arange(side, dtype=torch.float32)
        yy, xx = torch.meshgrid(grid, grid, indexing="ij")
        model = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 4 * 4, classes),
        )  # fmt: skip

        def cnn_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            g = _gen(c.seed, step, 3)
            y = torch.randint(0, classes, (batch,), generator=g)
            phase = torch.rand(batch, 1, 1, generator=g) * 6.283
            freq = 0.6 + 0.4 * torch.rand(batch, 1, 1, generator=g)
            pattern = torch.stack(
                [
                    torch.sin(freq * yy + phase),  # horizontal bars
                    torch.sin(freq * xx + phase),  # vertical bars
                    torch.sin(freq * (xx + yy) * 0.7 + phase),  # diagonal
                    torch.cos(freq * ((xx - 7.5) ** 2 + (yy - 7.5) ** 2).sqrt() + phase),  # rings
                ],
                dim=1,
            )  # (batch, classes, side, side)
            img = pattern[torch.arange(batch), y]
            img = img + 2.0 * torch.randn(batch, side, side, generator=g)
            return img.unsqueeze(1), _label_noise(y, classes, g)

        def img_garbage(x: torch.Tensor, y: torch.Tensor, g: torch.Generator) -> Any:
            return x * 50.0, torch.randint(0, classes, y.shape, generator=g)

        return Task(model, cnn_batch, _cls_loss, batch, classes, None, img_garbage)
    raise ValueError(f"unknown family {c.family!r}")


def make_optimizer(c: Curve, model: nn.Module) -> torch.optim.Optimizer:
    """AdamW (betas 0.9/0.95 as examples/train_ddp.py) or SGD with momentum 0.9."""
    if c.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=c.lr, betas=(0.9, 0.95), weight_decay=0.0)
    if c.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=c.lr, momentum=0.9)
    raise ValueError(f"unknown optimizer {c.optimizer!r}")


def lr_at(c: Curve, step: int) -> float:
    """The schedule: linear warmup, then constant or cosine to 10 % of the peak."""
    lr = c.lr * min(1.0, step / c.warmup) if c.warmup else c.lr
    if c.schedule == "cosine" and step > c.warmup:
        frac = (step - c.warmup) / max(1, c.steps - c.warmup)
        lr = c.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac))))
    if c.fault == "lr_blowup" and c.fault_step is not None and step >= c.fault_step:
        lr *= 100.0
    return lr


# --------------------------------------------------------------------------- training


@dataclass
class Recorded:
    """The columns of one curve, one row per reported step (redone steps included)."""

    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    step_time_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    restart_from: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)


def _nan_loss(task: Task, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A loss through ``log`` of a probability that is exactly 0 (LM families)."""
    probs = logits.flatten(0, 1).softmax(-1)
    target = y.flatten()
    mask = torch.ones_like(probs)
    mask[0, target[0]] = 0.0  # one target's probability forced to 0: log(0) = -inf
    picked = (probs * mask).gather(1, target[:, None]).squeeze(1)
    return -(picked.log()).mean()


def train(c: Curve) -> Recorded:
    """Train one curve and record it."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    task = make_task(c)
    model = task.model
    opt = make_optimizer(c, model)
    rec = Recorded()
    saved: tuple[dict[str, Any], dict[str, Any]] | None = None
    step, restart_marker = 0, -1
    resumed = False
    while step < c.steps:
        step += 1
        t0 = time.perf_counter()
        x, y = task.batch(step)
        if c.fault == "garbage_batch" and step == c.fault_step:
            x, y = task.garbage(x, y, _gen(c.seed, step, 99))
        if c.fault == "nan_loss" and step == c.fault_step and task.vocab_size is None:
            x = x.clone()
            x.view(x.shape[0], -1)[0, 0] = math.inf
        for group in opt.param_groups:
            group["lr"] = lr_at(c, step)
        logits = model(x)
        if c.fault == "nan_loss" and step == c.fault_step and task.vocab_size is not None:
            loss = _nan_loss(task, logits, y)
        else:
            loss = task.loss(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = grad_norm(model.parameters(), c.clip or None)
        skipped = not math.isfinite(gnorm)
        if not skipped:
            opt.step()
        dt = time.perf_counter() - t0
        rec.step.append(step)
        rec.loss.append(float(loss.item()))
        rec.grad_norm.append(gnorm)
        rec.step_time_s.append(dt)
        rec.tokens.append(task.tokens_per_step)
        rec.restart_from.append(restart_marker)
        rec.skipped.append(int(skipped))
        restart_marker = -1
        resuming = c.fault in ("resume_no_optimizer", "good_resume")
        if resuming and step == c.fault_step and not resumed:
            saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
        crash = resuming and saved is not None and not resumed
        if crash and step == (c.fault_step or 0) + RESUME_CRASH_AFTER:  # resume from S
            assert saved is not None
            model.load_state_dict(saved[0])
            opt = make_optimizer(c, model)
            if c.fault == "good_resume":
                opt.load_state_dict(saved[1])
            step, restart_marker, resumed = c.fault_step or 0, c.fault_step or 0, True
    return rec


def save(curves: list[tuple[Curve, Recorded]], out: Path) -> None:
    """Write ``curves.npz`` (float32 loss/grad norm: exact) and ``manifest.json``."""
    out.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    for c, r in curves:
        arrays[f"{c.name}/step"] = np.asarray(r.step, dtype=np.int32)
        arrays[f"{c.name}/loss"] = np.asarray(r.loss, dtype=np.float32)
        arrays[f"{c.name}/grad_norm"] = np.asarray(r.grad_norm, dtype=np.float32)
        arrays[f"{c.name}/step_time_s"] = np.asarray(r.step_time_s, dtype=np.float32)
        arrays[f"{c.name}/tokens"] = np.asarray(r.tokens, dtype=np.int32)
        arrays[f"{c.name}/restart_from"] = np.asarray(r.restart_from, dtype=np.int32)
        arrays[f"{c.name}/skipped"] = np.asarray(r.skipped, dtype=np.int8)
    np.savez_compressed(out / "curves.npz", **arrays)  # type: ignore[arg-type]
    manifest = {
        "made_by": f"bench/real_curves.py (torch {torch.__version__}, 1 thread, "
        "deterministic algorithms)",
        "columns": {
            "step": "step number (a resume redoes steps: not monotonic)",
            "loss": "training loss of the step (float32, exact)",
            "grad_norm": "global L2 grad norm before clipping (float32, exact)",
            "step_time_s": "measured wall time of the step (not reproducible)",
            "tokens": "tokens (LM) or examples (classifiers) of the step",
            "restart_from": "restart marker: the step resumed from on the first resumed "
            "step, -1 otherwise",
            "skipped": "1 when the update was skipped (non-finite grad norm)",
        },
        "faults": {
            "garbage_batch": "step S trains on random targets (images also scaled x50)",
            "lr_blowup": "from step S the learning rate is x100",
            "nan_loss": "step S: log of a zero probability (LM) or an inf input (classifiers)",
            "resume_no_optimizer": f"state saved after S; crash at S+{RESUME_CRASH_AFTER}; "
            "resume from S with the model but a fresh optimizer",
            "good_resume": "control: the same resume with the optimizer state (no fault)",
        },
        "split": "held-out curves use other seeds; the lstm family appears only there",
        "curves": [asdict(c) | {"rows": len(r.step)} for c, r in curves],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="*", help="record only these curves (not saved)")
    args = parser.parse_args()
    chosen = [c for c in CURVES if not args.only or c.name in args.only]
    done: list[tuple[Curve, Recorded]] = []
    t_all = time.perf_counter()
    for c in chosen:
        t0 = time.perf_counter()
        r = train(c)
        done.append((c, r))
        finite = [v for v in r.loss if math.isfinite(v)]
        print(
            f"{c.name:<24} {c.split:<8} {len(r.step):>5} rows  loss {finite[0]:.3f} -> "
            f"{finite[-1]:.3f}  grad median {float(np.median(r.grad_norm)):.3g}  "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    if args.only:
        print("--only: nothing saved")
        return
    save(done, args.out)
    size = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"{len(done)} curves in {time.perf_counter() - t_all:.0f} s -> {args.out} ({size} bytes)")


if __name__ == "__main__":
    main()
