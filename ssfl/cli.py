"""The ``ssfl`` command: run experiments in Flower's simulation engine or as a local
deployment (SuperLink and SuperNodes as processes), compare runs."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from ssfl.experiment import (
    CellFolders,
    check_data,
    check_out,
    check_out_path,
    check_resumable,
    default_out,
    resolve_experiment,
)
from ssfl.lifecycle import RunInterrupted, remove_stale_folders, stop_signals
from ssfl.registry import settings_of
from tasks.config import ConfigError
from tasks.settings import Settings


def experiment_settings(args: argparse.Namespace) -> Settings:
    """The experiment the command line names, with --rounds, --nodes and --set, checked."""
    return settings_of(resolve_experiment(args.experiment, args.rounds, args.nodes, args.set or []))


def prepare(args: argparse.Namespace) -> tuple[Settings, Path]:
    """The resolved experiment and its output folder; bad config or data fail here."""
    from ssfl.runner import toml_str

    settings = experiment_settings(args)
    out = Path(args.out) if args.out else default_out(settings)
    toml_str(str(out.resolve()))  # a path Flower's run-config cannot carry fails here
    resumed = f", resumed after round {check_resumable(out, settings)}" if args.resume else ""
    summary = check_data(settings)
    print(
        f"ssfl: {settings.method} on {settings.dataset.name} ({summary['partitioner']}, "
        f"R={fixed(summary['noniid_r'], 3)}), {settings.split.num_clients} clients, "
        f"{settings.rounds} rounds{resumed} -> {out}",
        file=sys.stderr,
    )
    if line := solved_noise_line(settings):
        print(line, file=sys.stderr)
    return settings, out


def solved_noise_line(settings: Settings) -> str:
    """The noise multiplier privacy.target_epsilon was solved into, or '' when none was."""
    p = settings.privacy
    if p.mode == "none" or p.target_epsilon <= 0:
        return ""
    return (
        f"ssfl: privacy.noise_multiplier {p.noise_multiplier:g}, solved for epsilon <= "
        f"{p.target_epsilon:g} at delta {p.target_delta:g} after {settings.rounds} rounds "
        f"({p.accountant} accountant)"
    )


def precheck(args: argparse.Namespace) -> None:
    """Fail on a bad experiment before any process starts: the file, its text, its method,
    every key of the resolved config and its device (`cuda` needs a GPU and a nonzero
    share); the data are checked while the SuperLink boots."""
    from ssfl.gpu import check_run_device, gpu_count

    check_run_device(experiment_settings(args), gpu_count())


def report(results: dict[str, Any], out: Path) -> None:
    from ssfl.progress import results_line

    print(results_line(results, out / "results.json"))


def cmd_run(args: argparse.Namespace) -> int:
    from ssfl.progress import check_loggers
    from ssfl.runner import LocalSuperLink, RunFailed, run_simulation

    loggers = check_loggers(args.log or [])
    precheck(args)
    check_out_arg(args)  # before the SuperLink boots
    if args.ray_address:
        os.environ["RAY_ADDRESS"] = check_ray_address(args.ray_address)
    link = LocalSuperLink.booting()  # boots while torch loads and the data is checked
    try:
        settings, out = prepare(args)
        results = run_simulation(
            settings, out, stream=not args.quiet, resume=args.resume, link=link, loggers=loggers
        )
    except RunFailed as err:
        print(f"ssfl: run failed: {err}", file=sys.stderr)
        return 1
    finally:
        link.close()  # run_simulation closed it already, keeping its log, unless it raised early
    report(results, out)
    return 0


def check_ray_address(address: str) -> str:
    """--ray-address HOST:PORT of a running Ray cluster's head (its GCS port): refused in one
    line when it is malformed or nothing listens there."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            f"--ray-address {address}: expected HOST:PORT of a Ray head, e.g. 10.0.0.5:6379"
        )
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise ConfigError(f"--ray-address {address}: no Ray head answers there ({err})") from None
    return address


