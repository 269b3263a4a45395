"""``ssfl sanity METHOD``: a method's own parts trained centrally, as the original SSL papers do.

The parts come from the method's experiment file (``SANITY_METHODS``) with the dataset
swapped: its unlabeled loss (the client half's own, ``loss_of`` its settings), its weak
and strong views
(``tasks/augment.py``, the experiment's ``augment.weak_shift`` and RandAugment n, m), its
model (``model``) and its client optimizer (lr, momentum, Nesterov, weight decay). Each
step takes a labeled batch of B images and an unlabeled batch of mu * B images, in one
forward pass (FixMatch, Sohn et al. 2020, section 3 and Algorithm 1; self-training with
``algo.selftrain_labels: eval`` reads its pseudo-labels off a gradient-free eval-mode pass
of the weak view before it, as its users do), and minimises
L_s + lambda_u L_u; the rate follows FixMatch's cosine decay lr * cos(7 pi k / (16 K)).
The labeled set is ``labels_per_class`` images per class drawn from the training set,
the unlabeled set every other training image, the test set the whole test split.

Writes ``results.json`` (``final_test_accuracy`` as ``ssfl run``, the test accuracy at
every evaluation, and per block of steps the mean and largest gradient norm, the
losses, the mask rate and the accuracy of the kept pseudo-labels against the hidden
labels) and prints one line per block.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from client_app.uda import UDASettings
from ssfl.experiment import resolve_experiment
from ssfl.registry import method as method_of
from ssfl.registry import settings_of
from tasks.augment import StrongAugment, WeakAugment
from tasks.config import ConfigError
from tasks.data import Dataset, load_dataset
from tasks.data import dataset_request as request_for
from tasks.losses import (
    tsa_cross_entropy,
    tsa_threshold,
)
from tasks.models import model_for
from tasks.settings import Settings, mapping
from tasks.train import (
    cosine_warmup_lr,
    derive_seed,
    eval_mode_logits,
    evaluate,
    keep_freed_memory,
    make_sgd,
    resolve_device,
    seeded,
    set_lr,
    to_float,
)

ROOT = Path(__file__).resolve().parents[1]

# method -> the experiment whose parts it trains (dataset swapped by --dataset)
SANITY_METHODS: dict[str, str] = {
    "fixmatch": "experiments/fmnist-las/fedavg_fixmatch.yaml",
    "uda": "experiments/fmnist-las/fedavg_uda.yaml",
    "crl": "experiments/ssfl-fmnist/crl_gn.yaml",
    "selftrain": "experiments/ssfl-fmnist/selftrain_bn.yaml",
}

# FixMatch's cosine decay: lr * cos(7 pi k / (16 K)) (Sohn et al. 2020, section 4).
COSINE_CYCLES = 7.0 / 16.0


@dataclass(frozen=True)
class SanityOptions:
    """The run's length and batch shape (the parts come from the method's experiment)."""

    steps: int = 2000
    mu: int = 7
    batch_size: int = 0  # 0: the method's client.batch_size
    labels_per_class: int = 100
    log_every: int = 50
    eval_every: int = 500


@dataclass
class Block:
    """Running sums over one block of steps, for one log line."""

    grad_norms: list[float] = field(default_factory=list)
    loss_x: float = 0.0
    loss_u: float = 0.0
    seen: int = 0
    kept: int = 0
    kept_right: int = 0

    def add(self, grad_norm: float, loss_x: float, loss_u: float, mask, right) -> None:
        self.grad_norms.append(grad_norm)
        self.loss_x += loss_x
        self.loss_u += loss_u
        self.seen += int(mask.numel())
        self.kept += int(mask.sum())
        self.kept_right += int((mask.bool() & right).sum())

    def row(self, step: int, lr: float) -> dict[str, float]:
        n = max(len(self.grad_norms), 1)
        return {
            "step": step,
            "lr": lr,
            "grad_norm_mean": sum(self.grad_norms) / n,
            "grad_norm_max": max(self.grad_norms, default=0.0),
            "loss_x": self.loss_x / n,
            "loss_u": self.loss_u / n,
            "mask_rate": self.kept / max(self.seen, 1),
            "pseudo_label_accuracy": self.kept_right / max(self.kept, 1),
        }


def sanity_config(method: str, dataset: str, sets: list[str]) -> Settings:
    """The method's experiment with ``dataset`` and the ``--set`` overrides."""
    if method not in SANITY_METHODS:
        allowed = ", ".join(sorted(SANITY_METHODS))
        raise ConfigError(f"unknown sanity method {method!r} (allowed: {allowed})")
    path = ROOT / SANITY_METHODS[method]
    return settings_of(resolve_experiment(path, sets=[f"dataset.name={dataset}", *sets]))


