"""The secure-aggregation carrier on Flower's real simulation engine (Message API, Ray backend, custom actions).

A toy site (deterministic 'training', real site state on disk, real identity keys and roster) stands in for the
Fed-CausalDiff model so that one short simulation can exercise: agreement with the plaintext weighted FedAvg (also
for a round whose keys were set up during the round before), late sites as dropouts under per-stage deadlines (P8,
P17), an aborted round leaving the global model unchanged, and no clear-text number in any uplink (P7)."""

from __future__ import annotations


import numpy as np
import pytest


N_SITES = 5
D = 40


def _toy_update(site_index: int, rnd: int, global_theta: dict) -> tuple[dict, int, float]:
    rng = np.random.default_rng([site_index, rnd])
    theta = {k: (global_theta[k] + 0.1 * rng.normal(size=global_theta[k].shape)).astype(np.float32) for k in sorted(global_theta)}
    return theta, 10 + 7 * site_index, float(1.0 + site_index)


def _build(root: str, delays: dict, sink: dict, deadlines: dict, rounds: int):
    """ServerApp + ClientApp, defined in here so Ray pickles them by value."""
    import time

    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp

    from fcd_secure.aggregation.secagg import SecAggPolicy, StageDeadlines
    from fcd_secure.federation.messaging import Comm
    from fcd_secure.apps.guard import guard_mod
    from fcd_secure.federation.secure.flow import SecureAggregationFlow
    from fcd_secure.apps.secure_site import register_secure_actions
    from fcd_secure.federation.state import SiteState
    from fcd_secure.manifest import THETA_C, THETA_S, Manifest, ManifestEntry

    manifest = Manifest.from_entries(
        ManifestEntry(name=n, shape=s, dtype="float32", part=p)
        for n, s, p in (("w", (D,), THETA_C), ("b", (2, 3), THETA_C), ("private_head", (4,), THETA_S))
    )

    class ToySite:
        def __init__(self, index: int) -> None:
            self.site_index = index
            self.site_id = f"site-{index:02d}"
            self.state = SiteState(root, self.site_id)
            self.cfg = None
            self.manifest = manifest
            self.secagg_policy = SecAggPolicy()  # the site's own pinned parameters

        def train_round(self, global_theta, round_config):
            theta, n, loss = _toy_update(self.site_index, int(round_config["server-round"]), global_theta)
            return theta, n, {"loss": loss, "n": float(n)}

        def identity_private_key(self) -> bytes:
            return self.state.identity_private_key()

    def get_runtime(msg: Message, context: Context) -> ToySite:
        return ToySite(int(context.node_config["partition-id"]))

    def delay_mod(msg: Message, context: Context, call_next):
        key = (int(msg.metadata.group_id or 0), msg.metadata.message_type, int(context.node_config["partition-id"]))
        if key in delays:
            time.sleep(delays[key])
        return call_next(msg, context)

    client = ClientApp(mods=[guard_mod, delay_mod])

    @client.query("hello")
    def hello(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"hello": ConfigRecord({"site-id": get_runtime(msg, context).site_id})}), reply_to=msg)

    register_secure_actions(client, get_runtime)

    class RecordingComm(Comm):
        def send(self, node_ids, message_type, contents, timeout_s, *, round=None):
            replies = super().send(node_ids, message_type, contents, timeout_s, round=round)
            for nid, rep in replies.items():
                if not rep.has_error():
                    sink.setdefault("uplinks", []).append((message_type, rep.content))
            return replies

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        comm = RecordingComm(grid, poll_s=0.01)
        # generous: on a loaded machine the per-site Ray actors can take a minute to start
        deadline = time.monotonic() + 240
        while len(list(grid.get_node_ids())) < N_SITES and time.monotonic() < deadline:
            time.sleep(0.1)
        nodes = sorted(int(n) for n in grid.get_node_ids())
        while len(comm.site_of) < len(nodes) and time.monotonic() < deadline:
            missing = [n for n in nodes if n not in comm.site_of]
            replies = comm.send(missing, "query.hello", RecordDict({"hello": ConfigRecord({})}), 60)
            for nid, rep in replies.items():
                if not rep.has_error():
                    comm.site_of[nid] = str(rep.content["hello"]["site-id"])
        sink["hello"] = len(comm.site_of)
        flow = SecureAggregationFlow(manifest, SecAggPolicy(deadlines=StageDeadlines(**deadlines)))
        theta = {"w": np.zeros(D, np.float32), "b": np.zeros((2, 3), np.float32)}
        for rnd in range(1, rounds + 1):
            comm.round = rnd
            # round 2's keys are set up during round 1 (round 2 then takes three round trips); round 3 sets up its own
            outcome = flow.run_round(comm, nodes, rnd, theta, {"part": THETA_C}, next_node_ids=nodes if rnd == 1 else None)
            sink[rnd] = (dict(theta), outcome, {comm.site_of[n] for n in outcome.participants})
            if outcome.theta_c is not None:
                theta = outcome.theta_c

    return server, client


