"""The federation's exact egress allow-list: every metric and config name its replies carry today, nothing more.

The egress gate allows names, never patterns (:class:`~fcd_secure.audit.rules.GatePolicy`): ``eval/*`` would let
any value out under a fresh key, ``hello/dim-*`` any bytes. The federation's names are built here from what they
are made of: the training losses of the local objective (paper §III-C: L_recon, L_diff, L_dis, L_cf, L_align and
their total) with the DP figures, the evaluation sums of ``queries.evaluation`` (effects, policy values, the
IPW / SNIPW / per-decision DR sums per policy and estimator, over the full and a truncated horizon, and the AUC
histograms of length ``auc_bins``), and the ``query.hello`` identity and dimensions.

Record names are the federation's wire vocabulary (``fcd_secure.federation.records``) and the policy names are the
data layer's (``fcd_secure.data.policy.DEFAULT_POLICY_NAMES``): the binding passes both in, since the audit layer
imports neither the layer above it nor the data layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from fcd_secure.audit.rules import ConfigFieldRule, GatePolicy

__all__ = [
    "AUC_BINS",
    "EVAL_ESTIMATORS",
    "HELLO_DIMS",
    "TRAIN_METRICS",
    "eval_metric_names",
    "federation_gate_policy",
]

#: ``metrics/<name>`` of a plain ``train`` reply: ``train_local``'s loss parts, ``n``/``steps``/``epochs``, and the
#: DP figures of ``privacy.engine.train_round_private``.
TRAIN_METRICS = (
    "recon", "diff", "dis", "cf", "align", "total", "n", "steps", "epochs",
    "dp_epsilon", "dp_delta", "dp_sigma", "dp_steps",
)  # fmt: skip
#: Off-policy estimators every site reports per policy (``ope.<policy>.<estimator>[_h<H>].<field>``).
EVAL_ESTIMATORS = ("ipw", "snipw", "dr")
#: Scalars of one evaluation reply besides the per-policy ones.
EVAL_SCALARS = ("n_test", "effect.n", "effect.sse", "effect.sum_hat", "effect.sum_true", "effect.sum_true_sq",
                "effect.sum_hat_sq", "effect.sum_cross", "effect.regime_off", "effect.regime_on")
#: The cluster sums of the identified one-step effect (``queries.targeted.ONE_STEP_FIELDS``; a test holds them equal).
_SN = ("D", "m", "A", "Wa", "B", "Wb")
ONE_STEP_SCALARS = (tuple(f"onestep.{f}" for f in ("n", "s", "m", "ss", "mm", "sm", "sim", "true", "clipped"))
                    + tuple(f"onestep.sn.{k}" for k in _SN)
                    + tuple(f"onestep.sn.{k}.{l}" for i, k in enumerate(_SN) for l in _SN[i:]))
#: The truth-free selection sums a site adds to a scored evaluation (``queries.selection.KEYS``; a test holds them equal).
SELECTION_SCALARS = ("select.d1.n", "select.d1.s", "select.d1.ss", "select.d1.clipped", "select.fit.n", "select.fit.s",
                     "select.sites") + tuple(f"select.dh.{f}" for f in ("n", "s", "ss", "clipped", "sw_on", "sww_on",
                                                                         "sw_off", "sww_off"))
POLICY_FIELDS = ("n", "sim_sum", "true_sum")
OPE_FIELDS = ("n", "sum_value", "sum_weight", "sum_weight_sq", "n_consistent", "finite")
#: ``hello/dim-<d>`` of the hello reply (``learner.dims_of``).
HELLO_DIMS = ("dx", "da", "n_actions", "n_sites", "L")
#: The AUC histograms (``auc.pos`` / ``auc.neg``) have this many cells (``queries.evaluation.AUC_BINS``).
AUC_BINS = 100


def eval_metric_names(
    policy_names: Iterable[str], estimators: Iterable[str] = EVAL_ESTIMATORS, ope_horizons: Iterable[int] = ()
) -> list[str]:
    """Every scalar key of an evaluation reply (without the record name), for these policies and estimators."""
    names = list(EVAL_SCALARS) + list(SELECTION_SCALARS) + list(ONE_STEP_SCALARS)
    suffixes = [""] + [f"_h{int(h)}" for h in ope_horizons]
    for pol in policy_names:
        names += [f"policy.{pol}.{f}" for f in POLICY_FIELDS]
        for est in estimators:
            for suffix in suffixes:
                names += [f"ope.{pol}.{est}{suffix}.{f}" for f in OPE_FIELDS]
    return names


def federation_gate_policy(
    *,
    policy_names: Sequence[str],
    estimators: Sequence[str] = EVAL_ESTIMATORS,
    ope_horizons: Sequence[int] = (),
    auc_bins: int = AUC_BINS,
    train_metrics: Sequence[str] = TRAIN_METRICS,
    dims: Sequence[str] = HELLO_DIMS,
    rec_hello: str = "hello",
    rec_num: str = "num",
    rec_metrics: str = "metrics",
    rec_eval: str = "eval",
    **policy: Any,
) -> GatePolicy:
    """The federation's egress policy: exact names, list caps and config types.

    Args:
        policy_names: the treatment policies evaluated (``data.policy.DEFAULT_POLICY_NAMES``).
        estimators: the off-policy estimators reported per policy.
        ope_horizons: truncated horizons H also reported (``evaluation.ope_horizon``), as ``<estimator>_h<H>``.
        auc_bins: cells of each AUC histogram (its list cap).
        train_metrics: the ``metrics`` keys of a training reply.
        dims: the ``dim-<d>`` keys of the hello reply.
        rec_hello: record names of the federation's replies (``federation.records``).
        rec_num: see ``rec_hello``.
        rec_metrics: see ``rec_hello``.
        rec_eval: see ``rec_hello``.
        **policy: further :class:`~fcd_secure.audit.rules.GatePolicy` fields (e.g. ``allow_theta_s_upload``).

    Returns:
        The policy; every name in it is exact.
    """
    scalars = {f"{rec_num}/n"} | {f"{rec_metrics}/{m}" for m in train_metrics}
    scalars |= {f"{rec_eval}/{m}" for m in eval_metric_names(policy_names, estimators, ope_horizons)}
    lists = {f"{rec_eval}/auc.pos": int(auc_bins), f"{rec_eval}/auc.neg": int(auc_bins)}
    config = {
        f"{rec_hello}/site-id": ConfigFieldRule(type="str", max_len=64),
        f"{rec_hello}/site-index": ConfigFieldRule(type="int", max_abs=2**16),
        f"{rec_hello}/layout-hash": ConfigFieldRule(type="str", max_len=64),
        **{f"{rec_hello}/dim-{d}": ConfigFieldRule(type="int", max_abs=2**24) for d in dims},
    }
    return GatePolicy(allowed_metrics=frozenset(scalars), allowed_metric_lists=lists, allowed_config_keys=config, **policy)