def labeled_indices(labels: torch.Tensor, per_class: int, seed: int) -> np.ndarray:
    """``per_class`` training indices of every class, drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    y = labels.numpy()
    picks = [rng.choice(np.flatnonzero(y == c), per_class, replace=False) for c in np.unique(y)]
    return np.sort(np.concatenate(picks))


def labeled_loss_for(algo: Any, num_classes: int, steps: int):
    """Cross-entropy; UDA's with training-signal annealing (UDA 3.2) over the run."""
    if not isinstance(algo, UDASettings):
        return lambda logits, y, step: F.cross_entropy(logits, y)

    def tsa(logits: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        eta = tsa_threshold(step / steps, algo.tsa_schedule, num_classes)
        return tsa_cross_entropy(logits, y, eta)

    return tsa


def gradient_norm(model: nn.Module) -> float:
    """The L2 norm of every parameter's gradient together."""
    grads = [p.grad.detach().flatten() for p in model.parameters() if p.grad is not None]
    return float(torch.cat(grads).norm()) if grads else 0.0


def random_batch(n: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """``size`` indices drawn without replacement from 0..n-1."""
    return torch.randperm(n, generator=generator)[:size]


def train_sanity(
    method: str, settings: Settings, ds: Dataset, opts: SanityOptions, log=print
) -> dict[str, Any]:
    """Train the method's parts centrally; the results record (see the module doc)."""
    device = resolve_device(settings.device)
    algo, ccfg = settings.algo, settings.client
    batch = opts.batch_size or ccfg.batch_size
    lab = labeled_indices(ds.train_y, opts.labels_per_class, derive_seed(settings.seed, "labels"))
    unl = np.setdiff1d(np.arange(len(ds.train_y)), lab)
    x_l, y_l = to_float(ds.train_x[lab], device), ds.train_y[lab].to(device)
    x_u, y_u = to_float(ds.train_x[unl], device), ds.train_y[unl].to(device)
    test_x, test_y = to_float(ds.test_x, device), ds.test_y.to(device)
    shift = settings.augment.weak_shift
    n_ops, magnitude = algo.randaugment_n, algo.randaugment_m
    weak = WeakAugment(ds.image_size, ds.flip, shift).to(device)
    strong = StrongAugment(ds.image_size, ds.flip, ds.channels, n_ops, magnitude, shift).to(device)
    client = method_of(settings.method).client_half()  # its loss, as the clients train it
    u_loss, strong_trained = client.loss_of(algo), client.trains_strong_view(algo)
    eval_labels = client.labels_in_eval_mode(algo)
    x_loss = labeled_loss_for(algo, ds.num_classes, opts.steps)
    start = time.monotonic()
    with seeded(derive_seed(settings.seed, "sanity", method)) as gen:
        model = model_for(settings.model, ds).to(device)
        opt = make_sgd(model.parameters(), ccfg.lr, ccfg.momentum, ccfg.weight_decay, ccfg.nesterov)
        blocks, evals, block = [], [], Block()
        for step in range(opts.steps):
            lr = cosine_warmup_lr(step, ccfg.lr, opts.steps, 0.0, COSINE_CYCLES, 0.0)
            il = random_batch(len(x_l), batch, gen).to(device)
            iu = random_batch(len(x_u), opts.mu * batch, gen).to(device)
            xb = x_u[iu]
            views = [weak(x_l[il]), weak(xb), strong(xb)]
            labels = eval_mode_logits(model, views[1]) if eval_labels else None
            model.train()
            logits = model(torch.cat(views))
            logits_x = logits[: len(il)]
            logits_w, logits_s = logits[len(il) :].chunk(2)
            loss_x = x_loss(logits_x, y_l[il], step)
            label_logits = logits_w if labels is None else labels
            loss_u, mask = u_loss(label_logits, logits_s if strong_trained else logits_w)
            loss = loss_x + algo.lambda_u * loss_u
            set_lr(opt, lr)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            right = label_logits.detach().argmax(dim=1) == y_u[iu]
            losses = float(loss_x.detach()), float(loss_u.detach())
            block.add(gradient_norm(model), *losses, mask, right)
            opt.step()
            done = step + 1
            if done % opts.log_every == 0 or done == opts.steps:
                blocks.append(block.row(done, lr))
                block = Block()
                log(format_block(blocks[-1]))
            if done % opts.eval_every == 0 or done == opts.steps:
                accuracy = evaluate(model, test_x, test_y, 1000)[0]
                evals.append({"step": done, "test_accuracy": accuracy})
                log(f"step {done}: test accuracy {accuracy:.4f}")
    accuracies = [e["test_accuracy"] for e in evals]
    return {
        "method": method,
        "dataset": ds.name,
        "config": mapping(settings),
        "options": asdict(opts),
        "labeled": len(lab),
        "unlabeled": len(unl),
        "final_test_accuracy": accuracies[-1],
        "best_test_accuracy": max(accuracies),
        "wall_seconds": time.monotonic() - start,
        "evals": evals,
        "blocks": blocks,
    }


def format_block(row: dict[str, float]) -> str:
    """One log line of a block of steps."""
    return (
        f"step {row['step']}: lr {row['lr']:.5f} grad norm {row['grad_norm_mean']:.3f} "
        f"(max {row['grad_norm_max']:.3f}) loss_x {row['loss_x']:.4f} loss_u {row['loss_u']:.4f} "
        f"mask {row['mask_rate']:.3f} pseudo-labels right {row['pseudo_label_accuracy']:.3f}"
    )


def run_sanity(
    method: str, dataset: str, out: Path, opts: SanityOptions, sets: list[str] = ()
) -> dict[str, Any]:
    """Resolve the parts, train, write ``out/results.json``; the results record."""
    if opts.steps < 1 or opts.mu < 1 or opts.labels_per_class < 1:
        raise ConfigError("--steps, --mu and --labels-per-class must be >= 1")
    settings = sanity_config(method, dataset, list(sets))
    keep_freed_memory()
    results = train_sanity(method, settings, load_dataset(request_for(settings.dataset)), opts)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return results