def check_out_arg(args: argparse.Namespace) -> None:
    """Refuse an --out that is no folder, or holds a run neither --resume nor --overwrite
    deals with (a default --out is a new folder)."""
    if args.out:
        check_out(Path(args.out), args.resume, args.overwrite)


def parse_node_data(items: list[str], num_nodes: int) -> dict[int, str]:
    """--node-data K=FOLDER items -> {K: absolute folder}; K must be a node of the run."""
    node_data = {}
    for item in items:
        key, sep, folder = item.partition("=")
        if not sep or not key.strip().isdigit() or not folder:
            raise ConfigError(f"--node-data {item!r}: expected NODE=FOLDER, e.g. 1=/data/node1")
        node = int(key)
        if node >= num_nodes:
            raise ConfigError(f"--node-data {item!r}: node {node} not in 0..{num_nodes - 1}")
        node_data[node] = str(Path(folder).expanduser().resolve())
    return node_data


def cmd_deploy_local(args: argparse.Namespace) -> int:
    from ssfl.deploy import run_deployment
    from ssfl.runner import RunFailed

    check_out_arg(args)
    settings, out = prepare(args)
    node_data = parse_node_data(args.node_data or [], settings.split.num_clients)
    try:
        results = run_deployment(
            settings, out, node_data=node_data, stream=not args.quiet, resume=args.resume
        )
    except RunFailed as err:
        print(f"ssfl: deployment failed: {err}", file=sys.stderr)
        return 1
    report(results, out)
    failed = sorted({p for r in results["rounds"] for p in r.get("failed_partitions", [])})
    if failed:
        print(
            f"ssfl: the run completed, but nodes {failed} failed their work in some rounds; "
            f"see {out / 'results.json'} and {out / 'logs'}",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from tasks.results import check_metric, load_results, markdown_table, plot_curves

    runs = [load_results(p) for p in args.runs]
    lacking = check_metric(runs, args.metric)
    if lacking:
        print(f"ssfl: {', '.join(lacking)} record no {args.metric}: not plotted", file=sys.stderr)
    print(markdown_table(runs))
    plot = Path(args.plot)
    plot_curves(runs, plot, metric=args.metric)
    print(f"\n![{args.metric}]({plot})")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from ssfl.reproduce import Pick, parse_names, parse_seeds, reproduce
    from ssfl.runner import RunFailed

    seeds = None if args.seeds is None else parse_seeds(args.seeds)
    pick = Pick(parse_names(args.rows), parse_names(args.columns))
    try:
        text = reproduce(
            args.table,
            Path(args.out),
            args.rounds,
            args.set or [],
            not args.no_run,
            args.dataset,
            seeds,
            cell_folders(args),
            pick,
            args.jobs,
        )
        print(text)
    except RunFailed as err:
        print(f"ssfl: reproduce failed: {err}", file=sys.stderr)
        return 1
    return 0


def cell_folders(args: argparse.Namespace) -> CellFolders:
    """What sweep and reproduce do with a cell folder holding a run they cannot reuse."""
    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite exclude each other; give one")
    check_out_path(Path(args.out))
    return CellFolders(args.resume, args.overwrite)


def add_cell_args(parser: argparse.ArgumentParser) -> None:
    """--resume and --overwrite of sweep and reproduce (finished cells are reused anyway)."""
    parser.add_argument(
        "--resume", action="store_true", help="continue cells whose run was interrupted"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="rerun cells that hold another or unfinished run"
    )
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        metavar="N",
        help="cells run at once, each in a process of its own (default 1: one after another)",
    )


