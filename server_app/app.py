"""ServerApp: read the experiment, build the server's data and model, run the strategy."""

from __future__ import annotations

import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from strategies import METHODS
from strategies.base import ServerSide
from tasks.config import from_run_config
from tasks.partition import get_split
from tasks.results import Recorder
from tasks.train import resolve_device

APP_DIR = Path(__file__).resolve().parents[1]

app = ServerApp()


def out_dir(run_config, cfg) -> Path:
    """run-config out-dir, else runs/<method>-<time> under the current directory."""
    chosen = str(run_config.get("out-dir", ""))
    if chosen:
        return Path(chosen)
    return Path("runs") / f"{cfg['method']}-{time.strftime('%Y%m%d-%H%M%S')}"


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = from_run_config(context.run_config, APP_DIR)
    dataset, split = get_split(cfg)
    server = ServerSide.build(cfg, dataset, split, resolve_device(cfg["device"]))
    recorder = Recorder(out_dir(context.run_config, cfg), cfg, split.summary)
    strategy = METHODS[cfg["method"]].strategy(server, recorder.add_round)
    strategy.start(grid, num_rounds=cfg["rounds"], timeout=cfg["federation"]["timeout_s"])
    recorder.finish()
