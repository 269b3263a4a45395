"""ServerApp: read the experiment, build the server's data and model, run the strategy; a
checkpoint after every round in the output folder, resumed from with run-config resume;
the final global model in OUT/model.pt (tasks.export).
results.json's ``timeline`` holds when each start-up stage ended (wall-clock seconds)."""

from __future__ import annotations

import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ssfl.experiment import default_out, from_run_config
from ssfl.registry import method, settings_of
from strategies.loop import RunStalled
from strategies.parts import ServerSide
from tasks.checkpoint import CHECKPOINT_FILE, load_checkpoint
from tasks.export import MODEL_FILE, save_model
from tasks.partition import get_split
from tasks.results import Recorder
from tasks.train import keep_freed_memory, resolve_device

APP_DIR = Path(__file__).resolve().parents[1]

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    entered = time.time()
    keep_freed_memory()
    settings = settings_of(from_run_config(context.run_config, APP_DIR))
    dataset, split = get_split(settings)
    server = ServerSide.build(settings, dataset, split, resolve_device(settings.device))
    out = Path(str(context.run_config.get("out-dir", "")) or default_out(settings))
    recorder = Recorder(out, settings, split.summary)
    recorder.code_version = str(context.run_config.get("code-version", ""))
    strategy = method(settings.method).server_half().strategy(server, recorder.add_round)
    recorder.timeline = strategy.timeline
    recorder.devices = strategy.devices
    strategy.timeline.update(server_main=entered, server_built=time.time())
    strategy.checkpoint_path = out / CHECKPOINT_FILE
    if context.run_config.get("resume"):
        strategy.resume_from(load_checkpoint(strategy.checkpoint_path))
        recorder.resume(strategy.rows)
    try:
        strategy.start(grid, num_rounds=settings.rounds, timeout=settings.federation.timeout_s)
    except RunStalled as err:
        save_model(server.model, settings, dataset, recorder.rows, out / MODEL_FILE)
        recorder.finish(failure=str(err))
        raise
    save_model(server.model, settings, dataset, recorder.rows, out / MODEL_FILE)
    recorder.finish()
