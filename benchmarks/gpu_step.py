"""A client's training step against a bare torch loop (the physical-limit anchor).

``client_images_per_s``: FedAvg-FixMatch's client half (client_app/fixmatch.py) runs one
local epoch of ``steps`` unlabeled batches: weak and strong views drawn on the device,
one forward and backward of both views, its pseudo-label bookkeeping; its steady rate
(``client.run()``, the second round's) apart from its set-up (``client_setup_seconds``:
building the client, its resident model and augmenters). ``bare_images_per_s``: the same
model, batch (both views), precision and memory layout, on one fixed tensor,
cross-entropy, SGD; on a GPU also that step captured once in a CUDA graph and replayed
(``bare_graphed_images_per_s``: one launch a step, the loop's floor) and the client with
its model compiled (``train.compile: reduce-overhead``: ``client_compiled_images_per_s``,
``compiled_ratio``). All count images through the forward and backward (both views) per
second, after a warm-up.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from ssfl.experiment import resolve_config
from ssfl.registry import settings_of
from tasks.data import dataset_info
from tasks.models import model_for
from tasks.settings import Settings, mapping
from tasks.train import autocast, make_sgd

LR = 0.01


def experiment(
    model: str, dataset: str, batch: int, amp: str, steps: int, device: str, compile: str = "off"
) -> Settings:
    """One client holding exactly ``steps`` unlabeled batches of ``batch`` images; its model
    compiled in ``compile`` mode (``train.compile``)."""
    images = batch * steps
    raw = {
        "method": "fedavg_fixmatch",
        "device": device,
        "dataset": {
            "name": dataset,
            "synthetic_train_size": images + 100,
            "synthetic_test_size": 40,
        },
        "split": {
            "labeled_per_class": 2,
            "val_size": 20,
            "test_size": 40,
            "num_clients": 1,
            "client_size": images,
        },
        "model": {"name": model, "channels_last": amp == "bf16"},
        "train": {"amp": amp, "compile": compile},
        "client": {"batch_size": batch, "lr": LR},
    }
    return settings_of(resolve_config(raw))


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def client_rate(
    model: str, dataset: str, batch: int, amp: str, steps: int, device: str, compile: str = "off"
) -> tuple[float, float]:
    """Images/s (both views) of the FixMatch client's steady round and the seconds its
    set-up took, both of its second round (the first warms up the data cache, the
    resident model, the augmentations and the kernels, and compiles the model when
    ``compile`` asks)."""
    from client_app.fixmatch import FixMatchClient

    settings = experiment(model, dataset, batch, amp, steps, device, compile)
    net = model_for(settings.model, dataset_info(settings.dataset.name))
    content = RecordDict(
        {
            "arrays": ArrayRecord(net.state_dict()),
            "config": ConfigRecord(
                {"ssfl-config": json.dumps(mapping(settings), sort_keys=True), "round": 1, "lr": LR}
            ),
        }
    )
    setup = running = 0.0
    for _ in range(2):
        synchronize(device)
        started = time.perf_counter()
        client = FixMatchClient(content, RecordDict(), 0)
        synchronize(device)
        built = time.perf_counter()
        metrics = client.run()
        synchronize(device)
        setup, running = built - started, time.perf_counter() - built
    return 2 * batch * int(metrics["local_steps"]) / running, setup


def bare_loop(
    model: str, dataset: str, batch: int, amp: str, steps: int, device: str
) -> Callable[[], None]:
    """One plain training step: a fixed input of both views' size, cross-entropy, SGD."""
    settings = experiment(model, dataset, batch, amp, steps, device)
    info = dataset_info(settings.dataset.name)
    dev = torch.device(device)
    net = model_for(settings.model, info).to(dev)
    layout = torch.channels_last if settings.model.channels_last else torch.contiguous_format
    x = torch.rand(2 * batch, info.channels, info.image_size, info.image_size, device=dev)
    x = x.contiguous(memory_format=layout)
    y = torch.randint(0, info.num_classes, (2 * batch,), device=dev)
    opt = make_sgd(net.parameters(), LR, 0.9, 0.0)
    net.train()

    def step() -> None:
        with autocast(settings.train.amp, dev):
            loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)  # in a capture: no kernel, the grads come from its pool
        loss.backward()
        opt.step()

    return step


