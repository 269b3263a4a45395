"""Experiments as library functions: resolve a YAML with overrides and the method's own
defaults and checks, check its data, compare two configs, name its output folder.

Used by the command line, reproduce, sweep, the ServerApp and the benchmarks.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.supercore.differential_privacy import compute_adaptive_noise_params

from ssfl.registry import METHODS, method
from ssfl.run_lock import busy_out, running_pid
from tasks.checkpoint import CHECKPOINT_FILE
from tasks.config import (
    DEFAULTS,
    ConfigError,
    data_root,
    deep_merge,
    flatten,
    parse_overrides,
    read_yaml,
    resolve,
)
from tasks.results import completed, load_results
from tasks.settings import (
    ClientSettings,
    ModelSettings,
    Settings,
    choices_of,
    defaults_of,
    mapping,
    rules_of,
    typed,
)

# The installed app: its shipped experiments are found from any folder.
APP_DIR = Path(__file__).resolve().parents[1]

# Client options a client half may leave out of its ``honours`` set, with the value
# that means "off": any other value is refused for such a method.
CLIENT_OPTIONS: dict[str, Any] = {
    "client.local_steps": 0,
    "lr_schedule.name": "exponential",
    "client.keep_momentum": False,
    "client.nesterov": False,
    "client.proximal_mu": 0.0,
    "client.optimizer": "sgd",
    "train.compile": "off",
}

# Keys that say where and how a run executes, not what it computes.
EXECUTION_KEYS = (
    "dataset.root",
    "federation.min_clients",
    "federation.timeout_s",
    "federation.max_failed_rounds",
    "federation.checkpoint_every",
    "simulation.num_cpus",
    "simulation.num_gpus",
)
# Keys that act in cohort execution only: a per-client run's config compares without them.
COHORT_KEYS = ("simulation.workers", "simulation.partial_sums")


def resolve_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a raw experiment mapping: defaults, types, ranges, the method's checks."""
    from tasks.data import DATASETS, dataset_info
    from tasks.models import MODELS, check_head_size

    name = raw.get("method", DEFAULTS["method"])
    spec = method(name)
    server, algo = spec.server_half(), spec.settings_class()
    choices = {
        "dataset.name": tuple(sorted(DATASETS)),
        "model.name": tuple(sorted(MODELS)),
        **choices_of(algo, "algo."),
    }
    own = deep_merge(server.defaults(), {"algo": defaults_of(algo)})
    cfg = resolve(raw, own, choices, rules_of(algo, "algo."))
    settings = typed(Settings, cfg, algo)
    if settings.privacy.target_epsilon > 0 and settings.privacy.mode != "none":
        cfg["privacy"]["noise_multiplier"] = noise_for_target(settings)
        settings = typed(Settings, cfg, algo)
    check_head_size(settings.model.head_size, dataset_info(settings.dataset.name).num_classes)
    check_client_options(name, cfg, spec.client_half())
    check_ssl_heads(name, settings.model, server.ssl_heads)
    if settings.split.scenario == "open_world" and not server.open_world:
        raise ConfigError(
            f"config key 'split.scenario': method {name!r} does not train on the open_world "
            "split (fedossl does)"
        )
    server.check_config(settings)
    check_clients_train(name, settings.client, spec.client_half())
    check_attack(name, settings, spec.client_half())
    check_robust(name, settings, server.averages_models)
    check_privacy(name, settings, server.privacy_refusal)
    return cfg


def check_attack(name: str, settings: Settings, client: Any) -> None:
    """Refuse an attack kind the method's client half cannot apply."""
    kind = settings.federation.attack.kind
    can = () if client is None else sorted(client.attacks)
    if kind != "none" and kind not in can:
        raise ConfigError(
            f"config key 'federation.attack.kind': method {name!r}'s clients cannot apply "
            f"{kind!r} (they can: {', '.join(can) or 'none'})"
        )


