"""One behaviour model for the whole consortium (issue 43 item 1): the pooled Newton fit of the sites' penalised
multinomial logistic regression from sums that travel only through pairwise-masked secure aggregation
(``evaluation.propensity.fit_shared``; docs/threats.md P67), on a tiny world of four sites.

No Flower here: the masked sums go through the protocol's own state machines (``tests/secagg_harness.py``) with the
evaluation vector's exact encoding (``federation.secure.eval_vector``), as ``federation.secure.secure_evaluation``
carries them; every byte a site sends is kept.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import log_softmax
from secagg_harness import RoundLog, make_identities, run_round

from fcd_secure.aggregation.secagg import SecAggClient, SecAggPolicy, SecAggServer
from fcd_secure.apps.egress import FEDERATION_POLICY
from fcd_secure.audit.rules import PROPENSITY_NAME
from fcd_secure.data.schema import SiteDataset
from fcd_secure.evaluation.propensity import (
    SHARED_FIT_LISTS,
    SHARED_FIT_SCALARS,
    RecordPropensity,
    SharedFitError,
    SharedFitStep,
    fit_shared,
    shared_fit_sums,
)
from fcd_secure.federation.learner import SiteData, with_propensities
from fcd_secure.federation.records import REC_EVAL
from fcd_secure.federation.secure.eval_vector import TENSOR, EvalLayout, decode_sums, encode_sums, schema_of
from fcd_secure.federation.site_policy import MIN_COHORT_FLOOR

K, DA, DX, L = 3, 1, 2, 6


def _site(seed: int, n: int = 40) -> SiteDataset:
    """A site's rows: the logging policy reads the recorded history (the last outcome, a static covariate, the
    previous action), so one model of the record is right at every site; the sites differ in their covariates."""
    rng = np.random.default_rng(seed)
    X = rng.normal(loc=0.3 * seed, size=(n, DX))
    A = rng.normal(size=(n, L, DA))
    T = np.zeros((n, L), np.int64)
    Y = np.zeros((n, L))
    for t in range(L):
        last = Y[:, t - 1] if t else np.zeros(n)
        prev = T[:, t - 1] if t else np.zeros(n, np.int64)
        logits = np.stack([np.zeros(n), 0.8 * X[:, 0] + last, 0.5 * A[:, t, 0] - 0.6 * (prev == 2)], axis=1)
        p = np.exp(log_softmax(logits, axis=1))
        T[:, t] = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(1)
        Y[:, t] = (rng.random(n) < 0.3 + 0.2 * (T[:, t] == 1)).astype(float)
    M = np.ones((n, L))
    M[: n // 4, L - 2 :] = 0.0  # some shorter histories
    return SiteDataset(X=X, A=A, T=T, Y=Y, M=M, n_actions=K, name=f"site{seed}")


@pytest.fixture(scope="module")
def world():
    sites = [_site(s) for s in range(4)]
    model = RecordPropensity(K, DA, DX)
    return sites, [model.training_design(ds) for ds in sites]


class _SecureSums:
    """``ask`` of :func:`fit_shared` through the masked protocol: each step is one secure round among the four sites
    (a fresh round id each), decoded as ``SecureEvaluation.totals`` does; ``uplinks`` and ``inputs`` keep, per site,
    every byte it sent and the plaintext sums it masked."""

    def __init__(self, designs):
        self.designs = designs
        self.sites = [f"site{i:02d}" for i in range(len(designs))]
        self.identities, self.roster = make_identities(self.sites)
        self.policy = SecAggPolicy()
        self.round = 0
        self.uplinks: dict[str, list[bytes]] = {s: [] for s in self.sites}
        self.inputs: dict[str, list[dict]] = {s: [] for s in self.sites}

    def __call__(self, step: SharedFitStep) -> dict:
        self.round += 1
        sums = {s: shared_fit_sums(F, a, K, step) for s, (F, a) in zip(self.sites, self.designs)}
        layout = EvalLayout.of(schema_of(next(iter(sums.values()))), self.policy)
        vlayout = layout.vector_layout()
        clients = {}
        for s in self.sites:
            c = SecAggClient(s, self.identities[s], self.roster, self.policy, vlayout)
            c.set_input(encode_sums(layout, sums[s], MIN_COHORT_FLOOR, self.policy), bytes(32))
            clients[s] = c
            self.inputs[s].append(sums[s])
        server = SecAggServer(self.policy, vlayout, self.sites, round_id=self.round, roster=self.roster)
        log = RoundLog()
        agg = run_round(server, clients, log=log)
        for s in self.sites:
            self.uplinks[s].extend(log.uplink.get(s, []))
        factor = self.policy.max_weight / (self.policy.scale * agg.n_total)
        words = np.rint(np.asarray(agg.theta_c[TENSOR], np.float64) / factor).astype(np.int64)
        return decode_sums(layout, words, len(self.sites))


@pytest.fixture(scope="module")
def shared(world):
    _, designs = world
    ask = _SecureSums(designs)
    model = RecordPropensity(K, DA, DX)
    steps = fit_shared(model, designs[0][0].shape[1], ask)
    return model, steps, ask


def test_the_shared_fit_through_secure_sums_is_the_pooled_centralised_fit(world, shared):
    """docs/threats.md P67: the pooled coefficients are all the server gets, and they are the centralised fit's."""
    _, designs = world
    model, steps, ask = shared
    F, a = np.concatenate([d[0] for d in designs]), np.concatenate([d[1] for d in designs])
    # the centralised fit: every row in one place, the same Newton iterations on its own sums
    central = RecordPropensity(K, DA, DX)
    fit_shared(central, F.shape[1], lambda step: shared_fit_sums(F, a, K, step))
    assert 2 <= steps <= 20 and ask.round >= steps + 2
    np.testing.assert_allclose(model.mean, central.mean, atol=1e-9)
    np.testing.assert_allclose(model.scale, central.scale, atol=1e-9)
    np.testing.assert_allclose(model.coef, central.coef, atol=1e-6, rtol=0)
    # and the site model's own objective, minimised by L-BFGS to a tight tolerance on the pooled rows
    lbfgs = RecordPropensity(K, DA, DX)
    lbfgs.max_iter = 5000
    lbfgs.fit_design(F, a, tol=1e-14)
    np.testing.assert_allclose(model.coef, lbfgs.coef, atol=1e-5, rtol=0)


