"""Device-to-host syncs of one steady client step, per method, counted on the CPU.

Each method runs tests/test_options.py's tiny synthetic experiment (a bootstrapped model,
its per-method settings; every client trained every round, two local steps of 16 images)
for two rounds in this process, with the real server and client halves and the method's
real augmentation. Round 1 warms up (lazy init, caches, first-round branches); in round 2
partition 0's whole client round (building its half from the message, training, the
reply) runs under tasks.syncs.SyncCounter, and its syncs over the local steps it ran are
``syncs_per_step``. The steps are the round's ``local_steps`` metric, or the optimizer
steps it took where a half reports none (FedSEAL, FedMatch). server_sl has no client: its
server's round-2 training is counted instead (``part: server``).

A sync on a CPU run is an op that would make the host wait for an accelerator (see
SyncCounter); ``host_copies`` (``.cpu()``, ``.tolist()``: on an accelerator a blocking
read each, on a CPU run counted for any tensor) are counted apart and left out of
``syncs_per_step``. Per-round work (the augmentation of a round's images, up to
tasks.augment.AUGMENT_GROUP a call; the metrics) is spread over the round's steps, so a
longer round or a larger batch changes the per-step figure.

    python benchmarks/host_syncs.py --json results/host-syncs.json [--methods a,b] \
        [--engine batched|kornia|auto]

By default the augmentation is the batched engine, which ``augment.engine: auto`` runs on an
accelerator (on this CPU run ``auto`` would pick kornia).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from flwr.app import Message, MessageType
from torch.optim.optimizer import register_optimizer_step_post_hook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client_app import app as client_app  # noqa: E402
from ssfl.registry import METHODS  # noqa: E402
from strategies.loop import RoundLoop  # noqa: E402
from tasks.augment import concrete_engine  # noqa: E402
from tasks.results import host  # noqa: E402
from tasks.settings import AugmentSettings, choices_of  # noqa: E402
from tasks.syncs import SyncCounter  # noqa: E402
from tests.harness import InProcessGrid, build_strategy  # noqa: E402
from tests.test_options import raw_for  # noqa: E402

STEPS = 2  # local steps a round (tests/test_options.py: 32 images a client, 16 a batch)
COUNTED_ROUND = 2
COUNTED_PARTITION = 0
TOP_OPS = 3  # ops named on a table line
ACCELERATOR_ENGINE = concrete_engine("auto", "cuda")  # what a GPU run augments with


def experiment(name: str, engine: str | None = None) -> dict[str, Any]:
    """tests/test_options.py's tiny experiment of ``name`` for the counted rounds: a
    bootstrapped model confident enough for pseudo-labels and complementary labels (without
    normalisation layers: with BatchNorm its bootstrap learns nothing in 20 epochs), its
    per-method settings (FedoSSL's calibration from round 1), ``STEPS`` local steps a round
    (client.local_steps where the client half honours it, else one epoch of that many
    batches); ``engine``: augment.engine (None: the config's)."""
    raw = {**raw_for(name), "rounds": COUNTED_ROUND, "device": "cpu"}
    if engine is not None:
        raw["augment"] = {**raw.get("augment", {}), "engine": engine}
    client = METHODS[name].client_half()
    if client is not None and "client.local_steps" in client.honours:
        raw["client"] = {**raw["client"], "epochs": 0, "local_steps": STEPS}
    return raw


@dataclass
class Count:
    """What ran under the counter: its syncs and host copies, and its optimizer steps."""

    syncs: SyncCounter
    optimizer_steps: int = 0


@contextmanager
def counting() -> Iterator[Count]:
    """Count the syncs, host copies (with where they come from) and optimizer steps of the
    code run inside."""
    count = Count(SyncCounter(sites=True))

    def stepped(*_: Any) -> None:
        count.optimizer_steps += 1

    handle = register_optimizer_step_post_hook(stepped)
    try:
        with count.syncs:
            yield count
    finally:
        handle.remove()


def summary(count: Count, steps: int, steps_from: str, part: str) -> dict[str, Any]:
    """A method's JSON entry."""

    def by_site(sites: Counter[tuple[str, str]]) -> dict[str, int]:
        return {f"{op} @ {where}": n for (op, where), n in sites.most_common()}

    syncs = count.syncs
    return {
        "part": part,
        "syncs_per_step": round(syncs.total / steps, 3) if steps else None,
        "steps": steps,
        "steps_from": steps_from,
        "syncs": syncs.total,
        "ops": dict(syncs.counts.most_common()),
        "sites": by_site(syncs.sites),
        "host_copies": dict(syncs.host_copies.most_common()),
        "host_copy_sites": by_site(syncs.host_copy_sites),
    }


class CountingGrid(InProcessGrid):
    """The in-process grid, with partition 0's round-2 training under the counter. A
    client that fails raises (the harness's grid would answer with an error reply)."""

    def __init__(self, num_nodes: int) -> None:
        super().__init__(num_nodes)
        self.result: dict[str, Any] | None = None

    def handle(self, msg: Message) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN:
            return super().handle(msg)
        nid = msg.metadata.dst_node_id
        counted = (
            int(msg.content["config"]["round"]) == COUNTED_ROUND
            and self.partition[nid] == COUNTED_PARTITION
        )
        if not counted:
            return client_app.train(msg, self.contexts[nid])
        with counting() as count:
            reply = client_app.train(msg, self.contexts[nid])
        metrics = reply.content["metrics"]
        if "local_steps" in metrics:
            steps, steps_from = int(metrics["local_steps"]), "local_steps"
        else:
            steps, steps_from = count.optimizer_steps, "optimizer steps"
        self.result = summary(count, steps, steps_from, "client")
        return reply


def count_server_round(strategy: RoundLoop) -> Callable[[], dict[str, Any] | None]:
    """Put the server's round-2 training under the counter (a method without clients);
    returns a getter of its entry."""
    trainer = strategy.parts.trainer
    train = trainer.train
    result: list[dict[str, Any]] = []

    def counted_train(server_round: int) -> dict[str, Any]:
        if server_round != COUNTED_ROUND:
            return train(server_round)
        with counting() as count:
            metrics = train(server_round)
        result.append(summary(count, int(metrics.get("server_steps", 0)), "server_steps", "server"))
        return metrics

    trainer.train = counted_train
    return lambda: result[0] if result else None


def measure(name: str, engine: str | None = None) -> dict[str, Any]:
    """The method's entry: its counted round's syncs per step, steps and ops."""
    raw = experiment(name, engine)
    strategy = build_strategy(raw)
    grid = CountingGrid(raw["split"]["num_clients"])
    server_result = None if METHODS[name].client else count_server_round(strategy)
    strategy.start(grid, num_rounds=COUNTED_ROUND)
    result = grid.result if server_result is None else server_result()
    if result is None:
        raise RuntimeError(f"round {COUNTED_ROUND} did not train partition {COUNTED_PARTITION}")
    return result


def table_line(name: str, entry: dict[str, Any]) -> str:
    if "error" in entry:
        return f"{name:<20} error: {entry['error']}"
    per_step = entry["syncs_per_step"]
    shown = "-" if per_step is None else f"{per_step:.2f}"
    top = ", ".join(f"{op} {n}" for op, n in list(entry["ops"].items())[:TOP_OPS])
    copies = sum(entry["host_copies"].values())
    return (
        f"{name:<20} {shown:>10} {entry['steps']:>5} {entry['syncs']:>6} {copies:>6}  {top or '-'}"
    )


class ArgumentError(Exception):
    """A bad command line (one line on stderr, exit 2)."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ArgumentError(message)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The arguments and the methods to measure (every registered one by default)."""
    parser = Parser(prog="host_syncs", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--methods", help="comma-separated methods (default: all registered)")
    parser.add_argument(
        "--engine",
        choices=choices_of(AugmentSettings)["engine"],
        default=ACCELERATOR_ENGINE,
        help=f"augment.engine of every run (default: {ACCELERATOR_ENGINE}, what `auto` runs "
        "on an accelerator, where a sync costs)",
    )
    args = parser.parse_args(argv)
    if args.methods is None:
        return args, list(METHODS)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        allowed = ", ".join(METHODS)
        raise ArgumentError(f"--methods: unknown {unknown or args.methods!r} (allowed: {allowed})")
    return args, methods


def main(argv: list[str] | None = None) -> int:
    try:
        args, methods = parse_args(argv)
    except ArgumentError as err:
        print(f"host_syncs: error: {err}", file=sys.stderr)
        return 2
    print(f"{'method':<20} {'syncs/step':>10} {'steps':>5} {'syncs':>6} {'copies':>6}  top ops")
    results: dict[str, dict[str, Any]] = {}
    for name in methods:
        try:
            results[name] = measure(name, args.engine)
        except Exception as err:  # one method's failure is its entry; the others go on
            results[name] = {"error": f"{type(err).__name__}: {err}".splitlines()[0]}
        print(table_line(name, results[name]), flush=True)
    if args.json is not None:
        report = {
            "methods": results,
            "counted": {"round": COUNTED_ROUND, "partition": COUNTED_PARTITION},
            "engine": args.engine,
            "host": host(),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 1 if any("error" in entry for entry in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
