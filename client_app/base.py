"""The client half every method shares: local data, the round's context, the reply.

A method's client half subclasses :class:`ClientHalf` and implements ``train``;
it may override ``reply_arrays`` (e.g. to send sparse payloads) and use
``self.state`` (the node's ``context.state``) for what must persist across rounds.

A node's data comes from its node-config (:func:`node_from_config`): its partition
of the experiment's dataset, or, with ``data-path``, its own folder of unlabeled
images, whose true labels nobody knows (``ClientData.true_y`` is None).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, KEY_NORM_BIT
from torch import nn

from ssfl.records import record_arrays
from ssfl.registry import settings_of
from tasks.attack import MODEL_ATTACKS, poisoned
from tasks.augment import concrete_engine, strong_augment, weak_augment
from tasks.data import dataset_info, load_image_folder
from tasks.models import model_for
from tasks.partition import split_key, split_of_key, stream_slice, stream_step
from tasks.privacy import clipped_model
from tasks.settings import Settings, SplitSettings
from tasks.state_io import device_tensors, host_arrays, load_host_arrays
from tasks.train import (
    DEVICE_RECORD,
    autocast,
    derive_seed,
    device_name,
    make_sgd,
    resolve_device,
    scheduled_lr,
    seeded,
    step_batches,
    steps_per_round,
    to_float,
)

# context.state key of the SGD momentum buffers kept across rounds (client.keep_momentum).
MOMENTUM_KEY = "sgd-momentum"


@dataclass(frozen=True)
class ClientData:
    """One client's data on the training device.

    ``x`` is the unlabeled part; ``true_y`` holds its hidden labels, used only to
    measure pseudo-label quality (and by the supervised upper bounds, which are
    given the labels by definition), and is None for a node's own images, whose
    labels are unknown. ``labeled_x``/``labeled_y`` is the client's labeled part in
    the labels-at-client scenario (empty otherwise).
    """

    partition_id: int
    x: torch.Tensor
    true_y: torch.Tensor | None
    labeled_x: torch.Tensor
    labeled_y: torch.Tensor
    num_classes: int
    image_size: int
    channels: int
    flip: bool
    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclass(frozen=True)
class Node:
    """Who a node is (its partition id: order, sampling, seeds) and where its data is."""

    partition_id: int
    data_path: str = ""  # a folder of the node's own unlabeled images; "" = its partition


def node_from_config(node_config: Mapping[str, Any]) -> Node:
    """The node's identity and data source from its node-config."""
    if "partition-id" not in node_config:
        raise ValueError(
            "node-config has no 'partition-id' (start the SuperNode with --node-config "
            "\"partition-id=K num-partitions=N\", adding data-path='/abs/folder' for a "
            "node's own images)"
        )
    return Node(int(node_config["partition-id"]), str(node_config.get("data-path", "")))


def parse_config(text: str) -> dict[str, Any]:
    """The round's config from its JSON: a fresh dict for every caller (never shared)."""
    return json.loads(text)


# Partitions a process keeps on its device. A simulation actor serves many nodes in
# turn; beyond this many, the least recently used partition is rebuilt from the cached
# split (an index and a copy, milliseconds) when its node is sampled again.
PARTITIONS_CACHED = 32


@functools.lru_cache(maxsize=PARTITIONS_CACHED)
def _client_data(key: str, partition_id: int, device: str) -> ClientData:
    ds, split = split_of_key(key)
    if not 0 <= partition_id < len(split.clients):
        raise ValueError(
            f"partition-id {partition_id} outside the split's {len(split.clients)} clients"
        )
    idx = split.clients[partition_id]
    labeled = split.client_labeled[partition_id]
    unlabeled = idx[~torch.isin(torch.from_numpy(idx), torch.from_numpy(labeled)).numpy()]
    dev = torch.device(device)
    return ClientData(
        partition_id=partition_id,
        x=to_float(ds.train_x[unlabeled], dev),
        true_y=ds.train_y[unlabeled].to(dev),
        labeled_x=to_float(ds.train_x[labeled], dev),
        labeled_y=ds.train_y[labeled].to(dev),
        num_classes=ds.num_classes,
        image_size=ds.image_size,
        channels=ds.channels,
        flip=ds.flip,
        mean=ds.mean,
        std=ds.std,
    )


