"""Where a round's time goes: every part of a method's round against its bare arithmetic.

Three measurements of the same experiment and rounds:

1. **flower**: ``ssfl run`` itself (SuperLink, simulation engine, Ray actors); its
   steady-state round is the median ``seconds`` of rounds 2..N of results.json; the
   time before round 1 split into stages (the CLI, SuperLink and submission, the
   ServerApp's launch, its data and model, node discovery, the server's bootstrap
   training) from its output lines and results.json's ``timeline``, and the shut-down.
2. **profiled**: the same rounds in this process with the real client and server halves
   (tests/harness.py's in-process grid, no Flower transport), each second attributed to
   one phase (clients, server training, aggregation, evaluation, messages: encoding the
   clients' records) and, inside a phase, to one kind: model forward, backward, optimizer
   step, augmentation (the tasks.augment modules), client set-up (data and model load)
   or other (batch gathering, losses, copies, bookkeeping). Torch runs one thread, as in
   a simulation client actor.
3. **bare**: every model pass the profiled round made (forward, with or without
   gradient, backward, optimizer step, on random batches of the recorded shapes),
   replayed with no augmentation, data or Flower; the clients' passes spread over as
   many one-thread worker processes as the simulation runs clients at once, then the
   server's passes. This is the arithmetic a round must do anyway.

``round_over_arithmetic`` = the flower steady-state round / the bare round (issue
target: <= 1.3). Prints a table and writes JSON (``--json``).

    python benchmarks/round_profile.py experiments/fmnist-las/fedseal.yaml --rounds 3 \
        --json results/round-profile/fedseal.json
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.peak_memory import tree  # noqa: E402
from ssfl.experiment import check_data, resolve_experiment  # noqa: E402
from ssfl.registry import settings_of  # noqa: E402
from tasks import augment, augment_batched  # noqa: E402
from tasks.settings import Settings  # noqa: E402
from tasks.train import keep_freed_memory, resolve_device  # noqa: E402
from tests.harness import InProcessGrid, strategy_of  # noqa: E402

# The augmentation modules of both engines (augment.engine): their calls count as augmentation.
AUGMENTERS = tuple(
    cls
    for module in (augment, augment_batched)
    for cls in vars(module).values()
    if isinstance(cls, type) and issubclass(cls, nn.Module) and cls.__module__ == module.__name__
)
PHASES = ("clients", "server training", "aggregation", "evaluation", "messages", "loop")
KINDS = ("forward", "backward", "optimizer", "augmentation", "setup", "other")

Pass = tuple[str, Any]  # ("fwd", (model key, shape, grad)) | ("bwd", None) | ("step", key)


@dataclass
class RoundTrace:
    """One profiled round: exclusive seconds per (phase, kind) and the model passes made,
    per client (partition) and for the server."""

    seconds: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    client_passes: dict[int, list[Pass]] = field(default_factory=lambda: defaultdict(list))
    server_passes: list[Pass] = field(default_factory=list)
    wall: float = 0.0


class Profiler:
    """Attributes wall time to the innermost open (phase, kind); records model passes."""

    def __init__(self) -> None:
        self.phase = "loop"
        self.kinds: list[str] = ["other"]
        self.mark = time.perf_counter()
        self.trace = RoundTrace()
        self.models: dict[str, nn.Module] = {}
        self.client: int | None = None
        self.depth = 0  # nesting of module calls: only the outermost is a pass

    def flush(self) -> None:
        now = time.perf_counter()
        self.trace.seconds[(self.phase, self.kinds[-1])] += now - self.mark
        self.mark = now

    @contextmanager
    def kind(self, name: str) -> Iterator[None]:
        self.flush()
        self.kinds.append(name)
        try:
            yield
        finally:
            self.flush()
            self.kinds.pop()

    @contextmanager
    def in_phase(self, name: str, client: int | None = None) -> Iterator[None]:
        self.flush()
        outer, outer_kinds, outer_client = self.phase, self.kinds, self.client
        self.phase, self.kinds, self.client = name, ["other"], client
        try:
            yield
        finally:
            self.flush()
            self.phase, self.kinds, self.client = outer, outer_kinds, outer_client

    def record(self, item: Pass) -> None:
        if self.client is None:
            self.trace.server_passes.append(item)
        else:
            self.trace.client_passes[self.client].append(item)

    def model_key(self, module: nn.Module) -> str:
        """A name for the module's architecture and shapes; a copy kept for the replay."""
        key = f"{type(module).__name__}:{sum(p.numel() for p in module.parameters())}"
        if key not in self.models:
            self.models[key] = copy.deepcopy(module).cpu()
        return key

    # ----- hooks -------------------------------------------------------------------
    def before_forward(self, module: nn.Module, args: tuple) -> None:
        self.depth += 1
        if self.depth > 1:
            return
        self.flush()
        self.kinds.append("augmentation" if isinstance(module, AUGMENTERS) else "forward")
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if self.kinds[-1] == "forward" and x is not None:
            shape = tuple(x.shape)
            self.record(("fwd", (self.model_key(module), shape, torch.is_grad_enabled())))

    def after_forward(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.flush()
            self.kinds.pop()

    def install(self) -> Callable[[], None]:
        """Global hooks on every module call, backward and optimizer step; returns undo."""
        handles = [
            nn.modules.module.register_module_forward_pre_hook(self.before_forward),
            nn.modules.module.register_module_forward_hook(self.after_forward),
            register_optimizer_step_pre_hook(self.before_step),
            register_optimizer_step_post_hook(self.after_step),
        ]
        tensor_backward = torch.Tensor.backward

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            self.record(("bwd", None))
            with self.kind("backward"):
                tensor_backward(tensor, *args, **kwargs)

        torch.Tensor.backward = backward  # type: ignore[method-assign]

        def undo() -> None:
            for handle in handles:
                handle.remove()
            torch.Tensor.backward = tensor_backward  # type: ignore[method-assign]

        return undo

    def before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.flush()
        self.kinds.append("optimizer")
        self.record(("step", optimizer.defaults.get("lr", 0.0)))

    def after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.flush()
        self.kinds.pop()


def wrap(obj: Any, name: str, profiler: Profiler, phase: str) -> None:
    """Run ``obj.name`` inside ``phase``."""
    original = getattr(obj, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with profiler.in_phase(phase):
            return original(*args, **kwargs)

    setattr(obj, name, wrapped)


class ProfiledGrid(InProcessGrid):
    """The in-process grid with each client's handler inside the ``clients`` phase."""

    def __init__(self, num_nodes: int, profiler: Profiler):
        super().__init__(num_nodes)
        self.profiler = profiler

    def handle(self, msg: Any) -> Any:
        pid = self.partition[msg.metadata.dst_node_id]
        with self.profiler.in_phase("clients", client=pid):
            return super().handle(msg)


def profiled_rounds(settings: Settings) -> tuple[list[RoundTrace], dict[str, nn.Module]]:
    """Run ``settings`` in this process with the profiler; one trace per round."""
    from client_app.base import ClientHalf

    profiler = Profiler()
    traces: list[RoundTrace] = []

    def on_round(row: dict) -> None:
        profiler.flush()
        profiler.trace.wall = time.perf_counter() - started[0]
        traces.append(profiler.trace)
        profiler.trace = RoundTrace()
        started[0] = time.perf_counter()

    strategy = strategy_of(settings, on_round)
    parts = strategy.parts
    if hasattr(parts.trainer, "train"):  # a server that trains (FedoSSL's does not)
        wrap(parts.trainer, "train", profiler, "server training")
    wrap(parts.trainer, "bootstrap", profiler, "server training")
    if parts.aggregator is not None:
        wrap(parts.aggregator, "aggregate", profiler, "aggregation")
    wrap(parts.evaluator, "evaluate", profiler, "evaluation")
    wrap(parts.evaluator.protocols, "evaluate", profiler, "evaluation")
    wrap(parts.codec, "encode", profiler, "messages")
    original_init = ClientHalf.__init__

    def init(half: ClientHalf, *args: Any, **kwargs: Any) -> None:
        with profiler.kind("setup"):
            original_init(half, *args, **kwargs)

    ClientHalf.__init__ = init  # type: ignore[method-assign]
    undo = profiler.install()
    grid = ProfiledGrid(settings.split.num_clients, profiler)
    try:
        with profiler.in_phase("loop"):
            strategy.parts.trainer.bootstrap()
        profiler.trace = RoundTrace()
        started = [time.perf_counter()]
        profiler.mark = started[0]
        strategy.start(grid, num_rounds=settings.rounds)
    finally:
        undo()
        ClientHalf.__init__ = original_init  # type: ignore[method-assign]
    return traces, profiler.models


def replay(
    passes: list[Pass], models: dict[str, nn.Module], ready: Callable[[], Any] = lambda: None
) -> float:
    """Seconds to redo ``passes`` on random batches: the bare arithmetic. The models'
    copies and the batches are made first; ``ready()`` is called just before the clock
    starts (a barrier, for lanes replayed side by side)."""
    torch.manual_seed(0)
    live: dict[str, nn.Module] = {k: copy.deepcopy(m) for k, m in models.items()}
    # Models without parameters of their own (FedMatch's functional calls with a helper's
    # weights) are run but never stepped: a step goes to the last model run that has some.
    optimizers = {
        k: torch.optim.SGD(params, lr=0.01, momentum=0.9)
        for k, m in live.items()
        if (params := list(m.parameters()))
    }
    # One random batch per shape, drawn before the clock starts (drawing a block's input,
    # a feature map for the SSL halves that run the encoder block by block, costs more than
    # the block itself); each pass gets a copy, as a block may change its input in place.
    batches = {arg[1]: torch.randn(arg[1]) for kind, arg in passes if kind == "fwd"}
    kept: list[torch.Tensor] = []
    last_key = next(iter(optimizers), "")
    ready()
    start = time.perf_counter()
    for kind, arg in passes:
        if kind == "fwd":
            key, shape, grad = arg
            last_key = key if key in optimizers else last_key
            with torch.set_grad_enabled(grad):
                out = live[key](batches[shape].clone())
            if grad:
                kept.append(first_tensor(out).float().mean())
        elif kind == "bwd" and kept:
            torch.stack(kept).sum().backward()
            kept = []
        elif kind == "step" and last_key in optimizers:
            optimizers[last_key].step()
            optimizers[last_key].zero_grad(set_to_none=True)
    return time.perf_counter() - start


def first_tensor(out: Any) -> torch.Tensor:
    """A model's output, or the first tensor of a tuple/list/dict of outputs."""
    if isinstance(out, torch.Tensor):
        return out
    values = out.values() if isinstance(out, dict) else out
    return next(first_tensor(v) for v in values)


def lane_worker(passes: list[Pass], models: dict[str, nn.Module], barrier: Any, out: Any) -> None:
    """One lane of the clients' replay on one thread; its seconds (or its error) to ``out``."""
    torch.set_num_threads(1)
    try:
        out.put(replay(passes, models, ready=lambda: barrier.wait(timeout=600)))
    except BaseException as err:
        barrier.abort()
        out.put(err)


def bare_round(
    trace: RoundTrace, models: dict[str, nn.Module], workers: int, server_threads: int
) -> dict[str, float]:
    """The round's passes replayed: clients over ``workers`` one-thread processes that
    start their clocks together (the slowest lane's seconds count), then the server's
    passes with ``server_threads`` threads. Process start, copies of the models and the
    random batches are left out, as they are of the server's replay."""
    lanes: list[list[Pass]] = [[] for _ in range(max(1, workers))]
    for i, pid in enumerate(sorted(trace.client_passes)):
        lanes[i % len(lanes)].extend(trace.client_passes[pid])
    clients = 0.0
    if trace.client_passes:
        ctx = multiprocessing.get_context("fork")
        barrier, out = ctx.Barrier(len(lanes)), ctx.Queue()
        procs = [ctx.Process(target=lane_worker, args=(ln, models, barrier, out)) for ln in lanes]
        for proc in procs:
            proc.start()
        seconds = [out.get() for _ in procs]
        for proc in procs:
            proc.join()
        errors = [s for s in seconds if isinstance(s, BaseException)]
        if errors:
            raise RuntimeError(f"a replay lane failed: {errors[0]!r}")
        clients = max(seconds)
    torch.set_num_threads(server_threads)
    server = replay(trace.server_passes, models)
    torch.set_num_threads(1)
    return {"clients": clients, "server": server, "total": clients + server}


def flower_run(experiment: str, rounds: int, sets: list[str]) -> dict[str, Any]:
    """``ssfl run`` as a user runs it: per-round seconds, and the time before the first
    round split into its stages (see :func:`startup_stages`)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "ssfl.cli", "run", experiment, "--rounds", str(rounds)]
        cmd += ["--out", str(Path(tmp) / "run")] + [a for s in sets for a in ("--set", s)]
        launched = time.time()
        seen: dict[str, float] = {}
        with subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc:
            sampler = CpuSampler(proc.pid)
            sampler.start()
            for line in proc.stdout:
                for mark, text in OUTPUT_MARKS.items():
                    if text in line:
                        seen.setdefault(mark, time.time())
        ended = time.time()
        sampler.stop()
        if proc.returncode:
            raise SystemExit(f"round_profile: ssfl run exited {proc.returncode}")
        results = json.loads((Path(tmp) / "run" / "results.json").read_text())
    seconds = [r["seconds"] for r in results["rounds"]]
    wall = ended - launched
    marks = {**seen, **results["timeline"]}
    return {
        "round_seconds": seconds,
        "steady_round_s": steady(seconds),
        "outside_rounds_s": wall - sum(seconds),
        "wall_s": wall,
        "startup": startup_stages(launched, marks, ended),
        "startup_cpu": sampler.cpu_until(marks.get("nodes_found", ended), launched),
        "steady_cpu": steady_cpu(sampler, marks, len(seconds)),
    }


def steady_cpu(sampler: CpuSampler, marks: dict[str, float], rounds: int) -> dict[str, Any] | None:
    """CPU by process kind over the steady rounds (the first round's end to the last's),
    with its seconds per round; None for a run of one round."""
    since, until = marks.get("first_round_ended"), marks.get("rounds_ended")
    if rounds < 2 or since is None or until is None or until <= since:
        return None
    cpu = sampler.cpu_between(since, until)
    per_round = {kind: sec / (rounds - 1) for kind, sec in cpu["by_kind"].items()}
    return {**cpu, "per_round_by_kind": per_round}


# What a process of the run is, by a piece of its command line (first match).
PROCESS_KINDS = (
    ("ssfl.cli", "ssfl CLI"),
    ("ssfl.ray_head", "Ray head (driver)"),
    ("flower-superlink", "SuperLink"),
    ("flower-superexec", "SuperExec"),
    ("flwr-simulation", "simulation (ServerApp, Ray driver)"),
    ("flwr run", "flwr run"),
    ("gcs_server", "Ray GCS"),
    ("raylet", "raylet"),
    ("log_monitor", "Ray log monitor"),
    ("monitor.py", "Ray autoscaler monitor"),
    ("dashboard.py", "Ray API server"),
    ("DashboardAgent", "Ray dashboard agent"),
    ("RuntimeEnvAgent", "Ray runtime-env agent"),
    ("ClientAppActor", "client actors"),
)


def process_kind(cmdline: str) -> str:
    """The kind of a process of the run (``other`` when none matches)."""
    return next((kind for key, kind in PROCESS_KINDS if key in cmdline), "other")


def process_cpu(pid: int) -> tuple[str, float] | None:
    """(kind, CPU seconds used so far) of a live process; None once it has gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmdline = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except (OSError, IndexError):
        return None
    return process_kind(cmdline), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """The CPU seconds of a process tree, sampled every ``every`` seconds in a thread (a
    process keeps its last sample once it has exited)."""

    def __init__(self, root: int, every: float = 0.2) -> None:
        self.root, self.every = root, every
        self.samples: list[tuple[float, dict[int, tuple[str, float]]]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.every):
            seen = {pid: process_cpu(pid) for pid in tree(self.root)}
            self.samples.append((time.time(), {p: v for p, v in seen.items() if v is not None}))

    def last_before(self, until: float) -> dict[int, tuple[str, float]]:
        """Each process's (kind, CPU seconds) at its last sample before ``until``."""
        last: dict[int, tuple[str, float]] = {}
        for at, seen in self.samples:
            if at > until:
                break
            last.update(seen)
        return last

    def cpu_until(self, until: float, since: float) -> dict[str, Any]:
        """CPU seconds by process kind up to the last sample before ``until``, their sum, and
        the cores they kept busy on average since ``since``."""
        return cpu_summary(self.last_before(until).values(), until - since)

    def cpu_between(self, since: float, until: float) -> dict[str, Any]:
        """As :meth:`cpu_until`, counting only the CPU used between the last samples before
        ``since`` and before ``until`` (a process that started in between counts whole)."""
        before = self.last_before(since)
        used = [
            (kind, cpu - before.get(pid, (kind, 0.0))[1])
            for pid, (kind, cpu) in self.last_before(until).items()
        ]
        return cpu_summary(used, until - since)


def cpu_summary(used: Iterable[tuple[str, float]], seconds: float) -> dict[str, Any]:
    """(kind, CPU seconds) pairs summed by kind, largest first, with their total and the
    cores they kept busy on average over ``seconds``."""
    by_kind: dict[str, float] = {}
    for kind, cpu in used:
        by_kind[kind] = by_kind.get(kind, 0.0) + cpu
    total = sum(by_kind.values())
    ordered = dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))
    return {"cpu_s": total, "cores_busy": total / max(seconds, 1e-9), "by_kind": ordered}