@pytest.mark.slow
def test_secure_flow_on_flower_simulation(tmp_path):
    from fcd_secure.aggregation.secagg import SecAggPolicy, plaintext_weighted_mean
    from fcd_secure.federation.secure.setup import provision_roster
    from fcd_secure.engines.simulation import quiet_flower_env

    quiet_flower_env()
    from flwr.simulation import run_simulation

    root = str(tmp_path / "state")
    provision_roster(root, [f"site-{i:02d}" for i in range(N_SITES)])
    train_deadline, masked_deadline, late = 10.0, 4.0, 6.5
    delays = {
        # round 2 (keys set up in round 1): one site trains and masks after training + masked-input deadlines
        (2, "train.secagg_train_masked", 4): train_deadline + late,
        (3, "train.secagg_masked_input", 1): late,  # round 3: three miss it -> fewer than t = 4 survive: abort
        (3, "train.secagg_masked_input", 2): late,
        (3, "train.secagg_masked_input", 3): late,
    }
    # only the masked input has late sites; the other deadlines are generous for a loaded CI machine; the simulated
    # sites are warm Ray actors, so no message needs a start allowance (``site_start``) and "late" means late
    deadlines = {"train": train_deadline, "advertise_keys": 30.0, "share_keys": 30.0, "masked_input": masked_deadline,
                 "consistency": 30.0, "unmask": 30.0, "site_start": 0.0}
    sink: dict = {}
    server, client = _build(root, delays, sink, deadlines, rounds=3)
    # one single-process actor per site (fractional CPUs), so that a sleeping (late) site holds up nobody else
    backend = {
        "client_resources": {"num_cpus": 0.4, "num_gpus": 0.0},
        "init_args": {"num_cpus": 2, "logging_level": "ERROR", "log_to_driver": False, "include_dashboard": False},
    }
    run_simulation(server_app=server, client_app=client, num_supernodes=N_SITES, backend_config=backend)
    assert sink.get("hello") == N_SITES, "not every site answered hello (machine too loaded to start the actors?)"
    assert {1, 2, 3} <= set(sink), "the simulation did not finish its rounds"

    policy = SecAggPolicy()
    for rnd in (1, 2):
        global_before, outcome, participants = sink[rnd]
        assert outcome.theta_c is not None, outcome.metrics
        sites = sorted(int(p.split("-")[1]) for p in participants)
        assert len(sites) >= 3
        assert outcome.metrics["secagg"]["pipelined"] is (rnd == 2)
        if rnd == 2:
            assert 4 not in sites  # the late site is a dropout (P17), its vector never enters (P9)
            assert outcome.metrics["secagg"]["masked_input"] == len(sites)
        updates = [_toy_update(i, rnd, global_before)[:2] for i in sites]
        deltas = [({k: t[k].astype(np.float64) - global_before[k] for k in t}, n) for t, n in updates]
        ref = {k: global_before[k] + v for k, v in plaintext_weighted_mean(policy, deltas).items()}
        bound = outcome.metrics["quantisation_bound"]
        for k in ref:
            assert np.abs(outcome.theta_c[k] - ref[k]).max() <= bound, (rnd, k)
        assert outcome.n_total == sum(n for _, n in updates)
        loss_ref = sum((1.0 + i) * (10 + 7 * i) for i in sites) / outcome.n_total
        assert outcome.metrics["train_loss"] == pytest.approx(loss_ref, abs=1e-4)
    assert sink[1][2] == {f"site-{i:02d}" for i in range(N_SITES)} or len(sink[1][2]) >= 3

    _, outcome3, _ = sink[3]
    assert outcome3.theta_c is None and "threshold" in outcome3.metrics["aborted"]  # global model unchanged (P8)

    # P7: the uplink of every secure action carries protocol bytes or an acknowledgement, never a count or metric
    uplinks = sink["uplinks"]
    assert {"train.secagg_masked_input", "train.secagg_train_masked", "train.secagg_train_advertise"} <= {t for t, _ in uplinks}
    for mtype, content in uplinks:
        if not mtype.startswith("train.secagg_"):
            continue
        assert list(content.keys()) == ["secagg"], mtype
        assert not content.array_records and not content.metric_records
        rec = dict(content["secagg"])
        assert list(rec) == ["msg"] and isinstance(rec["msg"], bytes)


