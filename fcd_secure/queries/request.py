"""The typed requests of the answers layer: the what-if question, and the evaluation request that carries it.

:class:`WhatIfRequest` is one "what happens under π" question (policies, reference, horizon, level).
:class:`EvaluationRequest` is everything the server asks of a site's evaluation: cheap or full, the synchronised part,
simulated futures, the rows it would like, the question, the round whose Θs the site keeps or restores, the
DR-learner's coefficients and the consortium's standardisation statistics. It travels as the flat fields of Flower's
``ConfigRecord`` (:meth:`EvaluationRequest.to_config`) and is validated on the site (:meth:`EvaluationRequest
.from_config`): a field of the wrong type is refused there, before the site computes anything; fields that belong to
the transport (the secure round's number and purpose) are the transport's and are not read here.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fcd_secure.data.policy import Policy, load_policy_refs
from fcd_secure.errors import FcdError
from fcd_secure.federation.secure.secure_behaviour import BEHAVIOUR_MODEL_KEY
from fcd_secure.federation.secure.secure_stats import STATISTICS_KEY

if TYPE_CHECKING:  # pragma: no cover - the run config pulls in torch; the request models must not
    from fcd_secure.config import RunConfig

__all__ = ["DR_LEARNER_FIELD", "KEEP_FIELD", "MAX_POLICIES", "RESTORE_FIELD", "WHATIF_FIELD", "EvaluationRequest", "EvaluationRequestError", "WhatIfRequest", "evaluated_policy_names",
           "request_from_config"]

#: the request field that carries the what-if question (JSON)
WHATIF_FIELD = "whatif"
#: the request field that carries the DR-learner's coefficients (JSON ``{"beta": [...]}``)
DR_LEARNER_FIELD = "dr-learner"
#: the request fields of a scored round (the site keeps its Θs) and of the selected round (the site restores it)
KEEP_FIELD, RESTORE_FIELD = "keep-round", "restore-round"
#: at most this many policies in one question (the reply's size, and the gate's allow-list, grow with it)
MAX_POLICIES = 32


class EvaluationRequestError(FcdError, ValueError):
    """An evaluation request a site refuses to read (a field of the wrong type or out of range)."""


class WhatIfRequest(BaseModel):
    """One "what happens under π" question.

    Attributes:
        policies: the policies to simulate (declarative; labels resolved on each site); at most
            :data:`MAX_POLICIES`, so that a reply's size stays bounded.
        reference: the name of the policy every other one is contrasted with.
        horizon: steps from t = 0 over which a value is averaged (None: each trajectory's whole length).
        level: nominal coverage of the intervals.
    """

    model_config = ConfigDict(extra="forbid")

    policies: list[Policy] = Field(min_length=1, max_length=MAX_POLICIES)
    reference: str
    horizon: int | None = Field(default=None, ge=1)
    level: float = Field(default=0.9, gt=0.0, lt=1.0)

    @model_validator(mode="after")
    def _names(self) -> "WhatIfRequest":
        names = [p.name for p in self.policies]
        if len(set(names)) != len(names):
            raise ValueError(f"two policies share a name: {names}")
        if self.reference not in names:
            raise ValueError(f"reference {self.reference!r} is not among the policies {names}")
        return self

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.policies]

    @property
    def query_id(self) -> str:
        """A short digest of the question (the same question gives the same id and the same per-entity file)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]

    def to_json(self) -> str:
        """Canonical JSON (what travels in the evaluation request)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "WhatIfRequest":
        """The request from :meth:`to_json`."""
        return cls.model_validate_json(text)


def request_from_config(
    cfg: "RunConfig",
    policies: list[Policy] | None = None,
    reference: str | None = None,
    horizon: int | None = None,
) -> WhatIfRequest:
    """The question a run asks at its end (``[evaluation] policies`` / ``reference`` / ``horizon``), or the one given.

    Raises:
        DataError: a policy file is missing or invalid.
        ValueError: the reference is not among the policies.
    """
    ev = cfg.evaluation
    pols = policies if policies is not None else load_policy_refs(ev.policies)
    ref = reference or ev.reference or pols[0].name
    return WhatIfRequest(policies=pols, reference=ref, horizon=horizon if horizon is not None else ev.horizon,
                         level=ev.level)


class EvaluationRequest(BaseModel):
    """What the server asks of one site's evaluation (module docstring).

    Attributes:
        quick: the cheap evaluation during training (effects and AUC only).
        part: the synchronised part the global parameters are (``theta_c``; ``full`` in the w/o-DSS ablation).
        n_samples: simulated futures per entity (None: the run's setting).
        max_rows: the rows the server would like evaluated (only a request: the site chooses its cohort).
        whatif: the what-if question of a full evaluation (None: the run's ``[evaluation]`` policies).
        keep_round: a scored round: the site keeps this round's Θs and adds its validation sums.
        restore_round: the round whose Θs the site answers with (the selected round).
        dr_learner_beta: the DR-learner's coefficients fitted on the consortium's validation sums.
        statistics: the consortium's standardisation statistics (JSON; secure standardisation).
        behaviour: the consortium's shared behaviour model (JSON of ``evaluation.propensity.SharedFitStep``;
            ``evaluation.behaviour_model = "shared"`` or ``"shared_slopes"``, ``federation.secure.secure_behaviour``).
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    quick: bool = False
    part: str = "theta_c"
    n_samples: int | None = Field(default=None, alias="n-samples", ge=1)
    max_rows: int | None = Field(default=None, alias="max-rows")
    whatif: WhatIfRequest | None = Field(default=None, alias=WHATIF_FIELD)
    keep_round: int | None = Field(default=None, alias=KEEP_FIELD, ge=0)
    restore_round: int | None = Field(default=None, alias=RESTORE_FIELD, ge=0)
    dr_learner_beta: list[float] | None = Field(default=None, alias=DR_LEARNER_FIELD)
    statistics: str | None = Field(default=None, alias=STATISTICS_KEY)
    behaviour: str | None = Field(default=None, alias=BEHAVIOUR_MODEL_KEY)

    @field_validator("max_rows", mode="before")
    @classmethod
    def _all_rows(cls, v: Any) -> Any:
        return None if v in (None, 0, -1) else v

    @field_validator("whatif", mode="before")
    @classmethod
    def _question(cls, v: Any) -> Any:
        return WhatIfRequest.from_json(v) if isinstance(v, str) and v else (v or None)

    @field_validator("dr_learner_beta", mode="before")
    @classmethod
    def _beta(cls, v: Any) -> Any:
        # a malformed β gives no DR-learner answer (never a crash on a server's value): it is dropped here
        if not v:
            return None
        try:
            beta = np.asarray(json.loads(str(v))["beta"] if isinstance(v, str) else v, dtype=np.float64)
        except (ValueError, KeyError, TypeError):
            return None
        return [float(x) for x in beta] if beta.ndim == 1 and np.isfinite(beta).all() else None

    @classmethod
    def for_run(cls, cfg: "RunConfig", *, quick: bool, part: str, **fields: Any) -> "EvaluationRequest":
        """The request a run's server sends: sized by the run's ``[evaluation]`` section (the cheap form during
        training), a full one asking the run's own question unless ``fields`` give another (``whatif=...``)."""
        ev = cfg.evaluation
        if not quick and fields.get("whatif") is None:
            fields["whatif"] = request_from_config(cfg)
        return cls(quick=quick, part=part, n_samples=ev.quick_n_samples if quick else ev.n_samples,
                   max_rows=(ev.quick_max_rows if quick else ev.max_rows) or None, **fields)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "EvaluationRequest":
        """The request as a site reads it from the message's config record.

        Raises:
            EvaluationRequestError: a field of the wrong type or out of range (named).
        """
        try:
            return cls.model_validate(dict(config))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err.get("loc", ())) or "request"
            raise EvaluationRequestError(f"evaluation request field {where!r}: {err.get('msg')}") from None

    def to_config(self) -> dict[str, Any]:
        """The flat fields of the message's config record (``None`` fields are left out)."""
        out: dict[str, Any] = {"quick": self.quick, "part": self.part, "max-rows": self.max_rows or -1}
        if self.n_samples is not None:
            out["n-samples"] = self.n_samples
        if self.whatif is not None:
            out[WHATIF_FIELD] = self.whatif.to_json()
        if self.keep_round is not None:
            out[KEEP_FIELD] = self.keep_round
        if self.restore_round is not None:
            out[RESTORE_FIELD] = self.restore_round
        if self.dr_learner_beta is not None:
            out[DR_LEARNER_FIELD] = json.dumps({"beta": self.dr_learner_beta})
        if self.statistics is not None:
            out[STATISTICS_KEY] = self.statistics
        if self.behaviour is not None:
            out[BEHAVIOUR_MODEL_KEY] = self.behaviour
        return out


def evaluated_policy_names(config: dict[str, Any] | None, cfg: "RunConfig") -> list[str]:
    """The names of the policies an evaluation request's config record asks about (the egress gate reads them before
    the site parses the request): its own question, else the run's ``[evaluation] policies`` (the paper's four when
    those cannot be read here); none for a malformed question (the site refuses it; nothing of it may leave)."""
    from fcd_secure.data.policy import DEFAULT_POLICY_NAMES  # noqa: PLC0415
    from fcd_secure.data.spec import DataError  # noqa: PLC0415

    raw = (config or {}).get(WHATIF_FIELD)
    if raw:
        try:
            return WhatIfRequest.from_json(str(raw)).names
        except ValueError:
            return []
    try:
        return [p.name for p in load_policy_refs(cfg.evaluation.policies)]
    except DataError:
        return list(DEFAULT_POLICY_NAMES)