# Lines of ``ssfl run``'s output that end a start-up stage.
OUTPUT_MARKS = {"cli_ready": "ssfl: ", "run_submitted": "Successfully started run"}

# Start-up stages in order: (name, the timeline mark that ends it).
STAGES = (
    ("cli", "cli_ready"),  # interpreter, imports, the config and its split summary
    ("superlink_and_submit", "run_submitted"),  # SuperLink up, the app staged and submitted
    ("serverapp_launch", "server_main"),  # the ServerApp's process and imports
    ("server_setup", "server_built"),  # the server's data, split and model
    ("node_discovery", "nodes_found"),  # simulation engine, actors, the clients' data
    ("bootstrap", "first_round"),  # server.bootstrap_epochs: training, not overhead
)


def startup_stages(launched: float, marks: dict[str, float], ended: float) -> dict[str, float]:
    """Seconds of each start-up stage, ``to_first_round_s`` (all of them but the bootstrap's
    training: issue 21's start-up) and ``shutdown_s`` (the last round to the exit)."""
    out, before = {}, launched
    for name, mark in STAGES:
        at = marks.get(mark, before)
        out[f"{name}_s"] = at - before
        before = at
    out["to_first_round_s"] = before - launched - out["bootstrap_s"]
    out["shutdown_s"] = ended - marks["finished"]
    return out


