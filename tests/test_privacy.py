"""Client-level differential privacy (privacy.*): clipping on hand-made updates, the noise's
standard deviation per mode, the adaptive norm's direction, the accountant against a second
one, the refusals, and tiny runs (noise 0 with a huge norm equals no privacy; clients clip
their own replies, also in a cohort)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import MessageType, MetricRecord, RecordDict
from flwr.supercore.differential_privacy import compute_adaptive_noise_params

from ssfl.cli import solved_noise_line
from ssfl.experiment import resolve_config
from ssfl.progress import progress_line
from ssfl.records import record_arrays, to_record
from ssfl.registry import settings_of
from strategies.parts import FedAvg, Update
from strategies.privacy import PrivateAggregator
from tasks.config import ConfigError, deep_merge
from tasks.privacy import clipped_model, epsilon, noise_for_epsilon
from tasks.results import Recorder
from tests.harness import InProcessGrid, run_method, tiny_raw, without_seconds
from tests.test_resume import run_rounds

pytestmark = pytest.mark.usefixtures("one_thread")

PRIVACY_KEYS = (
    "epsilon",
    "delta",
    "clipping_norm",
    "clipped_fraction",
    "update_norm_median",
    "noise_std",
    "norm_bit",
)


def norm_of(model: dict, start: dict) -> float:
    keys = [k for k in start if np.issubdtype(start[k].dtype, np.floating)]
    return float(np.sqrt(sum(np.sum((model[k] - start[k]).astype(np.float64) ** 2) for k in keys)))


def hand_made(rng: np.random.Generator, scale: float) -> tuple[dict, dict]:
    """A start model and a client model ``scale`` times a random update away, with an
    integer buffer the client changed."""
    start = {
        "w": rng.normal(size=(20, 30)).astype(np.float32),
        "b": rng.normal(size=30).astype(np.float32),
        "count": np.array([5], dtype=np.int64),
    }
    model = {k: (v + scale * rng.normal(size=v.shape)).astype(v.dtype) for k, v in start.items()}
    model["count"] = np.array([9], dtype=np.int64)
    return start, model


# ----- Clipping ---------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])
def test_a_clipped_update_is_at_most_the_norm_and_a_short_one_is_kept(scale):
    start, model = hand_made(np.random.default_rng(1), scale)
    out, before = clipped_model(model, start, 2.0)
    over = before > 2.0
    assert before == pytest.approx(norm_of(model, start))
    assert norm_of(out, start) <= 2.0 + 1e-5
    if not over:
        assert all(np.array_equal(out[k], model[k]) for k in ("w", "b"))
    else:
        assert norm_of(out, start) == pytest.approx(2.0, rel=1e-5)
        direction = (out["w"] - start["w"]).ravel() / (model["w"] - start["w"]).ravel()
        assert np.allclose(direction, 2.0 / before, rtol=1e-3)  # scaled, not rotated
    assert int(out["count"][0]) == 5  # an integer buffer is the start's
    assert out["w"].dtype == np.float32


# ----- The aggregator: noise and the adaptive norm --------------------------------------
def settings_with(**privacy) -> object:
    raw = deep_merge(tiny_raw("fedseal"), {"privacy": privacy})
    raw["split"]["num_clients"], raw["federation"]["clients_per_round"] = 40, 4
    return settings_of(resolve_config(raw))


def private(settings) -> PrivateAggregator:
    server = SimpleNamespace(settings=settings, device="cpu")
    return PrivateAggregator(server, FedAvg(server))


def round_of(agg: PrivateAggregator, start: dict, models: list[dict], rnd: int = 1):
    """Send ``start`` to len(models) clients, aggregate their ``models``: (aggregate, metrics)."""
    record = to_record(start)
    updates = []
    for pid, model in enumerate(models):
        agg.start_model(rnd, pid, record)
        metrics = MetricRecord({"partition-id": pid, "num-examples": 10 * (pid + 1)})
        content = RecordDict({"arrays": to_record(model), "metrics": metrics})
        updates.append(Update(pid, 10 * (pid + 1), content))
    out, metrics = agg.aggregate(rnd, updates)
    return record_arrays(out), metrics


@pytest.mark.parametrize(
    ("mode", "z", "count_std"),
    [("server_fixed", 1.5, -1.0), ("client_fixed", 0.7, -1.0), ("server_adaptive", 1.5, 2.0)],
)
def test_the_aggregate_noise_has_the_modes_standard_deviation(mode, z, count_std):
    """Four clients sending back the start model: the aggregate minus the start is the noise,
    of std z * C / 4 (adaptive: Flower's effective z for the update)."""
    settings = settings_with(
        mode=mode, noise_multiplier=z, clipping_norm=2.0, clipped_count_stddev=count_std
    )
    start = {"w": np.zeros(400_000, np.float32), "count": np.array([3], np.int64)}
    out, metrics = round_of(private(settings), start, [dict(start) for _ in range(4)])
    update_z = compute_adaptive_noise_params(z, 4, count_std)[1] if "adaptive" in mode else z
    expected = update_z * 2.0 / 4
    assert metrics["noise_std"] == pytest.approx(expected)
    assert float(np.std(out["w"])) == pytest.approx(expected, rel=0.01)
    assert abs(float(np.mean(out["w"]))) < 0.01 * expected
    assert int(out["count"][0]) == 3


def test_server_clipping_bounds_every_update_and_weights_them_equally():
    """Noise 0: the aggregate is the plain mean of the clipped updates, whatever the
    clients' example counts."""
    settings = settings_with(mode="server_fixed", noise_multiplier=0.0, clipping_norm=0.5)
    start, short = hand_made(np.random.default_rng(2), 0.001)
    _, long = hand_made(np.random.default_rng(2), 5.0)  # the same start, a long update
    models = [short, long]
    agg = private(settings)
    out, metrics = round_of(agg, start, models)
    clipped = [clipped_model(m, start, 0.5)[0] for m in models]
    for k in ("w", "b"):
        mean = (clipped[0][k].astype(np.float64) + clipped[1][k]) / 2
        assert np.allclose(out[k], mean, atol=1e-6)
    assert metrics["clipped_fraction"] == 0.5
    assert all(norm_of(c, start) <= 0.5 + 1e-5 for c in clipped)


@pytest.mark.parametrize(("scale", "factor"), [(1e-4, math.exp(-0.2 * 0.5)), (10.0, math.exp(0.1))])
def test_the_adaptive_norm_shrinks_when_none_is_clipped_and_grows_when_all_are(scale, factor):
    """Andrew et al. 2021: C <- C exp(-eta (b - gamma)), b the unclipped fraction (no count
    noise here: noise multiplier 0)."""
    settings = settings_with(
        mode="server_adaptive",
        noise_multiplier=0.0,
        clipping_norm=1.0,
        clip_norm_lr=0.2,
        target_clipped_quantile=0.5,
        clipped_count_stddev=0.0,
    )
    start, model = hand_made(np.random.default_rng(3), scale)
    models = [model] * 4
    agg = private(settings)
    round_of(agg, start, models)
    assert agg.clipping_norm == pytest.approx(factor)


# ----- The accountant --------------------------------------------------------------------
def test_the_reported_epsilon_of_the_reference_setting_is_pinned():
    """q = 0.01, z = 1, 1000 rounds, delta 1e-5 by the RDP accountant (the PLD accountant
    gives 1.828 for it: the next test)."""
    assert epsilon(1.0, 0.01, 1000, 1e-5) == pytest.approx(2.1078, abs=1e-3)


@pytest.mark.slow
def test_rdp_epsilon_is_an_upper_bound_close_to_the_pld_one():
    """q = 0.01, z = 1, 1000 rounds, delta 1e-5: the RDP accountant's epsilon (reported)
    lies above the tighter PLD accountant's and within 25% of it."""
    rdp = epsilon(1.0, 0.01, 1000, 1e-5)
    pld = epsilon(1.0, 0.01, 1000, 1e-5, accountant="pld")
    assert pld <= rdp <= 1.25 * pld
    assert 1.5 < pld < 2.5


def test_epsilon_grows_with_rounds_and_is_zero_before_and_infinite_without_noise():
    spent = [epsilon(1.1, 0.1, r, 1e-5) for r in (0, 10, 100)]
    assert spent[0] == 0.0 and spent[0] < spent[1] < spent[2]
    assert math.isinf(epsilon(0.0, 0.1, 5, 1e-5))
    assert epsilon(1.1, 1.0, 10, 1e-5) > spent[1]  # every client each round: no amplification


def test_the_noise_for_a_target_epsilon_is_the_smallest_that_reaches_it():
    """Bisection on the RDP accountant, z to 4 decimals: the dp table's z = 1.0, 1.5, 4.3
    (epsilon 7.97, 3.95, 0.99 after 100 rounds at q = 0.1) come back within 0.02."""
    for target, z in ((7.97, 1.0), (3.95, 1.5), (0.99, 4.3)):
        assert noise_for_epsilon(target, 0.1, 100, 1e-5) == pytest.approx(z, abs=0.02)
    found = noise_for_epsilon(8.0, 0.1, 100, 1e-5)
    assert epsilon(found, 0.1, 100, 1e-5) <= 8.0 < epsilon(found - 2e-4, 0.1, 100, 1e-5)
    assert noise_for_epsilon(8.0, 0.1, 50, 1e-5) < found  # fewer rounds: less noise
    with pytest.raises(ValueError, match="must be above 0"):
        noise_for_epsilon(0.0, 0.1, 100, 1e-5)


def test_target_epsilon_sets_the_resolved_configs_noise_multiplier():
    raw = {**tiny_raw("fedseal"), "rounds": 20}
    raw["split"] = {**raw["split"], "num_clients": 10}
    raw["privacy"] = {"mode": "server_fixed", "target_epsilon": 4.0, "noise_multiplier": 9.0}
    cfg = resolve_config(raw)
    z = cfg["privacy"]["noise_multiplier"]
    assert z == noise_for_epsilon(4.0, 0.2, 20, 1e-5)  # 2 of 10 clients a round, 20 rounds
    assert epsilon(z, 0.2, 20, 1e-5) <= 4.0
    assert cfg["privacy"]["target_epsilon"] == 4.0
    assert resolve_config(cfg) == cfg  # resolving the resolved config changes nothing


def test_ssfl_run_says_which_noise_multiplier_a_target_epsilon_gave():
    raw = {**tiny_raw("fedseal"), "rounds": 20}
    raw["split"] = {**raw["split"], "num_clients": 10}
    raw["privacy"] = {"mode": "server_fixed", "target_epsilon": 4.0}
    settings = settings_of(resolve_config(raw))
    z = settings.privacy.noise_multiplier
    assert solved_noise_line(settings) == (
        f"ssfl: privacy.noise_multiplier {z:g}, solved for epsilon <= 4 at delta 1e-05 after "
        "20 rounds (rdp accountant)"
    )
    raw["privacy"] = {"mode": "server_fixed", "noise_multiplier": 1.0}
    assert solved_noise_line(settings_of(resolve_config(raw))) == ""


def test_a_resolved_configs_noise_multiplier_is_checked_not_solved_again(monkeypatch):
    """Given the solved z (as the ServerApp's resolve of the written config is), two
    accountings confirm it; a wrong guess is solved for."""
    import tasks.privacy

    solved = noise_for_epsilon(4.0, 0.1, 100, 1e-5)
    calls = []
    real = tasks.privacy.epsilon

    def counted(*args):
        calls.append(args[0])
        return real(*args)

    monkeypatch.setattr(tasks.privacy, "epsilon", counted)
    assert noise_for_epsilon(4.0, 0.1, 100, 1e-5, guess=solved) == solved
    assert calls == [solved, pytest.approx(solved - 1e-4)]
    assert noise_for_epsilon(4.0, 0.1, 100, 1e-5, guess=solved + 0.01) == solved


def test_the_pld_accountant_reports_its_own_epsilon():
    """privacy.accountant pld: the rows' epsilon is the PLD accountant's (below the RDP one
    for the same run)."""
    settings = settings_with(mode="server_fixed", noise_multiplier=1.0, accountant="pld")
    start = {"w": np.zeros(100, np.float32)}
    _, metrics = round_of(private(settings), start, [dict(start) for _ in range(4)])
    pld = epsilon(1.0, 0.1, 1, 1e-5, accountant="pld")
    assert metrics["epsilon"] == pytest.approx(pld) and pld < epsilon(1.0, 0.1, 1, 1e-5)


@pytest.mark.slow  # solves z under the PLD accountant (about 7 s of accountings)
def test_target_epsilon_under_the_pld_accountant_needs_less_noise():
    rdp = noise_for_epsilon(4.0, 0.1, 100, 1e-5)
    pld = noise_for_epsilon(4.0, 0.1, 100, 1e-5, accountant="pld")
    assert pld < rdp and epsilon(pld, 0.1, 100, 1e-5, accountant="pld") <= 4.0


def test_target_epsilon_without_a_privacy_mode_is_one_line():
    raw = {**tiny_raw("fedseal"), "privacy": {"target_epsilon": 8.0}}
    with pytest.raises(ConfigError, match=r"^config key 'privacy.target_epsilon': means nothing"):
        resolve_config(raw)


def test_the_progress_line_shows_the_privacy_spent():
    line = progress_line({"round": 3, "test_accuracy": 0.5, "epsilon": 2.345, "delta": 1e-5}, 9, [])
    assert "epsilon 2.35 (delta 1e-05)" in line
    assert "epsilon inf" in progress_line({"round": 3, "epsilon": None, "delta": 1e-5}, 9, [])
    assert "epsilon" not in progress_line({"round": 3, "test_accuracy": 0.5}, 9, [])


def test_results_json_gives_the_last_rounds_epsilon_and_delta(tmp_path):
    recorder = Recorder(tmp_path, settings_with(mode="server_fixed"), {})
    for rnd, spent in ((1, 0.5), (2, 0.75)):
        recorder.add_round({"round": rnd, "seconds": 1.0, "epsilon": spent, "delta": 1e-5})
    results = recorder.results()
    assert (results["epsilon"], results["delta"]) == (0.75, 1e-5)
    recorder.settings = settings_with(mode="none")
    assert "epsilon" not in recorder.results()


# ----- Refusals ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"method": "fedmatch", "privacy": {"mode": "server_fixed"}}, "privacy.mode"),
        ({"method": "fedsup", "privacy": {"mode": "client_fixed"}}, "privacy.mode"),
        ({"method": "server_sl", "privacy": {"mode": "server_fixed"}}, "privacy.mode"),
        (
            {
                "method": "fedseal",
                "privacy": {"mode": "server_fixed"},
                "aggregate": {"rule": "median"},
            },
            "aggregate.rule",
        ),
        (
            {
                "method": "fedseal",
                "privacy": {"mode": "server_fixed"},
                "eval": {"local_models": True},
            },
            "eval.local_models",
        ),
        (
            {"method": "fedseal", "privacy": {"mode": "server_adaptive", "noise_multiplier": 2.0}},
            "privacy.clipped_count_stddev",
        ),
        ({"method": "fedseal", "privacy": {"mode": "laplace"}}, "privacy.mode"),
    ],
)
def test_a_combination_privacy_does_not_cover_is_refused_in_one_line(raw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        resolve_config(raw)
    assert "\n" not in str(err.value)


# ----- Tiny runs ----------------------------------------------------------------------------
def rows_of(raw: dict, nodes: int = 3) -> list[dict]:
    rows, _ = run_method(raw, InProcessGrid(nodes))
    return without_seconds(rows)


def without_privacy(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in PRIVACY_KEYS} for row in rows]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["server_fixed", "client_fixed"])
def test_noise_zero_and_a_huge_norm_give_the_run_without_privacy(mode):
    """Equal client sizes (equal FedAvg weights): every row equal but the privacy columns."""
    raw = tiny_raw("fedseal")
    private_raw = deep_merge(
        raw, {"privacy": {"mode": mode, "noise_multiplier": 0.0, "clipping_norm": 1e9}}
    )
    plain, dp = rows_of(raw), rows_of(private_raw)
    assert without_privacy(dp) == plain
    assert all(row["epsilon"] is None and row["clipped_fraction"] == 0 for row in dp)


