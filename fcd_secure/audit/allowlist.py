"""The federation's exact egress allow-list: every metric and config name its replies carry, nothing more.

The egress gate allows names, never patterns (:class:`~fcd_secure.audit.rules.GatePolicy`): ``eval/*`` would let
any value out under a fresh key, ``hello/dim-*`` any bytes. The names of the training reply (the local objective's
losses, paper §III-C: L_recon, L_diff, L_dis, L_cf, L_align and their total, with the DP figures) and of the hello
reply are declared here; the evaluation sums are declared by the queries that send them (``queries.registry``), and
the binding passes their names in (``apps.egress``), since the audit layer imports neither the layers above it nor
the data layer. Record names are the federation's wire vocabulary (``fcd_secure.federation.records``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fcd_secure.audit.rules import ConfigFieldRule, GatePolicy

__all__ = ["HELLO_DIMS", "TRAIN_METRICS", "federation_gate_policy"]

#: ``metrics/<name>`` of a plain ``train`` reply: ``train_local``'s loss parts, ``n``/``steps``/``epochs``, and the
#: DP figures of ``privacy.engine.train_round_private``.
TRAIN_METRICS = (
    "recon", "diff", "dis", "cf", "align", "total", "n", "steps", "epochs",
    "dp_epsilon", "dp_delta", "dp_sigma", "dp_steps",
)  # fmt: skip
#: ``hello/dim-<d>`` of the hello reply (``learner.dims_of``).
HELLO_DIMS = ("dx", "da", "n_actions", "n_sites", "L")


def federation_gate_policy(
    *,
    eval_names: Iterable[str] = (),
    eval_lists: Mapping[str, int] | None = None,
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
        eval_names: the scalar sums an evaluation reply may carry (``queries.registry.metric_names``).
        eval_lists: its list-valued sums with their length caps (``queries.registry.metric_lists``).
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
    scalars |= {f"{rec_eval}/{m}" for m in eval_names}
    lists = {f"{rec_eval}/{m}": int(cap) for m, cap in (eval_lists or {}).items()}
    config = {
        f"{rec_hello}/site-id": ConfigFieldRule(type="str", max_len=64),
        f"{rec_hello}/site-index": ConfigFieldRule(type="int", max_abs=2**16),
        f"{rec_hello}/layout-hash": ConfigFieldRule(type="str", max_len=64),
        f"{rec_hello}/behaviour": ConfigFieldRule(type="str", max_len=16),
        **{f"{rec_hello}/dim-{d}": ConfigFieldRule(type="int", max_abs=2**24) for d in dims},
    }
    return GatePolicy(allowed_metrics=frozenset(scalars), allowed_metric_lists=lists, allowed_config_keys=config, **policy)