def steady(values: list[float]) -> float:
    """The median of rounds 2..N (round 1 alone when N = 1)."""
    return statistics.median(values[1:] or values)


def median_trace(traces: list[RoundTrace]) -> RoundTrace:
    """The round of median wall time among rounds 2..N (round 1 alone when N = 1): the
    round whose passes the bare loop replays (with eval.every, a round that evaluates
    only when most do)."""
    rounds = sorted(traces[1:] or traces, key=lambda t: t.wall)
    return rounds[(len(rounds) - 1) // 2]


def phase_table(traces: list[RoundTrace]) -> dict[str, dict[str, float]]:
    """Mean exclusive seconds per phase and kind over the steady rounds (2..N)."""
    rounds = traces[1:] or traces
    table: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        row = {k: statistics.mean(t.seconds.get((phase, k), 0.0) for t in rounds) for k in KINDS}
        if any(row.values()):
            table[phase] = row
    return table


def markdown(report: dict[str, Any]) -> str:
    """The report as a markdown table plus the headline ratios."""
    lines = ["| phase | " + " | ".join(KINDS) + " | total |", "|---" * (len(KINDS) + 2) + "|"]
    for phase, row in report["profiled"]["phases"].items():
        cells = " | ".join(f"{row[k]:.2f}" for k in KINDS)
        lines.append(f"| {phase} | {cells} | {sum(row.values()):.2f} |")
    flower, bare = report["flower"], report["bare"]
    lines += [
        "",
        f"profiled round (in process, steady): {report['profiled']['steady_round_s']:.2f} s",
        f"flower round (ssfl run, steady): {flower['steady_round_s']:.2f} s; "
        f"outside rounds (start-up + shut-down): {flower['outside_rounds_s']:.1f} s",
        startup_line(flower),
        f"bare arithmetic: {bare['total']:.2f} s (clients {bare['clients']:.2f} s on "
        f"{report['parallel_clients']} processes, server {bare['server']:.2f} s)",
        f"round_over_arithmetic: {report['round_over_arithmetic']:.2f}",
    ]
    cpu = flower.get("steady_cpu")
    if cpu:
        kinds = ", ".join(f"{k} {v:.2f}" for k, v in cpu["per_round_by_kind"].items())
        lines.append(f"steady rounds' CPU a round, s ({cpu['cores_busy']:.2f} cores busy): {kinds}")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("experiment")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument(
        "--flower-from",
        type=Path,
        default=None,
        help="take the `ssfl run` part from this earlier report of the same experiment, "
        "rounds and --set (measure only the in-process and bare parts)",
    )
    parser.add_argument(
        "--startup-only",
        action="store_true",
        help="measure only the `ssfl run` part and report its start-up stages",
    )
    return parser.parse_args()


def earlier_flower(path: Path, experiment: str, rounds: int, sets: list[str]) -> dict[str, Any]:
    """The ``flower`` part of an earlier report, refused unless it profiled the same run."""
    report = json.loads(path.read_text())
    same = (report.get("experiment"), report.get("rounds"), report.get("sets"))
    if same != (experiment, rounds, sets):
        raise SystemExit(f"round_profile: {path} profiled {same}, not {(experiment, rounds, sets)}")
    return report["flower"]


def startup_line(flower: dict[str, Any]) -> str:
    """The start-up stages of an ``ssfl run`` part, one line, and the CPU they used (when
    sampled) on another."""
    line = "start-up: " + ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in flower["startup"].items())
    cpu = flower.get("startup_cpu")
    if cpu:
        kinds = ", ".join(f"{kind} {sec:.1f}" for kind, sec in cpu["by_kind"].items())
        line += (
            f"\nstart-up CPU: {cpu['cpu_s']:.1f} s ({cpu['cores_busy']:.2f} cores busy "
            f"on average of {os.cpu_count()}): {kinds}"
        )
    return line