@pytest.mark.slow
def test_clients_clip_their_replies_and_a_cohort_clips_each_client():
    raw = deep_merge(
        tiny_raw("fedseal"),
        {"privacy": {"mode": "client_fixed", "noise_multiplier": 1.0, "clipping_norm": 0.05}},
    )
    grid = InProcessGrid(3)
    rows, _ = run_method(raw, grid)
    trains = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    replies = [r for r in grid.replies if "arrays" in r.content.array_records]
    assert len(replies) == len(trains) == 8  # 2 of 3 clients, 4 rounds
    for node in grid.partition:  # a node's replies come in the order of its messages
        sent = [m for m in trains if m.metadata.dst_node_id == node]
        back = [r for r in replies if r.metadata.src_node_id == node]
        for message, reply in zip(sent, back, strict=True):
            start = record_arrays(message.content["arrays"])
            assert norm_of(record_arrays(reply.content["arrays"]), start) <= 0.05 * (1 + 1e-5)
    assert all(row["clipped_fraction"] == row["norm_bit"] and row["epsilon"] > 0 for row in rows)
    assert any(row["clipped_fraction"] > 0 for row in rows)
    assert [r["epsilon"] for r in rows] == sorted(r["epsilon"] for r in rows)
    cohort = deep_merge(raw, {"simulation": {"execution": "cohort", "workers": 2}})
    assert rows_of(cohort, 2) == without_seconds(rows)