def check_robust(name: str, settings: Settings, averages_models: bool) -> None:
    """Refuse the robust aggregation options for a method whose aggregation is not a model
    average; validation on the server needs a validation set."""
    changed = [
        f"aggregate.{key}"
        for key, off in (("rule", "mean"), ("clip_norm", 0.0), ("validate_on_server", False))
        if getattr(settings.aggregate, key) != off
    ]
    if changed and not averages_models:
        raise ConfigError(
            f"config key '{changed[0]}': method {name!r} does not aggregate by averaging "
            "models; leave aggregate.* at its defaults"
        )
    if settings.aggregate.validate_on_server and settings.split.val_size == 0:
        raise ConfigError(
            "config key 'aggregate.validate_on_server': needs the server's validation set "
            "(split.val_size > 0)"
        )


def noise_for_target(settings: Settings) -> float:
    """privacy.target_epsilon's noise multiplier for this run's sampling rate and rounds."""

    p = settings.privacy
    sampled = settings.federation.clients_per_round or settings.split.num_clients
    rate = min(1.0, sampled / settings.split.num_clients)
    return cached_noise(
        p.target_epsilon, rate, settings.rounds, p.target_delta, p.accountant, p.noise_multiplier
    )


@functools.lru_cache(maxsize=64)
def cached_noise(
    target: float, rate: float, rounds: int, delta: float, accountant: str, guess: float
) -> float:
    """tasks.privacy.noise_for_epsilon, once per process for each setting (a table's cells
    resolve the same config many times); a resolved config's z (the guess) is checked, not
    solved again."""
    from tasks.privacy import noise_for_epsilon

    return noise_for_epsilon(target, rate, rounds, delta, accountant, guess)


def check_privacy(name: str, settings: Settings, refusal: str) -> None:
    """Refuse privacy.mode for a method whose clients send no dense model update (its
    ``privacy_refusal`` says why) and the options the DP mean's noise does not cover."""
    p = settings.privacy
    if p.mode == "none":
        for key, off in (("target_epsilon", 0.0), ("sampling", "fixed")):
            if getattr(p, key) != off:
                raise ConfigError(
                    f"config key 'privacy.{key}': means nothing without a privacy.mode; set "
                    f"one (e.g. server_fixed) or leave it at {off}"
                )
        return
    if refusal:
        raise ConfigError(f"config key 'privacy.mode': method {name!r} {refusal}")
    for key, off in (("rule", "mean"), ("clip_norm", 0.0), ("validate_on_server", False)):
        if getattr(settings.aggregate, key) != off:
            raise ConfigError(
                f"config key 'aggregate.{key}': privacy.mode calibrates its noise to the mean "
                "of the clipped updates; leave aggregate.* at its defaults"
            )
    if settings.eval.local_models:
        raise ConfigError(
            "config key 'eval.local_models': it evaluates each client's un-noised model, "
            "which privacy.mode does not cover; set it to false"
        )
    if -1 < p.clipped_count_stddev < 0:
        raise ConfigError("config key 'privacy.clipped_count_stddev': -1 (auto) or >= 0")
    if p.mode.endswith("adaptive"):
        sampled = settings.federation.clients_per_round or settings.split.num_clients
        given = None if p.clipped_count_stddev < 0 else p.clipped_count_stddev
        try:
            compute_adaptive_noise_params(p.noise_multiplier, sampled, given)
        except ValueError:
            raise ConfigError(
                "config key 'privacy.clipped_count_stddev': the adaptive modes need it above "
                f"noise_multiplier / 2 (auto: sampled clients / 20 = {sampled / 20:g})"
            ) from None


def check_clients_train(name: str, half: ClientSettings, client: Any) -> None:
    """Refuse a round in which a method's clients would not train at all."""
    if client is not None and half.epochs == 0 and half.local_steps == 0:
        raise ConfigError(
            f"config keys 'client.epochs' and 'client.local_steps': {name!r} trains on its "
            "clients; one of them must be > 0"
        )