def startup_report(experiment: str, rounds: int, sets: list[str], out: Path | None) -> None:
    """``--startup-only``: run ``ssfl run`` once, print (and write) its start-up stages."""
    flower = flower_run(experiment, rounds, sets)
    print(startup_line(flower))
    if out:
        report = {"experiment": experiment, "rounds": rounds, "sets": sets, "flower": flower}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")


def main() -> None:
    args = parse_args()
    if args.rounds < 1:
        raise SystemExit("round_profile: --rounds must be >= 1")
    settings = settings_of(resolve_experiment(args.experiment, args.rounds, None, args.sets))
    if resolve_device(settings.device).type != "cpu":
        raise SystemExit("round_profile: profiles CPU runs only (set device: cpu)")
    check_data(settings)
    if args.startup_only:
        startup_report(args.experiment, args.rounds, args.sets, args.json)
        return
    keep_freed_memory()  # as the ServerApp and ClientApps do
    cores = os.cpu_count() or 1
    parallel = max(
        1,
        min(
            settings.federation.clients_per_round or settings.split.num_clients,
            cores // settings.simulation.num_cpus,
        ),
    )
    if args.flower_from is None:
        flower = flower_run(args.experiment, args.rounds, args.sets)
    else:
        flower = earlier_flower(args.flower_from, args.experiment, args.rounds, args.sets)
    torch.set_num_threads(1)
    traces, models = profiled_rounds(settings)
    steady_trace = median_trace(traces)
    bare = bare_round(steady_trace, models, parallel, cores)
    report = {
        "experiment": args.experiment,
        "method": settings.method,
        "rounds": args.rounds,
        "sets": args.sets,
        "cores": cores,
        "parallel_clients": parallel,
        "flower": flower,
        "profiled": {
            "round_seconds": [t.wall for t in traces],
            "steady_round_s": steady([t.wall for t in traces]),
            "phases": phase_table(traces),
            "passes": {
                "clients": sum(len(p) for p in steady_trace.client_passes.values()),
                "server": len(steady_trace.server_passes),
            },
        },
        "bare": bare,
        "round_over_arithmetic": flower["steady_round_s"] / bare["total"],
    }
    print(markdown(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