@functools.lru_cache(maxsize=8)
def _folder_data(dataset: str, data_path: str, partition_id: int, device: str) -> ClientData:
    info = dataset_info(dataset)
    dev = torch.device(device)
    return ClientData(
        partition_id=partition_id,
        x=to_float(load_image_folder(data_path, info), dev),
        true_y=None,
        labeled_x=torch.zeros((0, info.channels, info.image_size, info.image_size), device=dev),
        labeled_y=torch.zeros(0, dtype=torch.int64, device=dev),
        num_classes=info.num_classes,
        image_size=info.image_size,
        channels=info.channels,
        flip=info.flip,
        mean=info.mean,
        std=info.std,
    )


def client_data(
    settings: Settings, partition_id: int, device: torch.device, data_path: str = ""
) -> ClientData:
    """The node's data, loaded once per process: its partition (cache keyed by the split's
    inputs), or with ``data_path`` its own unlabeled images in the format of the
    experiment's dataset."""
    if data_path:
        return _folder_data(settings.dataset.name, data_path, partition_id, str(device))
    return _client_data(split_key(settings), partition_id, str(device))


def streamed(data: ClientData, split: SplitSettings, server_round: int) -> ClientData:
    """The round's chunk of the unlabeled data when streaming is on (FedMatch 6.1)."""
    steps = split.stream_steps
    if not steps:
        return data
    part = stream_slice(
        len(data.x), stream_step(server_round, steps, split.stream_rounds_per_step), steps
    )
    true_y = None if data.true_y is None else data.true_y[part]
    return dataclasses.replace(data, x=data.x[part], true_y=true_y)


@functools.lru_cache(maxsize=8)
def augmenters(
    image_size: int,
    flip: bool,
    channels: int,
    n: int,
    m: float,
    shift: float,
    device: str,
    engine: str,
):
    """Weak and strong augmentation modules on the device, built once per process
    (``engine``: ``augment.engine``)."""
    strong = strong_augment(engine, image_size, flip, channels, n, m, shift).to(device)
    return weak_augmenter(image_size, flip, shift, device, engine), strong


@functools.lru_cache(maxsize=8)
def weak_augmenter(
    image_size: int, flip: bool, shift: float, device: str, engine: str
) -> nn.Module:
    """The weak augmentation module on the device, built once per process."""
    return weak_augment(engine, image_size, flip, shift).to(device)


# Models a process keeps built, by (client half, run config, data shape, device): a
# simulation actor or cohort worker serves many clients of one run with the same model
# shape, so each message loads its start model into a resident one instead of building it.
MODELS_KEPT = 4
_resident: dict[tuple, nn.Module] = {}


def resident_model(key: tuple, build: Callable[[], nn.Module]) -> nn.Module:
    """The process's model for ``key`` (built by ``build`` the first time), with no
    gradients and in training mode, as a new one; at most MODELS_KEPT are kept (the oldest
    is dropped). Its parameters and buffers are the caller's to overwrite (the start model)."""
    model = _resident.pop(key, None)
    if model is None:
        model = build()
        while len(_resident) >= MODELS_KEPT:
            _resident.pop(next(iter(_resident)))
    _resident[key] = model
    for param in model.parameters():
        param.grad = None
    return model.train()