def timed_rate(run: Callable[[], None], batch: int, steps: int, device: str) -> float:
    """Images/s (both views) of ``steps`` calls of ``run``."""
    synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        run()
    synchronize(device)
    return 2 * batch * steps / (time.perf_counter() - started)


def bare_images_per_s(
    model: str, dataset: str, batch: int, amp: str, steps: int, device: str
) -> float:
    """Images/s of the plain eager loop, after a warm-up."""
    step = bare_loop(model, dataset, batch, amp, steps, device)
    for _ in range(max(2, steps // 5)):
        step()
    return timed_rate(step, batch, steps, device)


def bare_graphed_images_per_s(
    model: str, dataset: str, batch: int, amp: str, steps: int, device: str
) -> float | None:
    """Images/s of the plain step captured in one CUDA graph (forward, backward and SGD,
    PyTorch's whole-network capture) and replayed; None off a GPU."""
    if device != "cuda":
        return None
    step = bare_loop(model, dataset, batch, amp, steps, device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as capture needs
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    return timed_rate(graph.replay, batch, steps, device)


def significant(rate: float, digits: int = 4) -> float:
    """``rate`` to ``digits`` significant digits: a slow CPU's 3.1 images/s keeps its ratio."""
    return float(f"{rate:.{digits}g}")


def case(model: str, dataset: str, batch: int, amp: str, steps: int, device: str) -> dict[str, Any]:
    """The client's steady rate and set-up, the bare loops' rates, and the ratios."""
    project, setup = client_rate(model, dataset, batch, amp, steps, device)
    bare = bare_images_per_s(model, dataset, batch, amp, steps, device)
    try:
        graphed, graph_error = (
            bare_graphed_images_per_s(model, dataset, batch, amp, steps, device),
            None,
        )
    except RuntimeError as err:  # a capture this torch or GPU refuses: recorded, not fatal
        graphed, graph_error = None, str(err).strip().splitlines()[0][:200]
    compiled, compile_error = compiled_client_rate(model, dataset, batch, amp, steps, device)
    return {
        "model": model,
        "batch": batch,
        "amp": amp,
        "client_images_per_s": significant(project),
        "client_setup_seconds": round(setup, 4),
        "bare_images_per_s": significant(bare),
        "bare_graphed_images_per_s": None if graphed is None else significant(graphed),
        "ratio": round(project / bare, 3),
        "ratio_to_graphed": None if graphed is None else round(project / graphed, 3),
        "client_compiled_images_per_s": None if compiled is None else significant(compiled),
        "compiled_ratio": None if compiled is None else round(compiled / bare, 3),
        **({"bare_graphed_error": graph_error} if graph_error else {}),
        **({"client_compiled_error": compile_error} if compile_error else {}),
    }


def compiled_client_rate(
    model: str, dataset: str, batch: int, amp: str, steps: int, device: str
) -> tuple[float | None, str | None]:
    """(images/s, error) of the client with ``train.compile: reduce-overhead`` (compiled,
    CUDA graphs); (None, None) off a GPU (compiling costs about a minute on a CPU), and
    the error's first line where compiling fails."""
    if device != "cuda":
        return None, None
    try:
        return client_rate(model, dataset, batch, amp, steps, device, "reduce-overhead")[0], None
    except Exception as err:  # a compiler failure is recorded, not fatal
        return None, str(err).strip().splitlines()[0][:200]


# ----- K clients at once --------------------------------------------------------------------
def gn_nets(model: str, dataset: str, clients: int, device: str) -> list[torch.nn.Module]:
    """``clients`` GroupNorm models of ``model`` (as the SSFL benchmark's cells), each its own
    initial weights, on ``device``."""
    settings = experiment(model, dataset, 2, "off", 1, device)
    info = dataset_info(settings.dataset.name)
    model_settings = dataclasses.replace(settings.model, norm="gn", channels_last=False)
    return [model_for(model_settings, info).to(device).train() for _ in range(clients)]


def client_batches(
    clients: int, batch: int, dataset: str, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y): every client's fixed batch of both views' size, stacked: (K, 2B, C, H, W)
    and (K, 2B)."""
    info = dataset_info(dataset)
    shape = (clients, 2 * batch, info.channels, info.image_size, info.image_size)
    x = torch.rand(*shape, device=device)
    return x, torch.randint(0, info.num_classes, (clients, 2 * batch), device=device)


def sequential_steps(
    nets: list[torch.nn.Module], x: torch.Tensor, y: torch.Tensor
) -> Callable[[], None]:
    """One plain SGD step of every client, one after another (cohort execution today)."""
    optimizers = [make_sgd(net.parameters(), LR, 0.9, 0.0) for net in nets]

    def step() -> None:
        for k, (net, opt) in enumerate(zip(nets, optimizers, strict=True)):
            loss = F.cross_entropy(net(x[k]), y[k])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return step


def stacked_steps(
    nets: list[torch.nn.Module], x: torch.Tensor, y: torch.Tensor
) -> tuple[Callable[[], None], dict[str, torch.Tensor]]:
    """The same steps with the clients' weights stacked and trained at once: one forward and
    backward of all K models (``torch.func``: ``vmap`` of the gradient over the stacked
    parameters and the clients' batches) and one SGD step over the stacks (SGD is per
    element: each client's slice moves as its own optimizer would move it). GroupNorm
    only: BatchNorm's running statistics are buffers that ``vmap`` cannot update in place.
    The step, and the stacked parameters it trains."""
    from torch.func import functional_call, grad, stack_module_state, vmap

    if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in nets[0].modules()):
        raise ValueError("stacked clients need GroupNorm models (BatchNorm keeps buffers)")
    params, buffers = stack_module_state(nets)
    template = copy.deepcopy(nets[0]).to("meta")

    def loss_of(p, b, xk, yk) -> torch.Tensor:
        return F.cross_entropy(functional_call(template, (p, b), (xk,)), yk)

    gradients = vmap(grad(loss_of), randomness="different")
    opt = make_sgd(params.values(), LR, 0.9, 0.0)

    def step() -> None:
        for p, g in zip(params.values(), gradients(params, buffers, x, y).values(), strict=True):
            p.grad = g
        opt.step()

    return step, params


def stacked_case(
    model: str, dataset: str, batch: int, clients: int, steps: int, device: str
) -> dict[str, Any]:
    """Images/s (both views) of K GroupNorm clients' plain steps one after another, and with
    their weights stacked and trained at once (:func:`stacked_steps`), after a warm-up: what
    training a cohort's clients together would gain over the sequential cohort."""
    rates = {}
    makers = {
        "sequential": sequential_steps,
        "stacked": lambda nets, x, y: stacked_steps(nets, x, y)[0],
    }
    for name, make in makers.items():
        nets = gn_nets(model, dataset, clients, device)
        step = make(nets, *client_batches(clients, batch, dataset, device))
        for _ in range(2):
            step()
        rates[name] = clients * timed_rate(step, batch, steps, device)
    return {
        "model": model,
        "norm": "gn",
        "batch": batch,
        "clients": clients,
        "sequential_images_per_s": significant(rates["sequential"]),
        "stacked_images_per_s": significant(rates["stacked"]),
        "stacked_over_sequential": round(rates["stacked"] / rates["sequential"], 3),
    }
