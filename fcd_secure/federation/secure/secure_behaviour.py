"""The consortium's shared behaviour model through secure aggregation (``evaluation.behaviour_model = "shared"``, or
``"shared_slopes"``: shared slopes with each site's own intercepts; ``config.EvaluationSection
.shares_behaviour_model``; issue 43; docs/threats.md P67, P68).

Before the first training round the server drives the pooled Newton fit of the sites' penalised multinomial logistic
regression (``evaluation.propensity.fit_shared``): every step of the fit is one secure round of the *evaluation* kind
(``federation.secure.secure_evaluation``: same protocol, roster and exact encoding as round 0's statistics,
``federation.secure.secure_stats``):

1. ``train.secagg_evaluate`` with ``purpose = "behaviour"`` and the step (``behaviour-step``: nothing at the moments
   step, else the pooled z-scoring and the current coefficients, ``SharedFitStep.to_json``): each site takes the
   step's sums over its own training rows as loaded (``federation.learner.behaviour_fit_sums``), keeps them in node
   memory and replies with their schema only;
2. the masked vectors are summed; the server decodes the totals and takes the next step from them.

The fit's rounds count from 1 on their own replay counter at each site (``apps.secure_site.BEHAVIOUR_REPLAY_SLOT``),
apart from the evaluation rounds' (round 0's statistics, then the scored rounds): a site takes part in each of them
once per run and in increasing order (P5). Only the sums named ``behaviour_fit.*`` leave (the egress gate's own
allow-list, ``apps.egress.federation_policy``). Every site must take part in every step: a step any site misses
stops the run, as round 0 does (a pooled fit without a hospital is not the consortium's).

With ``shared_slopes`` every step says so (``SharedFitStep.own_intercepts`` and the intercepts' penalty ``l2``):
each site fits its own intercepts to the step's slopes and sends the sums of its objective profiled over them
(``evaluation.propensity.shared_fit_sums``), the intercepts' gradient and Hessian entries as zeros; its intercepts
never leave it, and the fitted model's intercept row is zero.

The fitted model (the pooled z-scoring and coefficients) then goes to the sites with every evaluation request
(``queries.request.EvaluationRequest.behaviour``); each site applies it where it would apply its own
(``federation.learner.with_propensities``), with ``shared_slopes`` after completing its copy with its own
intercepts on its training rows (``evaluation.propensity.with_own_intercepts``). A server that sends another model can only mislabel the answers'
weights, as one that sends false statistics can: the model enters a site's computation, never its uplink.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fcd_secure.errors import FcdError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from fcd_secure.config import RunConfig
    from fcd_secure.evaluation.propensity import SharedFitStep
    from fcd_secure.federation.messaging import Comm
    from fcd_secure.manifest import Manifest

#: ``purpose`` of the evaluation request that asks for a step's sums of the shared behaviour model
BEHAVIOUR_PURPOSE = "behaviour"
#: the request field that carries the step (``SharedFitStep.to_json``, JSON)
BEHAVIOUR_STEP_KEY = "behaviour-step"
#: the most rounds of one run's fit a site answers (its replay counter refuses a higher round id unclaimed, P31, P68):
#: an honest fit takes the moments step, then one round per Newton step and per halving of a step (a handful each
#: on the worlds measured, docs/benchmarks.md); each round is one more point at which the server learns the totals
MAX_FIT_ROUNDS = 200
#: the evaluation-request field and the checkpoint key of the fitted shared model (``SharedFitStep.to_json``, JSON)
BEHAVIOUR_MODEL_KEY = "behaviour-model"


class SecureBehaviourError(FcdError, RuntimeError):
    """The shared behaviour model could not be fitted (a site missing from a step, the protocol aborted)."""


def step_from_config(config: dict[str, Any], key: str, n_actions: int) -> "SharedFitStep | None":
    """The step (or fitted model) a request carries under ``key``; ``None`` when it carries none.

    Raises:
        ValueError: the value is not the JSON of a step.
    """
    from fcd_secure.evaluation.propensity import SharedFitStep  # noqa: PLC0415

    raw = config.get(key)
    if raw in (None, ""):
        return None
    doc = json.loads(str(raw))
    if not isinstance(doc, dict) or not set(doc) <= set(SharedFitStep.JSON_KEYS):
        raise ValueError(f"request field {key!r}: expected {{{', '.join(SharedFitStep.JSON_KEYS)}}}")
    return SharedFitStep.from_json(doc, n_actions)


def secure_behaviour_model(
    comm: "Comm", node_ids: list[int], theta: "dict[str, np.ndarray]", cfg: "RunConfig", manifest: "Manifest",
    dims: dict[str, int],
) -> tuple["SharedFitStep", int]:
    """Fit the consortium's shared behaviour model over ``node_ids`` (module docstring); returns the fitted model as
    the sites receive it and the Newton steps taken.

    Raises:
        SecureBehaviourError: secure aggregation is off, or a step did not include every site.
        SharedFitError: more coefficients than a shared fit takes, or no training step at any site.
    """
    from fcd_secure.evaluation.propensity import SharedFitStep, fit_shared  # noqa: PLC0415
    from fcd_secure.federation.learner import shared_behaviour_model  # noqa: PLC0415
    from fcd_secure.federation.secure.secure_evaluation import secure_evaluation_for  # noqa: PLC0415
    from fcd_secure.federation.secure.secure_stats import PURPOSE_KEY  # noqa: PLC0415

    model = shared_behaviour_model(dims)
    secure = secure_evaluation_for(cfg, manifest)
    if secure is None:
        raise SecureBehaviourError(f"evaluation.behaviour_model = {cfg.evaluation.behaviour_model!r} needs secure "
                                   "aggregation "
                                   "(federation.secure_aggregation)")
    rounds = 0

    def ask(step: SharedFitStep) -> dict[str, Any]:
        nonlocal rounds
        rounds += 1
        conf = {PURPOSE_KEY: BEHAVIOUR_PURPOSE, BEHAVIOUR_STEP_KEY: json.dumps(step.to_json())}
        totals, failed, reason = secure.totals(comm, node_ids, theta, conf, round_id=rounds)
        if totals is None or failed:
            raise SecureBehaviourError(
                f"step {rounds} of the shared behaviour model did not include every site "
                f"({reason or 'sites failed: ' + ', '.join(failed)}); the run stops rather than fit it without them")
        return totals

    own = cfg.evaluation.own_intercepts
    steps = fit_shared(model, model.n_features(model.n_actions, model.da, model.dx), ask, own_intercepts=own)
    return SharedFitStep(model.mean, model.scale, model.coef, own, model.l2 if own else 0.0), steps