def positive_int(text: str) -> int:
    """argparse type of --jobs: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def cmd_sweep(args: argparse.Namespace) -> int:
    from ssfl.runner import RunFailed
    from ssfl.sweep import sweep

    try:
        grid, sets = args.set_grid, args.set or []
        folders = cell_folders(args)
        print(sweep(args.experiment, grid, sets, args.rounds, Path(args.out), folders, args.jobs))
    except RunFailed as err:
        print(f"ssfl: sweep failed: {err}", file=sys.stderr)
        return 1
    return 0


def cmd_sanity(args: argparse.Namespace) -> int:
    from ssfl.sanity import SanityOptions, run_sanity

    opts = SanityOptions(
        steps=args.steps,
        mu=args.mu,
        batch_size=args.batch_size,
        labels_per_class=args.labels_per_class,
        log_every=args.log_every,
        eval_every=args.eval_every,
    )
    out = Path(args.out)
    results = run_sanity(args.method, args.dataset, out, opts, args.set or [])
    print(
        f"final_test_accuracy {results['final_test_accuracy']:.4f}  "
        f"wall_seconds {results['wall_seconds']:.1f}  -> {out / 'results.json'}"
    )
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from ssfl.validate import check_experiment

    passed = True
    for path in args.experiments:
        result = check_experiment(path)
        print(result.line(), flush=True)
        passed = passed and result.ok
    return 0 if passed else 2


def cmd_evaluate(args: argparse.Namespace) -> int:
    from ssfl.evaluate import evaluate_run, report_lines

    run_dir = Path(args.run_dir)
    metrics = evaluate_run(run_dir, args.dataset, args.split)
    recorded = metrics["recorded"]
    print(
        f"ssfl: the model of {run_dir} after round {metrics['round']} on {metrics['images']} "
        f"{args.split} images (the run's final test accuracy: "
        f"{'none' if recorded is None else f'{recorded:.4f}'})",
        file=sys.stderr,
    )
    print("\n".join(report_lines(metrics, args.split)))
    return 0


def add_experiment_args(parser: argparse.ArgumentParser) -> None:
    """The arguments ``run`` and ``deploy-local`` share (and mean the same in both)."""
    parser.add_argument(
        "experiment", help="experiment YAML, e.g. experiments/fmnist-las/fedseal.yaml"
    )
    parser.add_argument("--rounds", type=int, help="number of rounds (overrides 'rounds')")
    parser.add_argument(
        "--nodes",
        type=int,
        help="number of clients; the same data is re-partitioned (split.num_clients)",
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set client.lr=0.05 (repeatable)",
    )
    parser.add_argument("--out", help="output folder (default runs/<name>-<time>)")
    parser.add_argument("--quiet", action="store_true", help="no per-round progress lines")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on from the last complete round of the run in --out (same experiment and "
        "options); numbers as if never interrupted",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the run --out holds, if any"
    )


def versions() -> str:
    """ssfl's, Flower's and torch's installed versions (read without importing them)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"ssfl {of('ssfl')}, flwr {of('flwr')}, torch {of('torch')}"