@pytest.mark.slow
def test_a_resumed_private_run_keeps_its_clipping_norm_and_epsilon(tmp_path):
    """server_adaptive: the adapted norm, the releases counted and the noise drawn after a
    resume are those of the uninterrupted run."""
    raw = deep_merge(
        tiny_raw("fedseal"),
        {"privacy": {"mode": "server_adaptive", "noise_multiplier": 0.5, "clipping_norm": 0.1}},
    )
    raw["privacy"]["clipped_count_stddev"] = 1.0
    straight = run_rounds(raw, tmp_path / "straight", snapshot=tmp_path / "killed")
    resumed = run_rounds(raw, tmp_path / "killed", resume=True)
    assert without_seconds(resumed) == without_seconds(straight)
    norms = [row["clipping_norm"] for row in straight]
    assert len(set(norms)) == 4 and norms[0] == 0.1


# ----- Poisson sampling ---------------------------------------------------------------------
def test_poisson_sampling_divides_the_clipped_sum_by_the_expected_count():
    """Two of an expected four clients (40 clients, q = 0.1) send updates 0.5 and 0.3 long
    (unclipped at C = 1): the aggregate is the start plus their sum over 4, without noise."""
    settings = settings_with(mode="server_fixed", noise_multiplier=0.0, sampling="poisson")
    start = {"w": np.zeros(4, np.float32), "count": np.array([3], np.int64)}
    first = {"w": np.array([0.5, 0, 0, 0], np.float32), "count": np.array([7], np.int64)}
    second = {"w": np.array([0, 0.3, 0, 0], np.float32), "count": np.array([7], np.int64)}
    out, metrics = round_of(private(settings), start, [first, second])
    np.testing.assert_allclose(out["w"], [0.125, 0.075, 0, 0], atol=1e-7)
    assert int(out["count"][0]) == 3 and metrics["clipped_fraction"] == 0