@pytest.mark.slow
def test_tiny_run_secure_equals_plain_fedavg_within_the_quantisation_bound(tmp_path):
    """The real Fed-CausalDiff sites of ``--preset tiny`` (model, data, site state, guard and egress-gate mods):
    the same sampled sites train round 1 from the same global Θc once for plain FedAvg and once for secure
    aggregation (a site re-running a round trains from the same snapshot with the same seed), in one simulation.
    The two new global Θc agree within the protocol's quantisation bound."""
    import torch

    from fcd_secure.config import build_config
    from fcd_secure.federation import learner
    from fcd_secure.apps.client_app import make_client_app
    from fcd_secure.federation.messaging import Comm
    from fcd_secure.federation.plain_flow import PlainFedAvgFlow
    from fcd_secure.federation.sampler import ClientSampler
    from fcd_secure.federation.secure.flow import SecureAggregationFlow
    from fcd_secure.federation.secure.setup import provision_roster
    from fcd_secure.apps.server_loop import hello, wait_for_nodes
    from fcd_secure.engines.simulation import backend_config, quiet_flower_env, write_simulated_policies
    from fcd_secure.apps.site import default_site_id
    from fcd_secure.manifest import THETA_C

    torch.set_num_threads(1)
    quiet_flower_env()
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    state = tmp_path / "state"
    cfg = build_config("tiny", {"federation": {"rounds": 1, "secure_aggregation": True}, "state_dir": str(state)})
    provision_roster(state, [default_site_id(i) for i in range(cfg.data.n_sites)])
    # the server sends the same round in clear and then masked; these sites' own policies admit both (a site that
    # requires secure aggregation refuses the clear one, test_site_authority.py)
    site_cfg = cfg.model_copy(update={"federation": cfg.federation.model_copy(update={"secure_aggregation": False})})
    write_simulated_policies(site_cfg)
    sink: dict = {}
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        fed = cfg.federation
        comm = Comm(grid, poll_s=fed.poll_s)
        nodes = wait_for_nodes(grid, cfg.data.n_sites, fed.node_wait_s)
        sites = hello(comm, nodes, fed.round_timeout_s, cfg.data.n_sites)
        model = learner.build_model(cfg, sites[0].dims)
        theta = model.get_params(THETA_C)
        chosen = ClientSampler(cfg.seed, cfg.data.n_sites, fed.clients_per_round).sample()
        node_ids = [sites[i].node_id for i in chosen]
        round_config = {"part": THETA_C, "local-epochs": fed.local_epochs}
        plain = PlainFedAvgFlow(
            model.manifest().specs(THETA_C), max_count=cfg.secagg.max_weight, timeout_s=fed.round_timeout_s
        )
        sink["plain"] = plain.run_round(comm, node_ids, 1, theta, round_config)
        secure = SecureAggregationFlow.from_config(cfg, model.manifest())
        sink["secure"] = secure.run_round(comm, node_ids, 1, theta, round_config)
        sink["global"] = theta

    run_simulation(server_app=server, client_app=make_client_app(site_cfg), num_supernodes=cfg.data.n_sites,
                   backend_config=backend_config(2))
    assert {"plain", "secure"} <= set(sink), "the ServerApp did not finish (see the captured log)"
    plain, secure = sink["plain"], sink["secure"]
    assert plain.theta_c is not None, plain.metrics
    assert secure.theta_c is not None, secure.metrics
    assert sorted(plain.participants) == sorted(secure.participants), (plain.failures, secure.failures, secure.metrics)
    assert len(secure.participants) == cfg.federation.clients_per_round, secure.metrics
    assert secure.n_total == plain.n_total
    assert secure.metrics["clipped_fraction"] == 0.0
    bound = secure.metrics["quantisation_bound"]
    assert 0 < bound < 1e-3
    worst = max(float(np.abs(secure.theta_c[k] - plain.theta_c[k]).max()) for k in plain.theta_c)
    assert worst <= bound
    moved = max(float(np.abs(plain.theta_c[k] - sink["global"][k]).max()) for k in plain.theta_c)
    assert moved > 10 * bound  # the round really trained: the comparison is not between two copies of the start
    assert secure.metrics["train_loss"] == pytest.approx(plain.metrics["train_loss"], rel=1e-3)


