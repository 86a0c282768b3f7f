"""Plain FedAvg survives one malicious or broken site (docs/threats.md P26): a NaN update, a float64 1e300 update, a claimed
n = 1e12 and a wrong shape are each dropped and named, and the round goes on with the honest sites."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fcd_secure.aggregation.fedavg import fedavg, screen_update
from fcd_secure.federation.records import REC_NUM, REC_UPDATE

SPECS = {"w": ((2, 3), "float32"), "b": ((3,), "float32")}


def good(value: float = 0.5) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), value, np.float32), "b": np.full(3, value, np.float32)}


@pytest.mark.parametrize(
    ("arrays", "n", "why"),
    [
        ({**good(), "w": np.full((2, 3), np.nan, np.float32)}, 10, "NaN or inf"),
        ({**good(), "w": np.full((2, 3), 1e300, np.float64)}, 10, "dtype float64"),
        (good(), 1e12, "whole number in [1, 32768]"),
        (good(), 2.5, "whole number"),
        (good(), -3, "whole number"),
        (good(), "many", "not a number"),
        ({**good(), "w": np.zeros((3, 2), np.float32)}, 10, "shape (3, 2)"),
        ({"w": good()["w"]}, 10, "missing ['b']"),
        ({**good(), "theta_s.x": np.zeros(3, np.float32)}, 10, "unexpected ['theta_s.x']"),
    ],
)
def test_screen_update_names_what_is_wrong(arrays, n, why):
    reason = screen_update(arrays, n, SPECS, max_count=32768)
    assert reason is not None and why in reason


def test_screen_update_accepts_a_well_formed_update():
    assert screen_update(good(), 10, SPECS, max_count=32768) is None
    assert screen_update(good(), 32768.0, SPECS, max_count=32768) is None


def test_the_attacks_wreck_an_unscreened_average():
    """Negative control: without screening, one site's update decides the round."""
    with np.errstate(over="ignore"):
        cast = fedavg([good(), {**good(), "w": np.full((2, 3), 1e300)}], [10, 10])[0]["w"].astype(np.float32)
    assert not np.isfinite(cast).all()  # the global Θc becomes inf
    taken_over = fedavg([good(0.5), good(9.0)], [10, 1e12])[0]["w"]
    assert np.allclose(taken_over, 9.0)  # the claimed count replaces the model


class _MaliciousSites(ClientApp):
    """The real ClientApp of every site, except that some sites rewrite their training reply *after* their own
    egress gate — what a malicious site, which does not run our gate, can send."""

    def __init__(self, inner: ClientApp, attacks: dict[int, str]) -> None:
        super().__init__()
        self.inner, self.attacks = inner, attacks

    def __call__(self, message: Message, context: Context) -> Message:
        reply = self.inner(message, context)
        attack = self.attacks.get(int(context.node_config["partition-id"]))
        if attack is None or message.metadata.message_type != "train" or reply.has_error():
            return reply
        arrays = {k: v.numpy() for k, v in reply.content[REC_UPDATE].items()}
        name = sorted(arrays)[0]
        n = 100
        if attack == "nan":
            arrays[name] = np.full_like(arrays[name], np.nan)
        elif attack == "huge":
            arrays[name] = np.full(arrays[name].shape, 1e300, np.float64)
        elif attack == "count":
            n = int(1e12)
        elif attack == "shape":
            arrays[name] = np.zeros(arrays[name].size + 1, arrays[name].dtype)
        reply.content[REC_UPDATE] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})
        reply.content[REC_NUM] = MetricRecord({"n": n})
        return reply


@pytest.mark.slow
def test_a_round_with_four_malicious_sites_goes_on_with_the_honest_one(tmp_path, one_torch_thread):
    from flwr.simulation import run_simulation

    from fcd_secure.config import build_config
    from fcd_secure.apps.client_app import make_client_app
    from fcd_secure.federation.sampler import ClientSampler
    from fcd_secure.apps.server_app import make_server_app
    from fcd_secure.engines.simulation import backend_config, quiet_flower_env, write_simulated_policies
    from fcd_secure.apps.site import default_site_id

    quiet_flower_env()
    cfg = build_config(
        "tiny",
        # ten sites, five a round: four attackers and one honest site
        {"data": {"n_sites": 10, "test_fraction": 0.2},
         "federation": {"rounds": 1, "eval_every": 0, "secure_aggregation": False, "clients_per_round": 5},
         "state_dir": str(tmp_path / "state")},
    )
    chosen = ClientSampler(cfg.seed, cfg.data.n_sites, cfg.federation.clients_per_round).sample()
    attacks = dict(zip(chosen, ("nan", "huge", "count", "shape")))
    honest = [i for i in chosen if i not in attacks]
    assert len(honest) == 1
    sink: dict = {}
    write_simulated_policies(cfg)  # these hospitals chose plain FedAvg; without a policy a site requires secure mode
    run_simulation(
        server_app=make_server_app(cfg, sink=sink),
        client_app=_MaliciousSites(make_client_app(cfg), attacks),
        num_supernodes=cfg.data.n_sites,
        backend_config=backend_config(2),
    )
    result = sink["result"]
    row = result.history[0]
    assert not row["aborted"] and row["participants"] == 1
    for i in attacks:
        assert default_site_id(i) in row["dropped"]
    assert all(np.isfinite(v).all() for v in result.theta.values())
    # the README's promise: the dropped sites are named in the round's `dropped` column of rounds.csv
    from fcd_secure.apps.outputs import rounds_csv_text

    import csv
    import io

    (line,) = list(csv.DictReader(io.StringIO(rounds_csv_text(result.history))))
    assert all(default_site_id(i) in line["dropped"] for i in attacks)