def test_no_site_sum_reaches_the_server_in_clear(shared):
    """docs/threats.md P67: what a site sends at every step is the protocol's bytes; its own gradient, Hessian and
    feature sums appear in none of them, neither as the encoded words it masked nor as floats."""
    _, _, ask = shared
    for s in ask.sites:
        sent = b"".join(ask.uplinks[s])
        assert sent
        for sums in ask.inputs[s]:
            layout = EvalLayout.of(schema_of(sums), ask.policy)
            words = encode_sums(layout, sums, MIN_COHORT_FLOOR, ask.policy)[2:]
            for key in ("behaviour_fit.grad", "behaviour_fit.hess", "behaviour_fit.f1"):
                if key not in sums:
                    continue
                vals = np.asarray(sums[key], np.float64)
                assert vals.tobytes()[:64] not in sent and vals.astype(np.float32).tobytes()[:32] not in sent
            assert words[:16].tobytes() not in sent and words[-16:].tobytes() not in sent


def test_the_gate_admits_exactly_the_shared_fit_sums():
    """docs/threats.md P67: the egress gate admits the shared fit's sums by name and nothing else like them; none of
    them names a propensity, and a propensity-like name stays refused."""
    admitted = FEDERATION_POLICY.allowed_metrics | set(FEDERATION_POLICY.allowed_metric_lists)
    ours = {f"{REC_EVAL}/{k}" for k in SHARED_FIT_SCALARS + SHARED_FIT_LISTS}
    assert ours <= admitted
    assert {m for m in admitted if "behaviour_fit." in m} == ours
    assert not [k for k in SHARED_FIT_SCALARS + SHARED_FIT_LISTS if PROPENSITY_NAME.search(k)]
    for other in ("behaviour_fit.coef", "propensity_model.grad", "behaviour_prob"):
        assert f"{REC_EVAL}/{other}" not in admitted
    # a site's gate in a run that does not share the model admits none of them (docs/threats.md P68)
    from fcd_secure.apps.egress import federation_policy

    own = federation_policy(shared_behaviour=False)
    assert not [m for m in own.allowed_metrics | set(own.allowed_metric_lists) if "behaviour_fit." in m]