def check_ssl_heads(name: str, model: ModelSettings, trained: frozenset[str]) -> None:
    """Refuse a projector or predictor the method would carry but never train."""
    for key in ("projector_dim", "predictor_dim"):
        if getattr(model, key) and f"model.{key}" not in trained:
            raise ConfigError(
                f"config key 'model.{key}': method {name!r} does not train one; set it to 0"
            )


def check_client_options(name: str, cfg: Mapping[str, Any], client: Any) -> None:
    """Refuse a client option the method's client half does not honour."""
    if client is None:
        return
    flat = flatten(cfg)
    for key, off in CLIENT_OPTIONS.items():
        if flat[key] != off and key not in client.honours:
            raise ConfigError(
                f"config key '{key}': method {name!r} does not honour it on its clients; "
                f"set it to {off!r}"
            )


def find_experiment(path: str | Path) -> Path:
    """The experiment file ``path`` names: as given (relative to the current folder), else a
    shipped one: relative to the installed app, or to its experiments/ folder, ``.yaml``
    optional (``fmnist-las/fedseal``). A folder is a one-line ConfigError listing its YAMLs."""
    given = Path(path)
    candidates = [given]
    if not given.is_absolute():
        bases = (APP_DIR / given, APP_DIR / "experiments" / given)
        candidates += [c for base in bases for c in (base, base.with_name(base.name + ".yaml"))]
    found = next((c for c in candidates if c.is_file()), None)
    if found is not None:
        return found
    folder = next((c for c in candidates if c.is_dir()), None)
    if folder is not None:
        names = ", ".join(sorted(f.name for f in folder.glob("*.yaml"))) or "none"
        raise ConfigError(
            f"{path} is a folder; give one experiment YAML in it (there: {names}), "
            f"e.g. ssfl run {given / 'NAME.yaml'}"
        )
    raise ConfigError(
        f"experiment file not found: {path} (neither here nor among the shipped experiments "
        f"in {APP_DIR / 'experiments'})"
    )


def experiments_of(name: str) -> list[str]:
    """The shipped experiment files (relative to the app) whose method is ``name``."""
    found = []
    for path in sorted((APP_DIR / "experiments").rglob("*.yaml")):
        try:
            raw = read_yaml(path)
        except ConfigError:
            continue
        if raw.get("method") == name:
            found.append(str(path.relative_to(APP_DIR)))
    return found


def method_swap_hint(path: str | Path, own: str, wanted: Any) -> str:
    """What to say when --set method=``wanted`` on an experiment of method ``own`` fails."""
    files = experiments_of(str(wanted))
    shipped = f"its experiments: {', '.join(files)}" if files else "no shipped experiment uses it"
    return (
        f"{path} is a {own} experiment and another method means another experiment file "
        f"(method {wanted!r}: {shipped})"
    )


def read_experiment(path: str | Path) -> dict[str, Any]:
    """The raw mapping of experiment ``path`` (see :func:`find_experiment`), which must name
    its method; cheap (no torch), so the command line checks it before starting anything."""
    raw = read_yaml(find_experiment(path))
    if "method" not in raw:
        raise ConfigError(
            f"{path}: an experiment must name its method, e.g. 'method: fedseal' "
            f"(known: {', '.join(sorted(METHODS))})"
        )
    return raw


def resolve_experiment(
    path: str | Path, rounds: int | None = None, nodes: int | None = None, sets: list[str] = ()
) -> dict[str, Any]:
    """YAML + --rounds/--nodes/--set, validated, with the data folder made absolute.

    The YAML must name its method; when ``--set method=X`` makes it fail, the error says
    which experiment files exist for X."""
    raw = read_experiment(path)
    own = raw["method"]
    if rounds is not None:
        raw = deep_merge(raw, {"rounds": rounds})
    if nodes is not None:
        raw = deep_merge(raw, {"split": {"num_clients": nodes}})
    raw = deep_merge(raw, parse_overrides(list(sets)))
    try:
        cfg = resolve_config(raw)
    except ConfigError as err:
        if raw["method"] == own:
            raise
        raise ConfigError(f"{err}; {method_swap_hint(path, own, raw['method'])}") from err
    cfg["dataset"]["root"] = str(data_root(cfg["dataset"]["root"]))
    return cfg