def build_parser() -> argparse.ArgumentParser:
    from ssfl.reproduce import TABLES

    parser = argparse.ArgumentParser(prog="ssfl", description=__doc__)
    parser.add_argument("--version", action="version", version=versions())
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an experiment YAML in Flower's simulation engine")
    add_experiment_args(run)
    run.add_argument(
        "--log",
        action="append",
        metavar="tensorboard",
        help="also log every per-round metric for TensorBoard into OUT/tensorboard/",
    )
    run.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help="run the clients on this running Ray cluster (its head's GCS address) instead of "
        "a local one started for the run; the same as setting RAY_ADDRESS",
    )
    run.set_defaults(func=cmd_run)

    dep = sub.add_parser(
        "deploy-local",
        help="run an experiment YAML on a local deployment: SuperLink and one SuperNode per "
        "client as processes, TLS and node authentication on",
    )
    add_experiment_args(dep)
    dep.add_argument(
        "--node-data",
        action="append",
        metavar="NODE=FOLDER",
        help="node NODE trains on FOLDER's unlabeled images (PNG/JPEG/.npy) instead of its "
        "partition (repeatable)",
    )
    dep.set_defaults(func=cmd_deploy_local)

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
    rep.add_argument(
        "--dataset", help="the table's dataset, e.g. fmnist (default: its first; fedsup-table6)"
    )
    rep.add_argument("--set", action="append", metavar="KEY=VALUE", help="override in every cell")
    rep.add_argument(
        "--no-run", action="store_true", help="run nothing: a table of the finished cells only"
    )
    rep.add_argument(
        "--seeds",
        metavar="S1,S2,...",
        help="run every cell once per seed; the table shows mean ± std over the seeds",
    )
    rep.add_argument(
        "--rows",
        metavar="LABEL,...",
        help="run these rows only, e.g. Server-SL,FedSEAL (the others are tabled if finished)",
    )
    rep.add_argument(
        "--columns",
        metavar="NAME,...",
        help="run these columns only, e.g. IID (the others are tabled if finished)",
    )
    add_cell_args(rep)
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
    add_cell_args(swp)
    swp.set_defaults(func=cmd_sweep)

    evl = sub.add_parser(
        "evaluate", help="evaluate a run's kept model (OUT/model.pt); last line: test_accuracy="
    )
    evl.add_argument("run_dir", help="the run's output folder (its --out)")
    evl.add_argument("--dataset", help="the same split of another dataset, e.g. mnist")
    evl.add_argument(
        "--split", default="test", help="test (default), val or labeled: the server's image sets"
    )
    evl.set_defaults(func=cmd_evaluate)

    san = sub.add_parser(
        "sanity",
        help="a method's own parts (loss, views, model, optimizer) trained centrally on labeled "
        "and unlabeled batches together, as the SSL papers do",
    )
    # Not argparse choices: those would import torch (ssfl.sanity) before ``run`` starts
    # its SuperLink; an unknown method is a one-line error listing the known ones.
    san.add_argument("method", help="fixmatch, uda, crl or selftrain")
    san.add_argument("--dataset", required=True, help="dataset name, e.g. mnist, fashion_mnist")
    san.add_argument("--out", required=True, help="folder for results.json")
    san.add_argument("--steps", type=int, default=2000, help="SGD steps (default 2000)")
    san.add_argument("--mu", type=int, default=7, help="unlabeled batch = mu * B (default 7)")
    san.add_argument(
        "--batch-size", type=int, default=0, help="labeled batch B (default: the method's)"
    )
    san.add_argument("--labels-per-class", type=int, default=100, help="default 100")
    san.add_argument("--log-every", type=int, default=50, help="steps per log line (default 50)")
    san.add_argument(
        "--eval-every", type=int, default=500, help="steps between test evaluations (default 500)"
    )
    san.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a part")
    san.set_defaults(func=cmd_sanity)

    val = sub.add_parser(
        "validate",
        help="build each experiment's split, model and optimizers at its dataset's real sizes "
        "without training; one line each, exit 2 when any fails",
    )
    val.add_argument("experiments", nargs="+", help="experiment YAMLs")
    val.set_defaults(func=cmd_validate)
    return parser


def fixed(value: float, digits: int) -> str:
    """``value`` with ``digits`` decimals, never a negative zero ('-0.000' for -0.0001)."""
    return f"{round(value, digits) + 0.0:.{digits}f}"


def resume_command(argv: list[str], out: Path) -> str:
    """The command that continues an interrupted one: the same, with --resume (and --out)."""
    words = [w for w in argv if w != "--overwrite"]
    if "--resume" not in words:
        words.append("--resume")
    if not any(w == "--out" or w.startswith("--out=") for w in words):
        words += ["--out", str(out)]
    return "ssfl " + shlex.join(words)


def report_interrupted(err: RunInterrupted, argv: list[str]) -> int:
    """One line on what an interrupted command left and how to go on; its exit code."""
    if err.out is None or err.rounds_done is None:
        print(
            f"ssfl: interrupted ({err}) before a round completed; nothing to resume",
            file=sys.stderr,
        )
    else:
        print(
            f"ssfl: interrupted ({err}) after round {err.rounds_done}; continue with: "
            f"{resume_command(argv, err.out)}",
            file=sys.stderr,
        )
    return err.exit_code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    remove_stale_folders()
    try:
        with stop_signals():
            return args.func(args)
    except (ConfigError, FileNotFoundError) as err:
        print(f"ssfl: error: {err}", file=sys.stderr)
        return 2
    except RunInterrupted as err:
        return report_interrupted(err, argv)


if __name__ == "__main__":
    sys.exit(main())