def test_poisson_noise_is_calibrated_to_the_expected_count_whoever_came():
    settings = settings_with(mode="server_fixed", noise_multiplier=1.5, sampling="poisson")
    start = {"w": np.zeros(400_000, np.float32)}
    out, metrics = round_of(private(settings), start, [dict(start) for _ in range(2)])
    assert metrics["noise_std"] == pytest.approx(1.5 * 1.0 / 4)  # qN = 4, not the 2 that came
    assert float(np.std(out["w"])) == pytest.approx(1.5 / 4, rel=0.01)


def test_a_round_that_samples_no_client_releases_the_model_plus_noise():
    settings = settings_with(mode="server_fixed", noise_multiplier=1.5, sampling="poisson")
    agg = private(settings)
    start = {"w": np.zeros(400_000, np.float32), "count": np.array([3], np.int64)}
    out, metrics = agg.aggregate_none(1, to_record(start))
    noise = record_arrays(out)["w"]
    assert float(np.std(noise)) == pytest.approx(1.5 / 4, rel=0.01)
    assert int(record_arrays(out)["count"][0]) == 3
    assert agg.releases == 1 and metrics["epsilon"] == pytest.approx(epsilon(1.5, 0.1, 1, 1e-5))


@pytest.mark.slow  # eight rounds of a tiny FedSEAL run, three times (about 20 s)
def test_a_poisson_run_trains_a_varying_number_of_clients_and_goes_on_through_empty_rounds():
    """3 clients, 1 expected a round (q = 1/3): some rounds train none, others two; those
    count as releases and never as failed rounds; the same seed gives the same rows."""
    raw = deep_merge(
        {**tiny_raw("fedseal"), "rounds": 8},
        {
            "federation": {"clients_per_round": 1, "max_failed_rounds": 1},
            "privacy": {"mode": "server_fixed", "noise_multiplier": 1.0, "sampling": "poisson"},
        },
    )
    rows = rows_of(raw)
    counts = [row["clients"] for row in rows]
    assert 0 in counts and max(counts) >= 2 and len(rows) == 8
    assert all(row["noise_std"] == pytest.approx(1.0 * 1.0 / 1) for row in rows)
    spent = [row["epsilon"] for row in rows]
    assert spent == sorted(spent) and spent[-1] == pytest.approx(epsilon(1.0, 1 / 3, 8, 1e-5))
    assert rows_of(raw) == rows
    cohort = deep_merge(raw, {"simulation": {"execution": "cohort", "workers": 2}})
    assert rows_of(cohort, 2) == rows  # a cohort run gives the per-client run's rows


def test_poisson_sampling_without_a_privacy_mode_is_one_line():
    raw = {**tiny_raw("fedseal"), "privacy": {"sampling": "poisson"}}
    with pytest.raises(ConfigError, match=r"^config key 'privacy.sampling': means nothing"):
        resolve_config(raw)