def from_run_config(run_config: Mapping[str, Any], app_dir: Path) -> dict[str, Any]:
    """The experiment of a Flower run: ``experiment`` (relative to the app) plus ``overrides``."""
    path = Path(str(run_config.get("experiment", "")))
    if not path.is_absolute():
        path = app_dir / path
    raw = deep_merge(read_yaml(path), parse_overrides(str(run_config.get("overrides", ""))))
    return resolve_config(raw)


def check_data(settings: Settings) -> dict[str, Any]:
    """Load the dataset and build the split now, so bad data fails before any training."""
    from tasks.partition import get_split

    _, split = get_split(settings)
    return split.summary


def same_config(recorded: Mapping[str, Any], settings: Settings) -> bool:
    """Whether a results.json's config is this config (execution keys aside)."""
    return not config_differences(recorded, settings)


def config_differences(recorded: Mapping[str, Any], settings: Settings) -> list[str]:
    """The dotted keys whose values differ between a recorded config and ``settings``, execution
    keys aside (["<recorded config>"] when the recorded one no longer resolves).

    The recorded config is resolved again first, so keys added to the defaults since
    the run compare equal when the new config keeps their default value.
    """
    try:
        recorded = resolve_config(json.loads(json.dumps(recorded)))
    except ConfigError:
        return ["<recorded config>"]

    def comparable(c: Mapping[str, Any]) -> dict[str, Any]:
        flat = flatten(json.loads(json.dumps(c)))
        unused = COHORT_KEYS if flat.get("simulation.execution") != "cohort" else ()
        flat["augment.engine"] = engine_in_effect(flat["augment.engine"], flat["device"])
        return {k: v for k, v in flat.items() if k not in EXECUTION_KEYS + unused}

    old, new = comparable(recorded), comparable(mapping(settings))
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def engine_in_effect(engine: str, device: str) -> str:
    """The augmentation engine a run of this config augments with on this machine: ``auto``
    resolved (kornia without a GPU), so that a run recorded with ``kornia``, the default
    before ``auto``, is the same config as ``auto`` on a CPU."""
    from ssfl.gpu import gpu_count
    from tasks.augment import concrete_engine

    on_gpu = device == "cuda" or (device == "auto" and gpu_count() > 0)
    return concrete_engine(engine, "cuda" if on_gpu else "cpu")


def check_resumable(out: Path, settings: Settings) -> int:
    """The round a run in ``out`` can resume from with ``settings`` (its checkpoint's); a
    ConfigError when there is no readable checkpoint or its config differs (keys named)."""
    path = Path(out) / CHECKPOINT_FILE
    checkpoint = run_checkpoint(
        path,
        settings,
        "--resume",
        "resume needs the --out of a run that completed a round",
        "resume with the same experiment and options, or start over without --resume",
    )
    return int(checkpoint["round"])


def run_checkpoint(
    path: Path, settings: Settings, who: str, missing_hint: str, differ_hint: str
) -> dict[str, Any]:
    """The checkpoint at ``path`` when it was written by a run of ``settings`` (execution keys
    aside); otherwise a one-line ConfigError, prefixed by ``who``, naming the keys."""
    from tasks.checkpoint import CheckpointError, load_checkpoint

    try:
        checkpoint = load_checkpoint(path)
    except CheckpointError as err:
        raise ConfigError(f"{who}: {err}; {missing_hint}") from err
    differ = config_differences(json.loads(checkpoint["config"]), settings)
    if differ:
        raise ConfigError(
            f"{who}: the config differs from the checkpoint's ({path}) in {', '.join(differ)}; "
            f"{differ_hint}"
        )
    return checkpoint


def kept_checkpoint_state(path: Path, settings: Settings) -> dict[str, Any]:
    """A kept checkpoint (federation.checkpoint_every) a benchmark's ``--checkpoint`` names,
    when a run of ``settings`` wrote it; otherwise a one-line ConfigError."""
    return run_checkpoint(
        Path(path),
        settings,
        "--checkpoint",
        "give a checkpoint a run of this experiment wrote",
        "give the experiment and --set options of the run that wrote it",
    )


