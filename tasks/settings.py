"""Settings, declared once: every configuration key as one typed field with its default,
the range or choices its meaning allows, one line of help and the paper reference.

The shared sections are declared here; each method declares its ``algo`` section as a
subclass of :class:`AlgoSettings` in its client half's module (the one module both the
server and a client process import) and names it on its registry line. The YAML reader
(tasks.config) derives its defaults, ranges and choices from these declarations and
checks a file once; :func:`typed` turns the checked mapping into these frozen objects,
so code reads ``settings.split.num_clients`` or ``settings.algo.tau``, never the dict.
docs/reference.md's key tables are generated from them (``python -m ssfl.reference``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar


@dataclass(frozen=True)
class Range:
    """The interval a numeric key's value must lie in; None = unbounded on that side."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (NaN never does)."""
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below and not math.isnan(value)

    def __str__(self) -> str:
        """'> 0', '>= 1', 'in [0, 1)', 'in [1, 100000]'."""
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {show(self.low)}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{show(self.low)}, {show(self.high)}{right}"


def show(value: Any) -> str:
    """A number as a user types it: 1 not 1.0, 1e+12 not 1000000000000.0."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def between(low: float, high: float, high_open: bool = False) -> Range:
    """[low, high] (or [low, high))."""
    return Range(low, high, high_open=high_open)


POSITIVE = Range(0, low_open=True)  # rates, temperatures, timeouts
NON_NEGATIVE = Range(0)  # loss weights, decays, thresholds on magnitudes
UNIT = between(0, 1)  # probabilities, thresholds, fractions
MOMENTUM = between(0, 1, high_open=True)
OPEN_UNIT = Range(0, 1, low_open=True, high_open=True)

# Upper bounds on counts, far above any real run, so that a typo (an extra digit or
# three) is refused at once instead of hanging a run or exhausting memory.
MAX_ROUNDS = 100_000
MAX_EPOCHS = 10_000  # per round, the bootstrap, the evaluation protocols
MAX_STEPS = 1_000_000  # SGD steps per round
MAX_BATCH = 1_000_000
MAX_CLIENTS = 100_000
MAX_IMAGES = 1_000_000  # a generated split; real splits are bounded by the dataset
MAX_WIDTH = 16_384  # a head's or an SSL projector's width (BYOL: 4096)
MAX_CPUS = 1_024
# How a simulation runs a round's clients (simulation.execution).
EXECUTIONS = ("per_client", "cohort")
MAX_SEED = 2**32 - 1  # numpy's seed range


def setting(
    default: Any,
    help: str,
    *,
    rule: Range | None = None,
    choices: tuple[str, ...] | None = None,
    ref: str = "",
    scenario: str = "",
) -> Any:
    """One key: its default (whose type is the key's type), one line of help, the range a
    number must lie in or the strings allowed, the paper reference, and the one
    ``split.scenario`` it means something in ("" = every scenario)."""
    metadata = {"help": help, "rule": rule, "choices": choices, "ref": ref, "scenario": scenario}
    return field(default=default, metadata=metadata)


def again(section: type, name: str, default: Any) -> Any:
    """Key ``name`` of ``section`` with another default (a method's own value); the key's
    type, rule and help stay those of its one declaration."""
    declared = {f.name: f for f in dataclasses.fields(section)}[name]
    return field(default=default, metadata=declared.metadata)


# ----- The shared sections -------------------------------------------------------------
@dataclass(frozen=True)
class DatasetSettings:
    name: str = setting(
        "fashion_mnist",
        "`fashion_mnist`, `mnist`, `cifar10`, `cifar100`, `svhn`, `emnist_balanced`, `stl10`, "
        "`synthetic28`, `synthetic32`",
    )
    root: str = setting("", 'data folder; `""` = `$SSFL_DATA_DIR`, else `./data`')
    download: bool = setting(True, "let torchvision's downloader fetch missing files")
    synthetic_train_size: int = setting(
        4000, "train size of the synthetic datasets", rule=between(1, MAX_IMAGES)
    )
    synthetic_test_size: int = setting(
        1000, "test size of the synthetic datasets", rule=between(1, MAX_IMAGES)
    )


@dataclass(frozen=True)
class SplitSettings:
    scenario: str = setting(
        "labels_at_server",
        "`labels_at_server`, `labels_at_client` (must agree with "
        "`split.client_labeled_per_class`) or `open_world` (FedoSSL Definition 1)",
        choices=("labels_at_server", "labels_at_client", "open_world"),
    )
    labeled_per_class: int = setting(
        50, "labeled images per class at the server", rule=between(0, MAX_IMAGES)
    )
    val_size: int = setting(
        200, "server validation images (class-balanced)", rule=between(0, MAX_IMAGES)
    )
    test_size: int = setting(
        3000, "test images (0 = the whole test set)", rule=between(0, MAX_IMAGES)
    )
    num_clients: int = setting(10, "number of clients (partitions)", rule=between(1, MAX_CLIENTS))
    client_size: int = setting(
        1200,
        "images per client; 0 = every training image left, shared out (SSFL App. A.2 for "
        "`iid` and `noniid_r`)",
        rule=between(0, MAX_IMAGES),
        ref="SSFL benchmark App. A.2",
    )
    partitioner: str = setting(
        "iid",
        "see [partitioners](#splits-and-partitioners)",
        choices=("iid", "dirichlet", "random_classes", "fedmatch_imbalanced", "noniid_r"),
    )
    dirichlet_alpha: float = setting(0.5, "alpha of `dirichlet`", rule=POSITIVE)
    target_r: float = setting(
        0.4, "R of `noniid_r` (SSFL App. A.2)", rule=UNIT, ref="SSFL benchmark App. A.2"
    )
    client_labeled_per_class: int = setting(
        0,
        "labeled images per class at each client (labels-at-client)",
        rule=between(0, MAX_IMAGES),
    )
    stream_steps: int = setting(
        0,
        "streaming (FedMatch 6.1): chunks of each client's unlabeled data; 0 = off",
        rule=between(0, MAX_IMAGES),
        ref="FedMatch 6.1",
    )
    stream_rounds_per_step: int = setting(
        10,
        "rounds per chunk: round r trains on chunk (r - 1) // this",
        rule=between(1, MAX_ROUNDS),
    )
    class_roles: str = setting(
        "",
        "open_world: one letter per class (S seen, L locally unseen, G globally unseen); "
        '`""` = 60% seen, one locally unseen, the rest globally unseen (FedoSSL section 5)',
        ref="FedoSSL section 5",
        scenario="open_world",
    )
    labeled_fraction: float = setting(
        0.5,
        "open_world: the labeled fraction of each seen class (FedoSSL section 5: 50%)",
        rule=OPEN_UNIT,
        ref="FedoSSL section 5",
        scenario="open_world",
    )
    role_clients: int = setting(
        0,
        "open_world: the clients the roles are laid over (0 = `num_clients`)",
        rule=between(0, MAX_CLIENTS),
        scenario="open_world",
    )
    samples_per_class: int = setting(
        0,
        "open_world: training images kept per class (0 = all)",
        rule=between(0, MAX_IMAGES),
        scenario="open_world",
    )


@dataclass(frozen=True)
class ModelSettings:
    name: str = setting(
        "small_cnn", "`small_cnn`, `resnet9` (FedMatch's), `resnet18` (CIFAR ResNet-18)"
    )
    norm: str = setting("bn", "`none`, `bn`, `gn` (GroupNorm)", choices=("none", "bn", "gn"))
    dropout: float = setting(
        0.0,
        "Dropout2d after `small_cnn`'s conv blocks (SSFL's EMNIST CNN: 0.25); `small_cnn` only",
        rule=between(0, 1, high_open=True),
        ref="SSFL benchmark App. A.3",
    )
    head_size: int = setting(
        0,
        "outputs of the head; 0 = one per class; otherwise at least the class count "
        "(FedoSSL's seen + novel classes)",
        rule=between(0, MAX_WIDTH),
    )
    projector_dim: int = setting(
        0,
        "SSL projector D -> P -> P on the embedding (Linear, BatchNorm1d, ReLU, Linear); "
        "0 = none; SimCLR, SimSiam, BYOL, FedSup",
        rule=between(0, MAX_WIDTH),
    )
    predictor_dim: int = setting(
        0,
        "SSL predictor P -> H -> P on the projector (needs a projector); 0 = none; SimSiam, "
        "BYOL, FedSup",
        rule=between(0, MAX_WIDTH),
    )
    channels_last: bool = setting(
        False,
        "weights (and so conv inputs) in channels-last layout; a GPU speed option (ours), "
        "same numbers on CPU up to float rounding",
    )


@dataclass(frozen=True)
class TrainSettings:
    amp: str = setting(
        "off",
        "`bf16`: client training, server training and test evaluation under bf16 autocast "
        "(ours; a GPU speed option, changes the numbers); `off` = float32",
        choices=("off", "bf16"),
    )
    compile: str = setting(
        "off",
        "the clients' model compiled with `torch.compile` in this mode, once per process (the "
        "resident model): `reduce-overhead` captures CUDA graphs on a GPU. A GPU speed option "
        "(ours): the first steps of each new batch shape compile (about 50 s on a CPU), the "
        "numbers move in the last bits; `off` = eager",
        choices=("off", "default", "reduce-overhead", "max-autotune"),
    )


@dataclass(frozen=True)
class OptimizerSettings:
    """SGD of one half (server or client); FedSEAL eq. 3-4 and 6 train with it."""

    epochs: int = setting(
        0, "epochs a round (0 when `local_steps` > 0)", rule=between(0, MAX_EPOCHS)
    )
    lr: float = setting(0.01, "learning rate", rule=POSITIVE)
    lr_decay: float = setting(
        1.0,
        "per-round decay, lr x lr_decay^(round - 1) (exponential schedule only)",
        rule=Range(0, 1, low_open=True),
    )
    momentum: float = setting(0.9, "SGD momentum", rule=MOMENTUM)
    weight_decay: float = setting(0.0, "SGD weight decay", rule=NON_NEGATIVE)
    batch_size: int = setting(32, "batch size", rule=between(1, MAX_BATCH))
    nesterov: bool = setting(False, "Nesterov momentum (needs momentum > 0)")
    local_steps: int = setting(
        0,
        "T: SGD steps a round (SSFL benchmark 3.3); 0 = count epochs",
        rule=between(0, MAX_STEPS),
        ref="SSFL benchmark 3.3",
    )
    keep_momentum: bool = setting(
        False,
        "keep the SGD momentum across rounds (SSFL benchmark's code; a client keeps it in "
        "its node's `context.state`)",
    )
    optimizer: str = setting(
        "sgd",
        "`sgd` (with `momentum`, `nesterov`, `weight_decay`) or `adam` (betas 0.9, 0.999; "
        "`weight_decay` as L2; FedSup Table 6.6's learning-rate sweep reads like Adam's); "
        "clients only",
        choices=("sgd", "adam"),
        ref="FedSup Table 6.6",
    )


@dataclass(frozen=True)
class ServerSettings(OptimizerSettings):
    """The server's SGD on its labeled set, and its bootstrap."""

    bootstrap_epochs: int = setting(
        0,
        "epochs on the labeled set before round 1 (FedSEAL 4.1.3)",
        rule=between(0, MAX_EPOCHS),
        ref="FedSEAL 4.1.3",
    )


@dataclass(frozen=True)
class ClientSettings(OptimizerSettings):
    """A client's local SGD, and the FedProx term."""

    epochs: int = again(OptimizerSettings, "epochs", 1)
    proximal_mu: float = setting(
        0.0,
        "FedProx term (mu / 2) \\|\\|w - w_global\\|\\|^2 (refused by client halves that do "
        "not honour it)",
        rule=NON_NEGATIVE,
    )


@dataclass(frozen=True)
class LrScheduleSettings:
    name: str = setting(
        "exponential",
        "`exponential` (lr x lr_decay^(round - 1)), `cosine` (SSFL eq. 9, per SGD step) or "
        "`multistep` (lr x gamma^k, k the milestones the round has passed: the FedoSSL "
        "official code's MultiStepLR)",
        choices=("exponential", "cosine", "multistep"),
        ref="SSFL benchmark eq. 9; FedoSSL official code",
    )
    epochs: float = setting(
        0.0,
        "cosine: schedule length E in epochs; 0 = the whole run (rounds x steps a round)",
        rule=between(0, MAX_EPOCHS * MAX_ROUNDS),
    )
    warmup_epochs: float = setting(
        0.0,
        "cosine: linear warm-up e in epochs (< `epochs`)",
        rule=between(0, MAX_EPOCHS * MAX_ROUNDS),
    )
    epoch_samples: int = setting(
        65536,
        "cosine: samples per epoch M (an epoch is M / batch size steps)",
        rule=between(1, MAX_IMAGES * MAX_EPOCHS),
    )
    cycles: float = setting(0.4375, "cosine: c of eq. 9", rule=NON_NEGATIVE)
    floor: float = setting(0.0001, "cosine: epsilon of eq. 9", rule=UNIT)
    first_milestone: float = setting(
        0.7,
        "multistep: the first decay, from the round after this fraction of the run's rounds "
        "(FedoSSL code: epoch 140 of 200)",
        rule=UNIT,
    )
    second_milestone: float = setting(
        0.9, "multistep: the second decay (FedoSSL code: epoch 180 of 200)", rule=UNIT
    )
    gamma: float = setting(0.1, "multistep: the factor at each milestone (code: 0.1)", rule=UNIT)


@dataclass(frozen=True)
class AttackSettings:
    """Simulated malicious clients (for tests and research): what the chosen clients do to
    the update they send, or to the pseudo-labels they train on."""

    kind: str = setting(
        "none",
        "`none`; `scale` (the update, client model minus the model it received, times "
        "`factor`), `sign_flip` (the update times -`factor`), `noise` (plus Gaussian noise of "
        "`factor` times the update's RMS), `nan` (every float sent is NaN), `label_flip` "
        "(pseudo-labels c -> C - 1 - c; clients that make pseudo-labels only)",
        choices=("none", "scale", "sign_flip", "noise", "label_flip", "nan"),
        ref="Bagdasaryan et al. 2020 (scaling); Fang et al. 2020 (label flipping)",
    )
    partitions: tuple[int, ...] = setting(
        (), "partition ids that attack in every round they are sampled, e.g. `[0, 1]`"
    )
    fraction: float = setting(
        0.0,
        "also this fraction of each round's sampled clients attacks (the count rounded half "
        "up; drawn from the seed and the round)",
        rule=UNIT,
    )
    factor: float = setting(
        100.0, "strength of `scale`, `sign_flip` and `noise`", rule=NON_NEGATIVE
    )


@dataclass(frozen=True)
class FederationSettings:
    clients_per_round: int = setting(
        0,
        "clients sampled a round (deterministic from the seed); 0 = all",
        rule=between(0, MAX_CLIENTS),
    )
    min_clients: int = setting(
        0, "nodes the server waits for; 0 = `split.num_clients`", rule=between(0, MAX_CLIENTS)
    )
    timeout_s: float = setting(3600.0, "seconds to wait for nodes and for replies", rule=POSITIVE)
    max_failed_rounds: int = setting(
        3,
        "this many rounds in a row without an accepted client update stop the run: exit 1, "
        'one line naming the last round\'s failures, `results.json` with `"status": "failed"` '
        "and the rounds done",
        rule=between(1, MAX_ROUNDS),
    )
    average: str = setting(
        "all",
        "what the aggregate replaces in the server's model: `all` (parameters and buffers, "
        "BatchNorm's running statistics included) or `parameters` (the server's model keeps "
        "its own buffers, as the SSFL benchmark's official code, which averages "
        "`model.parameters()` only)",
        choices=("all", "parameters"),
        ref="SSFL benchmark official code (SyncAllreduce)",
    )
    checkpoint_every: int = setting(
        0,
        "N > 0: also keep every Nth round's checkpoint as `checkpoint-rNNN.pt` beside "
        "`checkpoint.pt` (the global model a round sent on, for `benchmarks/calibration.py` "
        "and `local_drift.py --checkpoint`); changes no number",
        rule=between(0, MAX_ROUNDS),
    )
    attack: AttackSettings = field(default_factory=AttackSettings)


@dataclass(frozen=True)
class AggregateSettings:
    """How a model-averaging method combines the clients' models (robust options)."""

    rule: str = setting(
        "mean",
        "`mean` (FedAvg, example-weighted), coordinate-wise `median` or `trimmed_mean`, `krum` "
        "(the one update closest to its neighbours), `multi_krum` (the mean of the `krum_m` "
        "best by Krum's score)",
        choices=("mean", "median", "trimmed_mean", "krum", "multi_krum"),
        ref="Yin et al. 2018 (median, trimmed mean); Blanchard et al. 2017 (Krum, multi-Krum)",
    )
    trim_fraction: float = setting(
        0.2,
        "`trimmed_mean`: the fraction beta cut from each end of every coordinate",
        rule=between(0, 0.5, high_open=True),
        ref="Yin et al. 2018",
    )
    krum_f: int = setting(
        2,
        "`krum`, `multi_krum`: f, the attackers assumed; a score sums the squared distances "
        "to the n - f - 2 nearest other updates (at least 1)",
        rule=between(0, MAX_CLIENTS),
        ref="Blanchard et al. 2017",
    )
    krum_m: int = setting(
        0,
        "`multi_krum`: m, the updates averaged; 0 = n - f (ours)",
        rule=between(0, MAX_CLIENTS),
        ref="Blanchard et al. 2017",
    )
    clip_norm: float = setting(
        0.0,
        "bound on each update's L2 norm (update = client model minus the model it received; "
        "a longer one is scaled down to it); 0 = off",
        rule=NON_NEGATIVE,
        ref="Sun et al. 2019 (norm bounding)",
    )
    validate_on_server: bool = setting(
        False,
        "score each client model on the server's labeled validation set and drop those whose "
        "accuracy is more than `validation_margin` below the model it received (ours)",
    )
    validation_margin: float = setting(
        0.05,
        "`validate_on_server`: the validation accuracy an update may lose and still count",
        rule=UNIT,
    )
    validation_reference: str = setting(
        "received",
        "`validate_on_server`: what a client model's accuracy is held against: `received` (the "
        "model it was sent) or `median` (the median accuracy of this round's client models, "
        "which local training lowers alike) (ours)",
        choices=("received", "median"),
    )


# What ``privacy.mode`` may be: no privacy, or clipping on the server or the clients, with a
# fixed or an adaptive clipping norm (Flower's four DP strategy wrappers).
PRIVACY_MODES = ("none", "server_fixed", "server_adaptive", "client_fixed", "client_adaptive")


@dataclass(frozen=True)
class PrivacySettings:
    """Client-level differential privacy of the clients' model updates (docs/privacy.md)."""

    mode: str = setting(
        "none",
        "`none`; `server_fixed` / `server_adaptive`: the server clips each client's update "
        "(client model minus the round's start model) to the clipping norm; `client_fixed` / "
        "`client_adaptive`: each client clips its own before sending; every mode averages the "
        "clipped models with equal weights and adds Gaussian noise of std `noise_multiplier * "
        "clipping norm / n` (n: the clients averaged); `*_adaptive`: the norm follows the "
        "quantile `target_clipped_quantile` (docs/privacy.md)",
        choices=PRIVACY_MODES,
        ref="McMahan et al. 2018 (DP-FedAvg); Andrew et al. 2021 (adaptive clipping)",
    )
    noise_multiplier: float = setting(
        1.0,
        "z: the noise's std times n (the clients averaged) over the clipping norm; 0 = no "
        "noise, no guarantee (`epsilon` null)",
        rule=NON_NEGATIVE,
        ref="McMahan et al. 2018 (DP-FedAvg)",
    )
    sampling: str = setting(
        "fixed",
        "`fixed`: `federation.clients_per_round` clients drawn without replacement each round "
        "(the accountant's Poisson analysis is the usual approximation for it); `poisson`: "
        "each client joins each round with probability q = clients_per_round / clients, the "
        "clipped updates' sum is divided by the expected count qN and the noise's std is z C "
        "/ qN (DP-FedAvg's fixed denominator), so the reported epsilon is exact; a round "
        "trains any number of clients, and one that samples none releases the global model "
        "plus the noise",
        choices=("fixed", "poisson"),
        ref="McMahan et al. 2018 (DP-FedAvg, Algorithm 1)",
    )
    accountant: str = setting(
        "rdp",
        "how `epsilon` is computed: `rdp` (Renyi DP, integer orders 2-1024) or `pld` (the "
        "privacy-loss distribution: a tighter epsilon for the same run, about 0.5 s a round "
        "on a CPU); both are dp-accounting's, for Poisson sampling at q = clients per round "
        "/ clients",
        choices=("rdp", "pld"),
        ref="Mironov 2017 (RDP); Meiser & Mohammadi 2018, Koskela et al. 2020 (PLD)",
    )
    target_epsilon: float = setting(
        0.0,
        "> 0: the epsilon to reach at `target_delta` after the run's `rounds`: the noise "
        "multiplier is solved for it (by `accountant`, at q = clients per round / clients) "
        "and replaces `noise_multiplier` in the resolved config; 0 = `noise_multiplier` as "
        "given",
        rule=NON_NEGATIVE,
        ref="Mironov 2017 (RDP accountant, dp-accounting)",
    )
    clipping_norm: float = setting(
        1.0,
        "bound on each client update's L2 norm; `*_adaptive`: the initial norm",
        rule=POSITIVE,
        ref="McMahan et al. 2018 (DP-FedAvg)",
    )
    target_delta: float = setting(
        1e-5,
        "delta at which epsilon is reported (the results rows' `epsilon`, `delta`)",
        rule=OPEN_UNIT,
        ref="Mironov 2017 (RDP accountant, dp-accounting)",
    )
    target_clipped_quantile: float = setting(
        0.5,
        "`*_adaptive`: gamma, the fraction of updates the norm should leave unclipped",
        rule=UNIT,
        ref="Andrew et al. 2021",
    )
    clip_norm_lr: float = setting(
        0.2,
        "`*_adaptive`: eta_C, the geometric learning rate of the clipping norm",
        rule=NON_NEGATIVE,
        ref="Andrew et al. 2021",
    )
    clipped_count_stddev: float = setting(
        -1.0,
        "`*_adaptive`: sigma_b, the std of the noise on the unclipped count; -1 = sampled "
        "clients / 20 (Flower's default)",
        rule=Range(-1),
        ref="Andrew et al. 2021",
    )


@dataclass(frozen=True)
class SimulationSettings:
    num_cpus: int = setting(
        1,
        "CPUs per simulated client (`client-resources-num-cpus`; a deployed node's threads)",
        rule=between(1, MAX_CPUS),
    )
    num_gpus: float = setting(
        -1.0,
        "GPU share of every simulated client's actor (`client-resources-num-gpus`; 0.25: four "
        "share a GPU; 0 hides the GPU from the clients, which then train on the CPU). -1 = "
        "auto (`ssfl/gpu.py`): 0 with `device: cpu` or when torch sees no GPU, else the GPUs "
        "divided among a round's clients (`federation.clients_per_round`, 0 = all), at most 1 "
        "each, rounded down to Ray's step of 0.0001, so a whole round trains at once. Auto "
        "does not look at memory: when a round's models do not fit one GPU together, set a "
        "larger share (fewer clients at once). -1 or in [0, 1]",
        rule=between(-1, 1),
    )
    execution: str = setting(
        "per_client",
        "`per_client`: one simulated SuperNode a client, each message one client's round; "
        "`cohort`: `workers` SuperNodes, each given the round's start model once and a list "
        "of clients that it trains one after another with each client's own seeds and state "
        "(the same numbers; fewer messages). Simulation only: a deployed SuperNode is one client",
        choices=EXECUTIONS,
    )
    workers: int = setting(
        0,
        "cohort: worker SuperNodes (0 = auto: one per `num_cpus` CPUs without a GPU, two per "
        "GPU, at most the clients)",
        rule=between(0, MAX_CLIENTS),
    )
    partial_sums: bool = setting(
        False,
        "cohort: where the aggregation is a plain mean (FedAvg, the SSFL benchmark's eq. 4-5; "
        "not with a robust `aggregate.rule`, privacy, or a round that evaluates "
        "`eval.local_models`), each worker returns one float64 sum of its clients' models "
        "instead of every model: less to send and decode (ResNet-18), but the sums round "
        "in another order, and training amplifies a float32 step into other numbers than a "
        "per-client run's within rounds; false: every model, the per-client numbers",
    )


@dataclass(frozen=True)
class EvalSettings:
    every: int = setting(
        1,
        "test-set evaluation (and the aggregate's, `aggregate_accuracy`) every this-th round "
        "and at the last; other rounds' rows carry no `test_accuracy`",
        rule=between(1, MAX_ROUNDS),
    )
    batch_size: int = setting(500, "evaluation batch size", rule=between(1, MAX_BATCH))
    local_models: bool = setting(
        False,
        "also record `local_accuracy` on every tested round (`eval.every`), the clients' "
        "trained models' mean test accuracy (FedMatch Table 2's metric)",
        ref="FedMatch Table 2",
    )
    protocol_every: int = setting(
        0,
        "FedSup 5.1.2's protocols on the global model every this-th round and at the last "
        "(0 = off): `finetune_accuracy` and `linear_accuracy` (`tasks/protocols.py`); not with "
        "`fedmatch`",
        rule=between(0, MAX_ROUNDS),
        ref="FedSup 5.1.2",
    )
    finetune_epochs: int = setting(
        5,
        "finetuning: epochs of a fresh linear head and the whole model trained end to end on "
        "the server's labels (SGD, `server.momentum`, `server.batch_size`, weak view; ours)",
        rule=between(1, MAX_EPOCHS),
    )
    finetune_lr: float = setting(0.01, "finetuning: learning rate (ours)", rule=POSITIVE)
    linear_epochs: int = setting(
        50,
        "linear evaluation: epochs of a fresh linear head on the frozen encoder's features "
        "(eval mode; ours)",
        rule=between(1, MAX_EPOCHS),
    )
    linear_lr: float = setting(0.1, "linear evaluation: learning rate (ours)", rule=POSITIVE)
    protocol_schedule: str = setting(
        "cosine",
        "both protocols' rate: `cosine` anneals it to 0 over their steps (ours: the model they "
        "end on is settled), `constant` keeps it",
        choices=("cosine", "constant"),
    )


@dataclass(frozen=True)
class AugmentSettings:
    weak_shift: float = setting(
        0.125,
        "weak view: flip (not for digits) and a shift by up to this fraction of the side "
        "(FixMatch: 0.125)",
        rule=between(0, 0.5),
    )
    engine: str = setting(
        "auto",
        "augmentation code: `kornia` (tasks/augment.py, kornia ops on each op's samples), "
        "`batched` (tasks/augment_batched.py: the same ops, drawn otherwise; no device-to-host "
        "syncs on an accelerator, each op on its own samples on the CPU, the same values), or "
        "`auto`: `batched` where the half trains on an accelerator, `kornia` on the CPU (whose "
        "views every committed table was made with; the two tie on fmnist-las)",
        choices=("auto", "kornia", "batched"),
    )


@dataclass(frozen=True)
class AlgoSettings:
    """A method's own keys (none here); each method declares a subclass."""


@dataclass(frozen=True)
class RandAugmentSettings(AlgoSettings):
    """A strong view: RandAugment with n ops of magnitude up to m (tasks.augment)."""

    randaugment_n: int = setting(
        2,
        "RandAugment ops per sample (0 = the weak view alone)",
        rule=between(0, 16),
        ref="FixMatch (Sohn et al. 2020): n = 2",
    )
    randaugment_m: float = setting(
        10.0,
        "RandAugment magnitude (of 10), drawn per sample up to it",
        rule=between(0, 10),
        ref="FixMatch: m = 10",
    )


@dataclass(frozen=True)
class ConsistencySettings(RandAugmentSettings):
    """A labels-at-server consistency method: an unlabeled-loss weight and a confidence
    threshold on the weak view's prediction."""

    lambda_u: float = setting(1.0, "weight of the unlabeled loss", rule=NON_NEGATIVE)
    threshold: float = setting(
        0.9,
        "confidence a weak-view prediction needs to become a pseudo-label",
        rule=UNIT,
        ref="FedSEAL 5.2.1: 0.9 for FixMatch and UDA",
    )


@dataclass(frozen=True)
class Settings:
    """One experiment, checked: the shared sections and the method's ``algo``."""

    method: str = setting("server_sl", "registered method name (`ssfl/registry.py`)")
    name: str = setting("", "label of the run (tables, plots, default output folder)")
    seed: int = setting(
        0,
        "seed of every random stream (split, init, sampling, batches, augmentation)",
        rule=between(0, MAX_SEED),
    )
    rounds: int = setting(50, "number of rounds", rule=between(1, MAX_ROUNDS))
    device: str = setting(
        "auto",
        "`auto` (CUDA when torch sees a GPU), `cpu`, `cuda` (insists on one: without a GPU, or "
        "with `simulation.num_gpus` 0, `ssfl run` stops with one line and exit 2 before it "
        "starts any process)",
        choices=("auto", "cpu", "cuda"),
    )
    dataset: DatasetSettings = field(default_factory=DatasetSettings)
    split: SplitSettings = field(default_factory=SplitSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    client: ClientSettings = field(default_factory=ClientSettings)
    lr_schedule: LrScheduleSettings = field(default_factory=LrScheduleSettings)
    federation: FederationSettings = field(default_factory=FederationSettings)
    aggregate: AggregateSettings = field(default_factory=AggregateSettings)
    privacy: PrivacySettings = field(default_factory=PrivacySettings)
    simulation: SimulationSettings = field(default_factory=SimulationSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    augment: AugmentSettings = field(default_factory=AugmentSettings)
    algo: AlgoSettings = field(default_factory=AlgoSettings)


# ----- Reading the declarations ----------------------------------------------------------
def nested(f: dataclasses.Field) -> type | None:
    """The section class of a nested field (``field(default_factory=Section)``), else None."""
    factory = f.default_factory
    return factory if isinstance(factory, type) and dataclasses.is_dataclass(factory) else None


def keys_of(cls: type, prefix: str = "") -> dict[str, dataclasses.Field]:
    """Every leaf key of ``cls`` by dotted name, in declaration order (``algo`` left out:
    a method's keys come from its own class)."""
    out: dict[str, dataclasses.Field] = {}
    for f in dataclasses.fields(cls):
        section = nested(f)
        if section is AlgoSettings:
            continue
        if section is not None:
            out.update(keys_of(section, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = f
    return out


def defaults_of(cls: type) -> dict[str, Any]:
    """The nested defaults of ``cls`` (``algo``: an empty mapping)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        section = nested(f)
        if section is AlgoSettings:
            out[f.name] = {}
        elif section is not None:
            out[f.name] = defaults_of(section)
        else:
            out[f.name] = f.default
    return out


def rules_of(cls: type, prefix: str = "") -> dict[str, Range]:
    """The range of every numeric key of ``cls`` that declares one."""
    found = {key: f.metadata.get("rule") for key, f in keys_of(cls, prefix).items()}
    return {key: rule for key, rule in found.items() if rule is not None}


def choices_of(cls: type, prefix: str = "") -> dict[str, tuple[str, ...]]:
    """The allowed strings of every key of ``cls`` that declares them."""
    found = {key: f.metadata.get("choices") for key, f in keys_of(cls, prefix).items()}
    return {key: allowed for key, allowed in found.items() if allowed is not None}


T = TypeVar("T")


def typed(
    cls: type[T], values: Mapping[str, Any], algo: type | Callable[[str], type] = AlgoSettings
) -> T:
    """The frozen settings object of a checked mapping. ``algo``: the method's settings
    class, or a function from the mapping's ``method`` to it (ssfl.registry.settings_of)."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        section = nested(f)
        if section is AlgoSettings:
            own = algo if isinstance(algo, type) else algo(values["method"])
            kwargs[f.name] = typed(own, values.get(f.name, {}))
        elif section is not None:
            kwargs[f.name] = typed(section, values[f.name])
        elif isinstance(f.default, tuple):
            kwargs[f.name] = tuple(values[f.name])  # a JSON round trip gives a list
        else:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)


def mapping(settings: Any) -> dict[str, Any]:
    """A settings object (or section) as the nested mapping the YAML reader checked: what
    results.json records, checkpoints compare and the clients receive."""
    return dataclasses.asdict(settings)


def scenario_keys(scenario: str) -> tuple[str, ...]:
    """The split keys that mean something only in ``scenario`` (declared with it)."""
    fields = dataclasses.fields(SplitSettings)
    return tuple(f.name for f in fields if f.metadata.get("scenario") == scenario)
