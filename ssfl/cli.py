"""The ``ssfl`` command: run experiments in Flower's simulation engine, compare runs."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tasks.config import ConfigError, data_root, deep_merge, parse_overrides, read_yaml, resolve


def resolve_experiment(
    path: str, rounds: int | None, nodes: int | None, sets: list[str]
) -> dict[str, Any]:
    """YAML + --rounds/--nodes/--set, validated, with the data folder made absolute."""
    raw = read_yaml(path)
    if rounds is not None:
        raw = deep_merge(raw, {"rounds": rounds})
    if nodes is not None:
        raw = deep_merge(raw, {"split": {"num_clients": nodes}})
    raw = deep_merge(raw, parse_overrides(sets))
    cfg = resolve(raw)
    cfg["dataset"]["root"] = str(data_root(cfg))
    return cfg


def check_data(cfg: dict[str, Any]) -> dict[str, Any]:
    """Load the dataset and build the split now, so bad data fails before any training."""
    from tasks.partition import get_split

    _, split = get_split(cfg)
    return split.summary


def default_out(cfg: dict[str, Any]) -> Path:
    label = cfg["name"] or cfg["method"]
    return Path("runs") / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}"


def cmd_run(args: argparse.Namespace) -> int:
    from ssfl.runner import RunFailed, run_simulation, toml_str

    cfg = resolve_experiment(args.experiment, args.rounds, args.nodes, args.set or [])
    out = Path(args.out) if args.out else default_out(cfg)
    toml_str(str(out.resolve()))  # a path Flower's run-config cannot carry fails here
    summary = check_data(cfg)
    print(
        f"ssfl: {cfg['method']} on {cfg['dataset']['name']} ({summary['partitioner']}, "
        f"R={summary['noniid_r']:.3f}), {cfg['split']['num_clients']} clients, "
        f"{cfg['rounds']} rounds -> {out}",
        file=sys.stderr,
    )
    try:
        results = run_simulation(cfg, out, stream=not args.quiet)
    except RunFailed as err:
        print(f"ssfl: run failed: {err}", file=sys.stderr)
        return 1
    print(
        f"final_test_accuracy {results['final_test_accuracy']:.4f}  "
        f"best_test_accuracy {results['best_test_accuracy']:.4f}  "
        f"wall_seconds {results['wall_seconds']:.1f}  -> {out / 'results.json'}"
    )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from tasks.results import load_results, markdown_table, plot_curves

    runs = [load_results(p) for p in args.runs]
    print(markdown_table(runs))
    plot = Path(args.plot)
    plot_curves(runs, plot, metric=args.metric)
    print(f"\n![{args.metric}]({plot})")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from ssfl.reproduce import reproduce
    from ssfl.runner import RunFailed

    try:
        print(reproduce(args.table, Path(args.out), args.rounds, args.set or [], not args.no_run))
    except RunFailed as err:
        print(f"ssfl: reproduce failed: {err}", file=sys.stderr)
        return 1
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from ssfl.runner import RunFailed
    from ssfl.sweep import sweep

    try:
        print(sweep(args.experiment, args.set_grid, args.set or [], args.rounds, Path(args.out)))
    except RunFailed as err:
        print(f"ssfl: sweep failed: {err}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    from ssfl.reproduce import TABLES

    parser = argparse.ArgumentParser(prog="ssfl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an experiment YAML in Flower's simulation engine")
    run.add_argument("experiment", help="experiment YAML, e.g. experiments/fmnist-las/fedseal.yaml")
    run.add_argument("--rounds", type=int, help="number of rounds (overrides 'rounds')")
    run.add_argument(
        "--nodes",
        type=int,
        help="number of clients; the same data is re-partitioned (split.num_clients)",
    )
    run.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set client.lr=0.05 (repeatable)",
    )
    run.add_argument("--out", help="output folder (default runs/<name>-<time>)")
    run.add_argument("--quiet", action="store_true", help="no per-round progress lines")
    run.set_defaults(func=cmd_run)

    cmp_ = sub.add_parser("compare", help="markdown table and joint plot of several runs")
    cmp_.add_argument("runs", nargs="+", help="run folders (or results.json files)")
    cmp_.add_argument("--plot", default="compare.png", help="where to write the plot")
    cmp_.add_argument(
        "--metric",
        default="test_accuracy",
        help="per-round metric to plot, e.g. weight_diversity (default: test_accuracy)",
    )
    cmp_.set_defaults(func=cmd_compare)

    rep = sub.add_parser("reproduce", help="run a paper table and write ours beside the paper's")
    rep.add_argument("table", choices=sorted(TABLES))
    rep.add_argument("--rounds", type=int, help="rounds of every cell (default: the experiments')")
    rep.add_argument("--out", required=True, help="folder for the cells, table.md, accuracy.png")
    rep.add_argument("--set", action="append", metavar="KEY=VALUE", help="override in every cell")
    rep.add_argument(
        "--no-run", action="store_true", help="run nothing: a table of the finished cells only"
    )
    rep.set_defaults(func=cmd_reproduce)

    swp = sub.add_parser("sweep", help="run an experiment over a grid of values; table and plot")
    swp.add_argument("experiment", help="experiment YAML")
    swp.add_argument(
        "--set-grid",
        action="append",
        required=True,
        metavar="KEY=V1,V2,...",
        help="values of one key to sweep (repeatable: the grid is their product)",
    )
    swp.add_argument("--out", required=True, help="folder for the cells, table.md and plots")
    swp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override in every cell")
    swp.add_argument("--rounds", type=int, help="rounds of every cell (default: the experiment's)")
    swp.set_defaults(func=cmd_sweep)
    return parser


def exit_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM exits like Ctrl-C, so the SuperLink this command started is stopped too."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError) as err:
        print(f"ssfl: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
