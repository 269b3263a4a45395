"""A local Ray cluster for one simulation run, started before the run asks for it.

``python -m ssfl.ray_head`` starts Ray's head processes (GCS, raylet and agents) as Flower's
simulation would (``include_dashboard=False``), on the GCS port in ``RAY_GCS_SERVER_PORT``,
and holds the cluster until its standard input closes or it is terminated;
then Ray stops with it. ``ssfl run`` launches it beside the SuperLink, so that Ray boots while
the CLI checks the data and the simulation process starts: the simulation's ``ray.init``
then connects to it (``RAY_ADDRESS``) instead of starting a cluster of its own
(docs/benchmarks.md, "Start-up to round 1").
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

START_TRIES = 3
"""Starts of the cluster before the head gives up (see :func:`start_cluster`)."""

TIMED_OUT = "timed out during startup"
"""Ray's message when its raylet did not register with the GCS within its fixed 30 s."""


def hold() -> None:
    """Start the cluster and keep it until stdin closes or SIGTERM arrives."""
    import ray

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    owned = start_cluster()
    try:
        sys.stdin.read()
    finally:
        ray.shutdown()
        if not owned:
            kill_descendants()


def start_cluster(tries: int = START_TRIES) -> bool:
    """``ray.init`` a new local cluster on the run's GCS port, tried again where Ray's start
    timed out; whether this process's driver owns it (else it only joined it, and the
    cluster's processes are this process's children to stop).

    address="local": a new cluster, always. With no address, ray.init joins the cluster
    named in /tmp/ray/ray_current_cluster (written by `ray start` and ray.cluster_utils)
    if there is one: a run started beside another's cluster joined it and died with it
    ("Failed to connect to GCS") when that cluster stopped.

    Ray waits a fixed 30 s for its raylet to register (``ray/_private/node.py``, no setting);
    on a CPU loaded by other work that wait can run out while the raylet is still starting,
    and the simulation may already be waiting on the GCS. So the head first joins the
    cluster it started, as any driver would (Ray waits up to 60 s more for a raylet); only
    where that fails too are the start's processes killed and the cluster started again on
    the same port, up to ``tries`` starts.
    """
    import ray

    for attempt in range(1, tries + 1):
        try:
            ray.init(
                address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False
            )
            return True
        except Exception as error:
            if TIMED_OUT not in str(error):
                raise
            timed_out = error
        say(f"Ray's start timed out (try {attempt} of {tries}); joining the cluster it started")
        why = join_started()
        if why is None:
            return False
        say(f"could not join it ({why}); stopping what it started")
        kill_descendants()
    raise RuntimeError(f"Ray did not start in {tries} tries: {timed_out}")


def join_started() -> str | None:
    """Join the cluster on ``RAY_GCS_SERVER_PORT`` as a driver: None, else why it failed."""
    import ray

    port = os.environ.get("RAY_GCS_SERVER_PORT")
    if not port:
        return "no RAY_GCS_SERVER_PORT"
    try:
        ray.init(
            address=f"127.0.0.1:{port}",
            include_dashboard=False,
            logging_level="ERROR",
            log_to_driver=False,
        )
    except Exception as error:
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    return None


def say(line: str) -> None:
    """One line to the head's log (``ray-head.log`` in the run's scratch home)."""
    print(f"ssfl.ray_head: {line}", file=sys.stderr, flush=True)


def kill_descendants(timeout: float = 10.0) -> None:
    """SIGKILL every process this one started, and wait (up to ``timeout`` s) until they
    are gone: reaped where they are children, else no longer listed."""
    from ssfl.runner import descendants

    pids = descendants(os.getpid())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reap_children()
        if not set(pids) & set(descendants(os.getpid())):
            return
        time.sleep(0.05)


def reap_children() -> None:
    """Collect the exit status of every child that has exited (no zombies left listed)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


if __name__ == "__main__":
    hold()
