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

import signal
import sys


def hold() -> None:
    """Start the cluster and keep it until stdin closes or SIGTERM arrives."""
    import ray

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # address="local": a new cluster, always. With no address, ray.init joins the cluster
    # named in /tmp/ray/ray_current_cluster (written by `ray start` and ray.cluster_utils)
    # if there is one: a run started beside another's cluster joined it and died with it
    # ("Failed to connect to GCS") when that cluster stopped.
    ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        sys.stdin.read()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    hold()