# -- configuration of the carrier (no simulation needed) ------------------------------------------------------------
def test_roster_provisioning_is_idempotent_and_loads_back(tmp_path):
    from fcd_secure.aggregation.secagg.keys import ed25519_public
    from fcd_secure.federation.secure.setup import ROSTER_FILE, load_roster, provision_roster
    from fcd_secure.federation.state import SiteState

    sites = ["site-00", "site-01", "site-02"]
    first = provision_roster(tmp_path, sites)
    again = provision_roster(tmp_path, sites)
    assert first == again == load_roster(tmp_path / ROSTER_FILE)
    for s in sites:  # the roster pins exactly the key each site keeps in its own state
        assert first[s] == ed25519_public(SiteState(tmp_path, s).identity_private_key())


@pytest.mark.parametrize(
    "text,match",
    [
        ("not json", "not valid JSON"),
        ('{"sites": {}}', "non-empty"),
        ('{"sites": {"site-00": "zz"}}', "'site-00' is not hex"),
        ('{"sites": {"site-00": "abcd"}}', "32-byte"),
    ],
)
def test_bad_roster_files_are_refused_naming_file_and_entry(tmp_path, text, match):
    from fcd_secure.federation.secure.setup import SecureAggregationConfigError, load_roster

    p = tmp_path / "roster.json"
    p.write_text(text)
    with pytest.raises(SecureAggregationConfigError, match=match) as err:
        load_roster(p)
    assert str(p) in str(err.value)
    with pytest.raises(SecureAggregationConfigError, match="cannot read"):
        load_roster(tmp_path / "missing.json")


def test_site_policy_file_is_validated(tmp_path):
    from fcd_secure.federation.site_policy import SitePolicy, SitePolicyError

    good = tmp_path / "policy.toml"
    good.write_text("[secagg]\nmin_sites = 4\nthreshold_rule = 'two_thirds'\n")
    pol = SitePolicy.load(good).secagg
    assert pol.min_sites == 4 and pol.min_threshold(9) == 7
    bad = tmp_path / "weak.toml"
    bad.write_text("[secagg]\nmin_sites = 2\n")
    with pytest.raises(SitePolicyError, match="weak.toml"):
        SitePolicy.load(bad)