def test_the_sites_use_the_shared_model_where_they_used_their_own(world, shared):
    """The same path downstream (``federation.learner.with_propensities``): the shared model's P̂ of the logged
    action on a site's test rows, floored, with the overlap and reliability sums."""
    sites, _ = world
    model, _, _ = shared
    train, test = sites[0], _site(7, n=20)
    data = SiteData(train=train, test=test, site_index=0, n_sites=4, anchors=(0, 1), oracle=None, description={})
    own = with_propensities(data, "estimated")
    got = with_propensities(data, "estimated", behaviour=model)
    assert got.propensities == own.propensities == "estimated"
    np.testing.assert_allclose(got.test.P, np.where(test.M > 0, np.maximum(model.logged_probs(test), 0.005), 1.0))
    assert not np.allclose(got.test.P, own.test.P)
    assert got.test.meta["propensity_calibration"].shape == own.test.meta["propensity_calibration"].shape


def test_a_shared_fit_with_too_many_coefficients_is_refused():
    F, a = np.zeros((5, 40)), np.zeros(5, np.int64)  # 41 × 12 coefficients
    with pytest.raises(SharedFitError, match="at most"):
        shared_fit_sums(F, a, 12, SharedFitStep())


def test_shared_slopes_with_each_sites_own_intercepts_reach_the_joint_optimum(world):
    """``fit_shared(own_intercepts=True)``: Newton on the slopes of the objective profiled over every site's
    intercepts (each site fits its own, never sent: their sums arrive as zeros) is the joint optimum over the shared
    slopes and all the sites' intercepts, found here by L-BFGS over all of them on the pooled rows."""
    from scipy.optimize import minimize

    from fcd_secure.evaluation.propensity import with_own_intercepts

    _, designs = world
    sent = []

    def ask(step):
        parts = [shared_fit_sums(F, a, K, step) for F, a in designs]
        sent.extend(parts)
        return {k: np.sum([np.asarray(p[k], np.float64) for p in parts], axis=0) for k in parts[0]}

    model = RecordPropensity(K, DA, DX)
    steps = fit_shared(model, designs[0][0].shape[1], ask, own_intercepts=True)
    assert 2 <= steps <= 30 and not np.any(model.coef[0])
    for p in sent:  # no site's intercept sums leave it
        if "behaviour_fit.grad" in p:
            assert not np.any(np.asarray(p["behaviour_fit.grad"]).reshape(-1, K)[0])
    sites = [with_own_intercepts(model, F, a) for F, a in designs]

    # the joint optimum, every row in one place: [b_1 .. b_S, W], the model's objective with each b_s penalised
    Xs = [(F - model.mean) / model.scale for F, _ in designs]
    n, S, Fd = sum(len(x) for x in Xs), len(Xs), Xs[0].shape[1]
    Ys = []
    for (F, a) in designs:
        Y = np.zeros((len(F), K))
        Y[np.arange(len(F)), a] = 1.0
        Ys.append(Y)

    def loss(v):
        b, W = v[: S * K].reshape(S, K), v[S * K:].reshape(Fd, K)
        f, gb, gW = 0.0, np.zeros((S, K)), np.zeros((Fd, K))
        for s, (X, Y) in enumerate(zip(Xs, Ys)):
            lp = log_softmax(X @ W + b[s], axis=1)
            R = np.exp(lp) - Y
            f += -(Y * lp).sum() + 0.5 * len(X) * model.l2 * b[s] @ b[s]
            gb[s] = R.sum(0) + len(X) * model.l2 * b[s]
            gW += X.T @ R
        f = f / n + 0.5 * model.l2 * (W * W).sum()
        return f, np.concatenate([(gb / n).ravel(), (gW / n + model.l2 * W).ravel()])

    res = minimize(loss, np.zeros(S * K + Fd * K), jac=True, method="L-BFGS-B",
                   options={"maxiter": 20000, "gtol": 1e-13, "ftol": 1e-15})
    b, W = res.x[: S * K].reshape(S, K), res.x[S * K:].reshape(Fd, K)
    np.testing.assert_allclose(model.coef[1:], W, atol=1e-5, rtol=0)
    for s, site in enumerate(sites):
        np.testing.assert_allclose(site.coef[0], b[s], atol=1e-5, rtol=0)
        np.testing.assert_array_equal(site.coef[1:], model.coef[1:])