class ClientHalf(ABC):
    """Local training of one client in one round."""

    # The optional client options (ssfl.experiment.CLIENT_OPTIONS) ``train`` honours; the
    # config refuses any other one set on. The base optimizer keeps momentum, Nesterov and
    # Adam; the base model compiles (train.compile).
    honours: frozenset[str] = frozenset(
        {"client.keep_momentum", "client.nesterov", "client.optimizer", "train.compile"}
    )
    # The federation.attack kinds it can apply (the config refuses the others): every dense
    # half can poison the model it sends; a half that makes pseudo-labels adds label_flip.
    attacks: frozenset[str] = frozenset(MODEL_ATTACKS)

    def __init__(
        self, content: RecordDict, state: RecordDict, partition_id: int, data_path: str = ""
    ):
        self.content = content
        self.config: ConfigRecord = content["config"]
        self.settings = settings_of(parse_config(str(self.config["ssfl-config"])))
        self.algo: Any = self.settings.algo  # the method's settings class (ssfl.registry)
        self.round = int(self.config["round"])
        self.lr = float(self.config["lr"])
        # The attack this client makes this round: the server tells the round's attackers.
        told = bool(self.config.get("attack", False))
        self.attack = self.settings.federation.attack.kind if told else "none"
        self.state = state
        self.device = resolve_device(self.settings.device)
        self.data = streamed(
            client_data(self.settings, partition_id, self.device, data_path),
            self.settings.split,
            self.round,
        )
        self.model = resident_model(self.model_key(), self.build_model)
        self.opt: torch.optim.Optimizer | None = None
        self.load_model()
        self.seed = derive_seed(self.settings.seed, "client", partition_id, self.round)

    def build_model(self) -> nn.Module:
        """The client's model on its device, compiled in place when ``train.compile`` asks
        (kept by :func:`resident_model`, so a process compiles it once)."""
        model = model_for(self.settings.model, self.data).to(self.device)
        if self.settings.train.compile != "off":
            model.compile(mode=self.settings.train.compile)
        return model

    def model_key(self) -> tuple:
        """What the built model depends on: the half, the run's config, the data's shape
        and the device (every message of a run shares the first two)."""
        d = self.data
        shape = (d.num_classes, d.image_size, d.channels, d.mean, d.std)
        return (type(self), str(self.config["ssfl-config"]), shape, str(self.device))

    def load_model(self) -> None:
        """Start from the server's model (a method with its own payload format overrides
        this), in one copy per dtype (tasks.state_io)."""
        load_host_arrays(self.model, record_arrays(self.content["arrays"]))

    def optimizer(self) -> torch.optim.Optimizer:
        """SGD (or Adam, client.optimizer); with client.keep_momentum, the SGD momentum
        buffers of this node's last round."""
        half = self.settings.client
        if half.optimizer == "adam":
            self.opt = torch.optim.Adam(
                self.model.parameters(), lr=self.lr, weight_decay=half.weight_decay
            )
            return self.opt
        self.opt = make_sgd(
            self.model.parameters(), self.lr, half.momentum, half.weight_decay, half.nesterov
        )
        if half.keep_momentum and MOMENTUM_KEY in self.state:
            buffers = device_tensors(record_arrays(self.state[MOMENTUM_KEY]), self.device)
            for i, param in enumerate(self.model.parameters()):
                if str(i) in buffers:
                    self.opt.state[param]["momentum_buffer"] = buffers[str(i)]
        return self.opt

    def save_momentum(self) -> None:
        """Keep the round's momentum buffers in context.state (client.keep_momentum)."""
        if self.opt is None or not self.settings.client.keep_momentum:
            return
        params = list(self.model.parameters())
        buffers = {
            str(i): self.opt.state[p]["momentum_buffer"]
            for i, p in enumerate(params)
            if self.opt.state[p].get("momentum_buffer") is not None
        }
        self.state[MOMENTUM_KEY] = host_record(buffers)

    def round_steps(self, n: int | None = None) -> int:
        """SGD steps this round: client.local_steps (T), else epochs over n (unlabeled) samples."""
        half = self.settings.client
        n = len(self.data.x) if n is None else n
        return steps_per_round(n, half.batch_size, half.epochs, half.local_steps)

    def round_batches(self) -> Iterator[torch.Tensor]:
        """This round's index batches over the unlabeled data, on its device (client.epochs
        passes, or client.local_steps = T batches)."""
        half, x = self.settings.client, self.data.x
        return step_batches(
            len(x), half.batch_size, self.generator, half.epochs, half.local_steps, device=x.device
        )

    def lr_at(self, step: int, round_steps: int) -> float:
        """The rate of local step ``step`` (``lr_schedule``; SSFL eq. 9 when cosine)."""
        s = self.settings
        if s.lr_schedule.name == "exponential":
            return self.lr
        return scheduled_lr(s.client, s.lr_schedule, s.rounds, self.round, step, round_steps)

    def engine(self) -> str:
        """The augmentation engine this half runs (``augment.engine`` on its device)."""
        return concrete_engine(self.settings.augment.engine, self.device)

    def weak_view(self) -> nn.Module:
        """The weak view alone (flip + shift)."""
        d = self.data
        return weak_augmenter(
            d.image_size,
            d.flip,
            self.settings.augment.weak_shift,
            str(self.device),
            self.engine(),
        )

    def augmenters(self) -> tuple[nn.Module, nn.Module]:
        """The weak view and the method's strong view (its RandAugment keys: a method with
        a strong view declares tasks.settings.RandAugmentSettings)."""
        d, algo = self.data, self.algo
        return augmenters(
            d.image_size,
            d.flip,
            d.channels,
            algo.randaugment_n,
            algo.randaugment_m,
            self.settings.augment.weak_shift,
            str(self.device),
            self.engine(),
        )

    def num_examples(self) -> int:
        return int(len(self.data.x) + len(self.data.labeled_x))

    @abstractmethod
    def train(self) -> dict[str, float]:
        """Run local training on ``self.model``; return the round's metrics."""

    def reply_arrays(self) -> dict[str, ArrayRecord]:
        """The trained model, copied to the host in one copy per dtype (tasks.state_io)."""
        return {"arrays": host_record(self.model.state_dict())}

    def run(self) -> dict[str, float]:
        """``train`` with every random stream (augmentation, batch order) seeded by the
        experiment's seed, the round and the partition alone (under bf16 autocast when
        train.amp asks for it)."""
        with seeded(self.seed) as self.generator, autocast(self.settings.train.amp, self.device):
            return self.train()

    def poisoned(self, sent: ArrayRecord) -> ArrayRecord:
        """The model this attacker sends in place of ``sent`` (tasks.attack.poisoned, with
        the update taken against the model it received; noise drawn from the seed, the
        partition and the round)."""
        attack = self.settings.federation.attack
        rng = np.random.default_rng(
            derive_seed(self.settings.seed, "attack", self.data.partition_id, self.round)
        )
        received = self.content["arrays"]
        out = poisoned(
            attack.kind,
            attack.factor,
            dict(zip(sent.keys(), sent.to_numpy_ndarrays())),
            dict(zip(received.keys(), received.to_numpy_ndarrays())),
            rng,
        )
        return ArrayRecord(array_dict={k: Array(np.array(v, order="C")) for k, v in out.items()})

    def clipped(self, sent: ArrayRecord) -> tuple[ArrayRecord, bool]:
        """privacy.mode ``client_*``: ``sent`` with its update (against the model received)
        clipped to the round's clipping norm (tasks.privacy.clipped_model), and whether it
        was longer (Flower's norm bit, for the adaptive norm)."""
        received = self.content["arrays"]
        model, norm = clipped_model(
            dict(zip(sent.keys(), sent.to_numpy_ndarrays())),
            dict(zip(received.keys(), received.to_numpy_ndarrays())),
            float(self.config[KEY_CLIPPING_NORM]),
        )
        return ArrayRecord(
            array_dict={k: Array(np.array(v, order="C")) for k, v in model.items()}
        ), norm > float(self.config[KEY_CLIPPING_NORM])

    def reply(self) -> RecordDict:
        metrics = self.run()
        self.save_momentum()
        content = RecordDict(self.reply_arrays())
        if self.attack in MODEL_ATTACKS:
            content["arrays"] = self.poisoned(content["arrays"])
        if KEY_CLIPPING_NORM in self.config:
            content["arrays"], metrics[KEY_NORM_BIT] = self.clipped(content["arrays"])
        content["metrics"] = MetricRecord(
            {
                **{k: float(v) for k, v in metrics.items()},
                "partition-id": self.data.partition_id,
                "num-examples": self.num_examples(),
            }
        )
        content[DEVICE_RECORD] = ConfigRecord({"device": device_name(self.device)})
        return content


def host_record(tensors: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """An ArrayRecord of ``tensors`` (as ``ArrayRecord(state_dict)`` gives it), copied to the
    host in one copy per dtype."""
    return ArrayRecord(array_dict={k: Array(v) for k, v in host_arrays(tensors).items()})