def reusable(results: Mapping[str, Any], settings: Settings) -> bool:
    """Whether a results.json is of a completed run of this config (sweep and reproduce
    reuse such a run instead of training again)."""
    return completed(results) and same_config(results.get("config", {}), settings)


def reusable_run(out: Path, settings: Settings) -> dict[str, Any] | None:
    """The results of ``out`` when :func:`reusable` for ``settings``; None when there are none
    or they are of another config or an unfinished run."""
    if not (out / "results.json").is_file():
        return None
    results = load_results(out)
    return results if reusable(results, settings) else None


def default_out(settings: Settings) -> Path:
    """runs/<name or method>-<time> under the current directory."""
    label = settings.name or settings.method
    return Path("runs") / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_out_path(out: Path) -> None:
    """A one-line ConfigError when ``out`` cannot be a folder (it, or a folder above it,
    is a file)."""
    for path in (out, *out.parents):
        if path.exists() and not path.is_dir():
            what = "is a file" if path == out else f"is under the file {path}"
            raise ConfigError(f"--out {out} {what}; choose a folder")


def held_run(out: Path) -> str | None:
    """What the run in ``out`` is, in words (method, rounds done, status); None when ``out``
    holds no run (no results.json, no checkpoint). Reads no checkpoint (no torch)."""
    results_file, checkpoint = out / "results.json", out / CHECKPOINT_FILE
    if results_file.is_file():
        try:
            results = json.loads(results_file.read_text())
        except (OSError, ValueError):
            return "a run with an unreadable results.json"
        done = len(results.get("rounds") or [])
        total = (results.get("config") or {}).get("rounds", "?")
        return (
            f"a {results.get('method', '?')} run ({results.get('status', 'completed')}, "
            f"{done} of {total} rounds done)"
        )
    if checkpoint.is_file():
        metrics = out / "metrics.jsonl"
        done = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
        return f"a killed run (a checkpoint, {done} rounds in metrics.jsonl, no results.json)"
    return None


def check_not_running(out: Path, what: str = "--out") -> None:
    """A one-line ConfigError when a run goes on in ``out`` (another command holds its lock:
    ssfl.run_lock.holding_out), whatever --resume or --overwrite say."""
    pid = running_pid(out)
    if pid is not None:
        raise ConfigError(busy_out(out, pid, what))


def check_out(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse, in one line, an ``--out`` that cannot be a folder, or that holds a run when
    neither ``resume`` nor ``overwrite`` says what to do with it."""
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other; give one")
    check_out_path(out)
    check_not_running(out)
    held = held_run(out)
    if held is not None and not resume and not overwrite:
        raise ConfigError(
            f"--out {out} holds {held}; continue it with --resume, replace it with "
            "--overwrite, or choose another --out"
        )


@dataclass(frozen=True)
class CellFolders:
    """What ``sweep`` and ``reproduce`` do with a cell folder that holds a run they cannot
    reuse: continue it (``resume``), replace it (``overwrite``), else refuse.
    ``check_only``: decide, run nothing (the pass over every cell before any runs)."""

    resume: bool = False
    overwrite: bool = False
    check_only: bool = False

    def action(self, out: Path, settings: Settings) -> str:
        """'resume' or 'run' for a cell whose folder holds no reusable run of ``settings``; a
        one-line ConfigError when it holds another run and no flag says what to do."""
        check_out_path(out)
        check_not_running(out, "cell folder")
        held = held_run(out)
        if held is None or self.overwrite:
            return "run"
        if self.resume:
            check_resumable(out, settings)
            return "resume"
        raise ConfigError(
            f"cell folder {out} holds {held}; continue it with --resume, replace it with "
            "--overwrite, or choose another --out"
        )


# Cell folders holding another run are refused (the default of sweep and reproduce).
REFUSE = CellFolders()