def test_secure_flow_refuses_theta_s_sync_and_too_few_sites_per_round():
    from fcd_secure.config import build_config
    from fcd_secure.federation.flows import check_flow, make_flow
    from fcd_secure.federation.secure.flow import SecureAggregationFlow
    from fcd_secure.federation.secure.setup import SecureAggregationConfigError
    from fcd_secure.manifest import THETA_C, THETA_S
    from secagg_harness import toy_manifest

    with pytest.raises(SecureAggregationConfigError, match="P15"):
        check_flow(build_config("tiny", {"federation": {"sync": "full", "secure_aggregation": True}}))
    with pytest.raises(SecureAggregationConfigError, match="P10"):
        check_flow(
            build_config("tiny", {"data": {"n_sites": 4}, "federation": {"clients_per_round": 2, "secure_aggregation": True}})
        )
    with pytest.raises(SecureAggregationConfigError, match="P6"):
        check_flow(
            build_config("tiny", {"data": {"n_sites": 80}, "federation": {"clients_per_round": 40, "secure_aggregation": True}})
        )
    manifest = toy_manifest([("w", (3,), THETA_C), ("s", (2,), THETA_S)])
    flow = make_flow(build_config("tiny", {"federation": {"secure_aggregation": True}}), manifest)
    assert isinstance(flow, SecureAggregationFlow) and flow.policy.min_sites == 4
    assert [name for name, _ in flow.layout.tensors] == ["w"] and flow.layout.private_names == {"s"}
    # the policy the server proposes is the run config's [secagg] section
    cfg = build_config("tiny", {"data": {"n_sites": 8}, "federation": {"clients_per_round": 4, "secure_aggregation": True},
                                "secagg": {"min_sites": 4, "clip": 0.5}})
    assert make_flow(cfg, manifest).policy == cfg.secagg
    with pytest.raises(SecureAggregationConfigError, match="P10"):
        check_flow(cfg.model_copy(update={"federation": cfg.federation.model_copy(update={"clients_per_round": 3})}))


def test_site_policy_comes_from_the_site_never_from_the_server(tmp_path):
    from flwr.app import Context, RecordDict

    from fcd_secure.aggregation.secagg import SecAggPolicy
    from fcd_secure.config import build_config
    from fcd_secure.federation.records import RUN_CONFIG_KEY
    from fcd_secure.apps.site import SiteRuntime
    from fcd_secure.federation.site_policy import SitePolicy

    own = build_config("tiny", {"secagg": {"min_sites": 4}})

    def ctx(node_config=None, run_config=None):
        nc = {"partition-id": 0, "state-dir": str(tmp_path / "state"), **(node_config or {})}
        return Context(run_id=1, node_id=1, node_config=nc, state=RecordDict(), run_config=run_config or {})

    # no policy file on the site: the strict shipped defaults, whatever the run config proposes
    assert SiteRuntime.from_context(ctx(), own).secagg_policy == SecAggPolicy()
    # a config that arrived from the server never sets the policy it is checked against
    weak_from_server = build_config("tiny", {"secagg": {"clip": 64.0, "scale_bits": 20}})
    rt = SiteRuntime.from_context(ctx(run_config={RUN_CONFIG_KEY: weak_from_server.to_json()}), weak_from_server, own_config=False)
    assert rt.secagg_policy == SecAggPolicy() and rt.cfg.secagg == SecAggPolicy()
    # the site's policy file wins over the run config
    f = tmp_path / "policy.toml"
    SitePolicy(secagg=SecAggPolicy(min_sites=5)).write(f)
    rt = SiteRuntime.from_context(ctx(node_config={"site-policy": str(f)}, run_config={RUN_CONFIG_KEY: own.to_json()}), own)
    assert rt.secagg_policy.min_sites == 5 and rt.cfg.secagg.min_sites == 5