# -- P32: finite but absurd updates and model replacement -------------------------------------------------------------
_N_TOY = 5
_TOY_COUNT = 100


def _toy_rounds(attacks: dict[int, str], samples: list[list[int]]):
    """Plain FedAvg rounds of toy sites on the in-process grid (real Flower messages, the real flow), round r sampling
    the site indices ``samples[r - 1]``: an honest site moves the global model by a small step of its own; an attacker
    sends ``attacks[index]``. Returns the outcome of the last round and the global model it started from."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from fcd_secure.engines.inprocess import InProcessGrid
    from fcd_secure.federation.messaging import Comm
    from fcd_secure.federation.plain_flow import PlainFedAvgFlow
    from fcd_secure.federation.records import REC_GLOBAL, record_to_global

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        g = record_to_global(msg.content[REC_GLOBAL])
        rng = np.random.default_rng([i, int(msg.content["config"]["server-round"])])
        theta = {k: (v + 0.01 * rng.normal(size=v.shape)).astype(np.float32) for k, v in g.items()}
        attack = attacks.get(i)
        if attack == "3e38":  # finite float32: passes the NaN / inf / dtype screen
            theta = {k: np.full(v.shape, 3e38, np.float32) for k, v in g.items()}
        elif attack == "replace":  # scaled so that the weighted average of the round becomes 42 everywhere
            others = (len(msg.content["config"]["sample"]) - 1) * _TOY_COUNT
            theta = {k: ((42.0 * (others + _TOY_COUNT) - others * v) / _TOY_COUNT).astype(np.float32)
                     for k, v in g.items()}
        return Message(RecordDict({REC_UPDATE: ArrayRecord({k: Array(v) for k, v in theta.items()}),
                                   REC_NUM: MetricRecord({"n": _TOY_COUNT})}), reply_to=msg)

    grid = InProcessGrid(app, _N_TOY)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, grid.run_id, SUPERLINK_NODE_ID
    comm = Comm(grid, poll_s=0.0)
    nodes = list(grid.get_node_ids())
    comm.site_of.update({n: f"site-{i:02d}" for i, n in enumerate(nodes)})
    flow = PlainFedAvgFlow(SPECS, max_count=32768)
    theta = {k: np.zeros(shape, np.float32) for k, (shape, _) in SPECS.items()}
    for rnd, sample in enumerate(samples, start=1):
        before = theta
        outcome = flow.run_round(comm, [nodes[i] for i in sample], rnd, theta, {"sample": "x" * len(sample)})
        theta = outcome.theta_c if outcome.theta_c is not None else theta
    return outcome, before


@pytest.mark.parametrize("attack", ["3e38", "replace"])
def test_a_finite_absurd_update_or_a_model_replacement_is_dropped_and_named(attack):
    """P32: one site's finite float32 3e38 update, or its model replacement scaled so that the global model becomes 42
    everywhere, passes the per-update screen (finite, right shape and dtype, a plausible count); the round's norm screen
    against the median of the round's update norms drops and names it, and the honest sites' average is the result."""
    outcome, before = _toy_rounds({2: attack}, [list(range(_N_TOY))])
    assert outcome.theta_c is not None
    assert "site-02" in outcome.metrics.get("dropped", {}), outcome.metrics
    assert "update norm" in outcome.metrics["dropped"]["site-02"]
    assert len(outcome.participants) == _N_TOY - 1
    for k, v in outcome.theta_c.items():
        assert np.isfinite(v).all() and np.abs(v - before[k]).max() < 0.1, (k, v)


def test_an_honest_round_drops_nobody_by_norm():
    outcome, _ = _toy_rounds({}, [list(range(_N_TOY))] * 2)
    assert "dropped" not in outcome.metrics and len(outcome.participants) == _N_TOY


def test_a_round_too_small_for_a_median_keeps_the_last_rounds_bound():
    """P32: with two sites no median tells the outlier from the honest site; the bound of the last round that had
    one still holds."""
    outcome, before = _toy_rounds({2: "3e38"}, [[0, 1, 3, 4], [1, 2]])
    assert outcome.theta_c is not None and "site-02" in outcome.metrics.get("dropped", {}), outcome.metrics
    assert np.abs(outcome.theta_c["w"] - before["w"]).max() < 0.1

    from fcd_secure.aggregation.fedavg import norm_bound

    assert norm_bound([1.0, 1e30], 0.0) is None
    assert norm_bound([1.0, 1.2, 1e30], 0.0) == pytest.approx(12.0)
    assert norm_bound([0.0, 0.0, 0.0], 0.0) > 0  # a round of still sites does not shut out one that moved a little
