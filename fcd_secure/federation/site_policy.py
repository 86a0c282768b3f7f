"""The site's own privacy policy: settings that protect a site come from the site, never from the server.

A site (a hospital) keeps one TOML file on its own disk, ``site_policy.toml``, found through the SuperNode's node
config (``site-policy = "/path"``) or, by default, in the site's state directory (``<state root>/<site id>/``). The
shipped defaults are strict; a missing file means the defaults. Sections:

=====================  ===========================================================================================
``[egress]``           what may leave: DSS only (Θc, paper §III-B) unless ``allow_full_sync`` (the w/o-DSS ablation
                       of Table III, research only)
``[secure]``           ``required``: secure aggregation of everything numeric that leaves (default yes, P20)
``[secagg]``           the secure-aggregation parameters the site pins
                       (:class:`~fcd_secure.aggregation.secagg.SecAggPolicy`: minimum sites, threshold rule, clip,
                       fixed-point scale, deadlines; its defaults)
``[dp]``               ``required`` DP-SGD or not (default: required), the lifetime ε cap, the largest δ (default
                       1e-5), the DP ledger folder, the noise seeding (P21, P39)
``[training]``         ``use_propensities``: whether the site's own logged propensities may weight its local training
                       (``model.ipw``; default yes); they never leave either way
``[evaluation]``       the smallest evaluation cohort (default 50 rows, or the whole test split when smaller, never
                       fewer than 20), how often the same rows may be evaluated (P22), the longest truncated OPE
                       horizon (``ope_horizon_max``, default 2; P39)
``[behaviour]``        ``shared_fit``: whether the site adds its training rows' gradient and Hessian sums to a
                       consortium's shared behaviour model (``evaluation.behaviour_model = "shared"`` or
                       ``"shared_slopes"``, docs/threats.md P67, P68; default no: its own model, which never leaves
                       it)
``[data]``             where the site's data are; when set, a request naming other data is refused
``[split]``            the site's own test / validation fractions (on a 5 % grid): the cut itself is made from the
                       site's split secret (``data.cohorts``); the request's ``data.test_fraction``,
                       ``data.validation_fraction`` and seed never move it (P40)
``[questions]``        the what-if budget: the fewest entities by which any two answered policies' cohorts may
                       differ, and the grid of the site's own quantiles that threshold rules are read on (P41, P42)
``[app]``              the SHA-256 of every Flower app bundle (FAB) the site runs (deployment, P27)
=====================  ===========================================================================================

The run config from the server is a *request*: it may ask for more protection, never less.
:meth:`SitePolicy.admit` returns the effective settings (the stricter of policy and request) and, when the request
asks for less, the refusal (:class:`~fcd_secure.audit.Refusal`, rule ``site_policy``, keyed by the config field):
the site then refuses every message of that run, and the egress gate records each refusal in the site ledger
(``fcd audit verify`` lists them). Simulation uses the same path: ``engines.simulation`` writes one policy file
per simulated site from the run's options (that simulated hospital's own choice).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fcd_secure._io import atomic_write_text, drop_none
from fcd_secure.aggregation.secagg import SecAggPolicy
from fcd_secure.audit import Refusal
from fcd_secure.errors import FcdError, first_invalid

if TYPE_CHECKING:  # pragma: no cover - fcd_secure.config pulls in torch; the site executor reads policies without it
    from fcd_secure.config import RunConfig
    from fcd_secure.data.schema import SiteDataset

POLICY_FILE = "site_policy.toml"
#: node config key naming the site's policy file (deployment)
POLICY_NODE_CONFIG = "site-policy"
#: an evaluation never covers fewer rows than this, whatever a policy says (a smaller test split is not evaluated)
MIN_COHORT_FLOOR = 20
#: the refusal rule of a request weaker than the policy (``fcd_secure.audit.rules.REFUSAL_RULES``)
RULE = "site_policy"


class SitePolicyError(FcdError, ValueError):
    """A site policy file that cannot be used, or is weaker than a required minimum; names the file and field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EgressPolicy(_Section):
    allow_full_sync: bool = Field(
        False, description="let Θs leave too (the w/o-DSS ablation of paper Table III; research only, never with patients)"
    )


class SecurePolicy(_Section):
    required: bool = Field(True, description="everything numeric leaves only inside secure aggregation (P20)")


#: the default δ ceiling of a site: at or below 1/n for every site of up to 100 000 trajectories (a larger site
#: lowers it); δ is the probability that the ε guarantee fails, so it must stay well under one record's share 1/n
DEFAULT_DELTA_MAX = 1e-5
#: the largest δ the default rule (the largest power of ten ≤ 1/(10·n)) can give: the ceiling of a simulated hospital
#: that takes the run's default δ, so that its δ stays the rule's
RULE_DELTA_MAX = 0.1


class DPPolicy(_Section):
    """What the site pins about DP (P21, P39): DP on, the lifetime ε cap (per record, across every run on the site:
    ``privacy.spend``), the δ ceiling, the ledger folder and secret noise. A run may ask for less ε or δ, never more."""

    required: bool = Field(True, description="train only with DP-SGD (the strict default: the server cannot turn it off)")
    epsilon_cap: float = Field(8.0, gt=0, le=100, description="the most ε a run may ask this site to spend (lifetime cap)")
    delta_max: float | None = Field(
        DEFAULT_DELTA_MAX, gt=0, lt=1,
        description="the largest δ a run may ask for; a run that names none gets the default δ (the largest power of "
        "ten ≤ 1/(10·n)) lowered to it (None: no ceiling beyond δ < 1/n)",
    )
    ledger_dir: str | None = Field(
        None, description="the site's persistent DP ledger folder (None: inside its state directory); a request "
        "naming another folder is refused (a fresh folder would be a fresh budget)"
    )
    noise_seed_from_site_secret: bool = Field(
        True, description="the DP noise is seeded from a site secret; a request for run-seeded (reproducible) noise is refused"
    )


#: the default cap on one local round's passes over a site's training rows (P69): Table II's round is one pass;
#: ``federation.min_local_steps`` = 32 on a 190-row site is 11
DEFAULT_MAX_LOCAL_PASSES = 50


class TrainingPolicy(_Section):
    max_local_passes: int = Field(
        DEFAULT_MAX_LOCAL_PASSES, ge=1,
        description="the most passes over the site's training rows one local round may make (the round's "
        "local-epochs, raised by its min-local-steps: federation.learner.round_epochs); a round asking for more is "
        "refused before any training (P69)",
    )
    use_propensities: bool = Field(
        True,
        description="let the site's logged propensities weight its own training (model.ipw 'auto', 'step', "
        "'cumulative'). They never leave the site either way, but the Θc update then depends on them; false: the "
        "site trains on the paper's unweighted objective and refuses a request that requires the weights",
    )


class EvaluationPolicy(_Section):
    min_cohort: int = Field(
        50, ge=MIN_COHORT_FLOOR,
        description=f"fewest rows one evaluation covers (the whole test split when smaller; never fewer than {MIN_COHORT_FLOOR})",
    )
    max_repeats: int = Field(100, ge=1, description="how often the same rows may be evaluated (over the site's lifetime)")
    ope_horizon_max: int = Field(
        2, ge=1,
        description="the longest truncated OPE horizon a run may ask for (evaluation.ope_horizon: the '<est>_h<H>' sums "
        "weight each trajectory's first H steps by its propensities; a longer H carries more of each trajectory)",
    )


class BehaviourPolicy(_Section):
    shared_fit: bool = Field(
        False,
        description="take part in a consortium's shared behaviour model (evaluation.behaviour_model = 'shared' "
        "or 'shared_slopes'): "
        "the sums of the site's training steps (count, features' sums and squares, the multinomial logistic "
        "regression's loss, gradient and Hessian at each Newton step) leave inside secure aggregation, which the "
        "site's own model never sends; false: a run asking for it is refused at hello",
    )


class DataPolicy(_Section):
    """Where the site's data are. Every field left ``None`` is taken from the request (simulated splits)."""

    dataset: str | None = None
    preset: str | None = None
    spec: str | None = None
    table: str | None = None
    data_dir: str | None = None
    n_sites: int | None = Field(None, ge=1)
    alpha: float | None = Field(None, gt=0)


def _on_grid(v: float) -> float:
    from fcd_secure.data.cohorts import FRACTION_GRID  # noqa: PLC0415

    steps = v / FRACTION_GRID
    if abs(steps - round(steps)) > 1e-9:
        raise ValueError(f"{v} is not a multiple of {FRACTION_GRID} (the split grid: two fractions closer than that "
                         "would differ by a few patients)")
    return round(round(steps) * FRACTION_GRID, 10)


class SplitPolicy(_Section):
    """The site's own cut of its entities (``data.cohorts``): made once from the site's split secret at these
    fractions; a request cannot move it."""

    test_fraction: float = Field(0.2, ge=0.05, le=0.95, description="share of the site's rows in its test set")
    validation_fraction: float = Field(
        0.2, ge=0.0, le=0.95, description="share of the remaining rows held out as validation rows (never trained on)"
    )

    @field_validator("test_fraction", "validation_fraction")
    @classmethod
    def _grid(cls, v: float) -> float:
        return _on_grid(v)


#: a what-if question's cohorts never differ by fewer entities than this, whatever a policy says
MIN_QUESTION_DIFFERENCE = 20


class QuestionPolicy(_Section):
    """The differencing budget of what-if questions (``queries.budget``, docs/threats.md P41/P42)."""

    min_difference: int = Field(
        MIN_QUESTION_DIFFERENCE, ge=MIN_QUESTION_DIFFERENCE,
        description="two policies answered on this site (in one question, or one now and one before) must act "
        "differently on at least this many of its entities, or not at all",
    )
    threshold_grid: int = Field(
        10, ge=2, le=20,
        description="threshold rules on a continuous context column are read on this many quantile steps of the "
        "site's own training rows (10: deciles); a threshold beyond the site's data never fires",
    )


class AppPolicy(_Section):
    fab_sha256: tuple[str, ...] = Field(
        (), description="SHA-256 (hex) of every Flower app bundle this site runs; empty: no deployed app runs"
    )
    coordinator_key: str | None = Field(
        None, description="the consortium coordinator's Ed25519 public key (hex): a deployed run must carry its "
        "signature over the app, the consortium, a fresh session id and the run config (docs/threats.md P34); "
        "unset: no deployed run starts",
    )
    consortium_id: str | None = Field(None, description="the consortium a signed run must be for")

    @field_validator("coordinator_key")
    @classmethod
    def _key_hex(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = str(v).lower()
        if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
            raise ValueError(f"{v!r} is not an Ed25519 public key in hex (64 hex digits)")
        return v

    @field_validator("fab_sha256")
    @classmethod
    def _hex(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for h in v:
            h = str(h).lower()
            if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
                raise ValueError(f"{h!r} is not a SHA-256 hex digest")
            out.append(h)
        return tuple(out)


class SitePolicy(_Section):
    """A site's own privacy policy (module docstring). The defaults are the strict shipped policy."""

    version: int = Field(1, ge=1, le=1)
    egress: EgressPolicy = Field(default_factory=EgressPolicy)
    secure: SecurePolicy = Field(default_factory=SecurePolicy)
    secagg: SecAggPolicy = Field(default_factory=SecAggPolicy)
    dp: DPPolicy = Field(default_factory=DPPolicy)
    training: TrainingPolicy = Field(default_factory=TrainingPolicy)
    evaluation: EvaluationPolicy = Field(default_factory=EvaluationPolicy)
    behaviour: BehaviourPolicy = Field(default_factory=BehaviourPolicy)
    data: DataPolicy = Field(default_factory=DataPolicy)
    split: SplitPolicy = Field(default_factory=SplitPolicy)
    questions: QuestionPolicy = Field(default_factory=QuestionPolicy)
    app: AppPolicy = Field(default_factory=AppPolicy)

    # -- files ----------------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> "SitePolicy":
        """Read a policy file.

        Raises:
            SitePolicyError: unreadable, not TOML, or an invalid field (the message names the file and the field).
        """
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text())
        except OSError as exc:
            raise SitePolicyError(f"{path}: cannot read the site policy ({exc.strerror})") from None
        except tomllib.TOMLDecodeError as exc:
            raise SitePolicyError(f"{path}: the site policy is not valid TOML ({exc})") from None
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            loc, msg = first_invalid(exc, "(top level)", model=cls)
            raise SitePolicyError(f"{path}: field {loc}: {msg}") from None

    def to_toml(self) -> str:
        return tomli_w.dumps(drop_none(self.model_dump(mode="json")))

    def write(self, path: str | Path) -> Path:
        """Write the policy (0600: it is the site's configuration, not the server's)."""
        return atomic_write_text(path, self.to_toml(), mode=0o600)

    # -- the policy of a simulated hospital ---------------------------------------------------------------------
    @classmethod
    def for_run(cls, cfg: RunConfig, *, fab_sha256: tuple[str, ...] = ()) -> "SitePolicy":
        """The policy a simulated hospital chooses for ``cfg``: exactly what the run's options ask for (so the run
        is admitted), with the shipped evaluation, question and secure-aggregation defaults; its split fractions are
        the run's on the 5 % grid."""
        from fcd_secure.data.cohorts import grid_fraction  # noqa: PLC0415

        fed, dp, d = cfg.federation, cfg.dp, cfg.data
        return cls(
            egress=EgressPolicy(allow_full_sync=fed.sync == "full"),
            secure=SecurePolicy(required=fed.secure_aggregation),
            secagg=cfg.secagg,
            dp=DPPolicy(
                required=dp.enabled, epsilon_cap=dp.epsilon,
                delta_max=dp.delta if dp.delta is not None else RULE_DELTA_MAX, ledger_dir=dp.ledger_dir,
                noise_seed_from_site_secret=dp.noise_seed == "site_secret",
            ),
            data=DataPolicy(
                dataset=d.dataset, preset=d.preset, spec=d.spec, table=d.table, data_dir=d.data_dir,
                n_sites=d.n_sites, alpha=d.alpha,
            ),
            evaluation=EvaluationPolicy(ope_horizon_max=cfg.evaluation.ope_horizon or 1),
            behaviour=BehaviourPolicy(shared_fit=cfg.evaluation.shares_behaviour_model),
            split=SplitPolicy(test_fraction=grid_fraction(d.test_fraction),
                              validation_fraction=grid_fraction(d.validation_fraction, lo=0.0)),
            app=AppPolicy(fab_sha256=fab_sha256),
        )

    # -- the request ------------------------------------------------------------------------------------------
    def admit(self, request: RunConfig) -> tuple[RunConfig, Refusal | None]:
        """The effective settings for ``request`` and, if it asks for less protection than this policy, the refusal.

        The effective config is always within the policy (the stricter of the two): Θs stays unless the site opts
        in, propensity weights are requested only of a site that allows them (the site applies its choice to its
        training data: :meth:`training_data`), secure aggregation is on when the site requires it, DP is on when
        required with ε and δ no larger than the caps, the DP ledger is the site's, the data are the site's, and the
        secure-aggregation parameters are the site's pinned ones.

        Returns:
            ``(effective, refusal)``; ``refusal`` (rule ``site_policy``, key = the first weaker config field) is
            ``None`` when the request may run.
        """
        fed, dp, data = request.federation, request.dp, request.data
        weaker: list[str] = []
        if fed.sync == "full" and not self.egress.allow_full_sync:
            weaker.append("federation.sync")
        if self.secure.required and not fed.secure_aggregation:
            weaker.append("federation.secure_aggregation")
        if fed.local_epochs > self.training.max_local_passes:  # P69; min_local_steps' passes: at each round
            weaker.append("federation.local_epochs")
        if request.secagg.min_sites < self.secagg.min_sites:
            weaker.append("secagg.min_sites")
        if any(
            request.secagg.min_threshold(n) < self.secagg.min_threshold(n)
            for n in range(self.secagg.min_sites, self.secagg.max_sites + 1)
        ):
            weaker.append("secagg.threshold_rule")
        if self.dp.required and not dp.enabled:
            weaker.append("dp.enabled")
        if dp.enabled and dp.epsilon > self.dp.epsilon_cap:
            weaker.append("dp.epsilon")
        # a request without δ gets the site's ceiling (below); one above it is refused before any work
        if (dp.enabled or self.dp.required) and self.dp.delta_max is not None and dp.delta is not None \
                and dp.delta > self.dp.delta_max:
            weaker.append("dp.delta")
        ope_h = request.evaluation.ope_horizon
        if ope_h is not None and ope_h > self.evaluation.ope_horizon_max:
            weaker.append("evaluation.ope_horizon")
        if request.evaluation.shares_behaviour_model and not self.behaviour.shared_fit:
            weaker.append("evaluation.behaviour_model")
        if dp.ledger_dir is not None and dp.ledger_dir != self.dp.ledger_dir:
            weaker.append("dp.ledger_dir")
        if dp.enabled and self.dp.noise_seed_from_site_secret and dp.noise_seed != "site_secret":
            weaker.append("dp.noise_seed")
        # 'auto' weights only where a site's training data carries propensities: a site that withholds them is
        # within the request; 'step' / 'cumulative' require them
        if not self.training.use_propensities and request.model.ipw in ("step", "cumulative"):
            weaker.append("model.ipw")
        pinned = self.data.model_dump()
        for name, value in pinned.items():
            if value is not None and getattr(data, name) != value:
                weaker.append(f"data.{name}")

        eff_dp = dp.model_copy(
            update={
                "enabled": dp.enabled or self.dp.required,
                "epsilon": min(dp.epsilon, self.dp.epsilon_cap),
                "delta": None if dp.delta is None else _smaller(dp.delta, self.dp.delta_max),
                "delta_max": self.dp.delta_max,  # the site's ceiling, whatever the request says (privacy.config)
                "ledger_dir": self.dp.ledger_dir,
                "noise_seed": "site_secret" if self.dp.noise_seed_from_site_secret else dp.noise_seed,
            }
        )
        eff_fed = fed.model_copy(
            update={
                "sync": fed.sync if self.egress.allow_full_sync else "dss",
                "secure_aggregation": fed.secure_aggregation or self.secure.required,
            }
        )
        # the split fractions are the site's, whatever the request says: not a refusal (a different fraction asks
        # for no less protection), but never the request's value (P40)
        eff_data = data.model_copy(update={**{k: v for k, v in pinned.items() if v is not None},
                                           "test_fraction": self.split.test_fraction,
                                           "validation_fraction": self.split.validation_fraction})
        eff_eval = request.evaluation.model_copy(
            update={"ope_horizon": None if ope_h is None else min(ope_h, self.evaluation.ope_horizon_max)}
        )
        effective = request.model_copy(
            update={"federation": eff_fed, "dp": eff_dp, "data": eff_data, "secagg": self.secagg,
                    "evaluation": eff_eval}
        )
        refusal = Refusal(RULE, "config", weaker[0]) if weaker else None
        return effective, refusal

    def check_local_passes(self, passes: int, local_epochs: int) -> None:
        """Refuse a training round that would make more than ``[training] max_local_passes`` passes over the site's
        rows (P69: the server sets a round's ``local-epochs`` and ``min-local-steps`` in its message, so without a
        cap it decides how much of the site's compute, and under DP how many noisy steps, one round takes).

        Raises:
            Refusal: rule ``site_policy``, key the round setting that asked for the passes.
        """
        if passes > self.training.max_local_passes:
            key = "federation.local_epochs" if local_epochs > self.training.max_local_passes \
                else "federation.min_local_steps"
            raise Refusal(RULE, "config", key)

    def training_data(self, ds: "SiteDataset") -> "SiteDataset":
        """The site's training data as its policy lets training read them: without the logged propensities when
        ``[training] use_propensities`` is false (``model.ipw = 'auto'`` then trains unweighted; the site's own
        doubly robust evaluation still reads them)."""
        return ds if self.training.use_propensities else ds.without_propensities()

    # -- a consortium's minimum --------------------------------------------------------------------------------
    def check_meets(self, minimum: "SitePolicy", where: str) -> None:
        """Refuse a policy weaker than ``minimum`` (e.g. the consortium's), naming ``where`` and the field.

        Raises:
            SitePolicyError: the first field in which this policy is weaker.
        """
        checks: list[tuple[str, bool]] = [
            ("egress.allow_full_sync", self.egress.allow_full_sync and not minimum.egress.allow_full_sync),
            ("secure.required", minimum.secure.required and not self.secure.required),
            ("secagg.min_sites", self.secagg.min_sites < minimum.secagg.min_sites),
            ("secagg.threshold_rule", any(
                self.secagg.min_threshold(n) < minimum.secagg.min_threshold(n)
                for n in range(minimum.secagg.min_sites, minimum.secagg.max_sites + 1)
            )),
            ("dp.required", minimum.dp.required and not self.dp.required),
            ("training.max_local_passes", self.training.max_local_passes > minimum.training.max_local_passes),
            ("dp.epsilon_cap", minimum.dp.required and self.dp.epsilon_cap > minimum.dp.epsilon_cap),
            ("dp.delta_max", minimum.dp.delta_max is not None and (
                self.dp.delta_max is None or self.dp.delta_max > minimum.dp.delta_max)),
            ("dp.noise_seed_from_site_secret", minimum.dp.noise_seed_from_site_secret and not self.dp.noise_seed_from_site_secret),
            ("training.use_propensities", self.training.use_propensities and not minimum.training.use_propensities),
            ("behaviour.shared_fit", self.behaviour.shared_fit and not minimum.behaviour.shared_fit),
            ("evaluation.min_cohort", self.evaluation.min_cohort < minimum.evaluation.min_cohort),
            ("evaluation.max_repeats", self.evaluation.max_repeats > minimum.evaluation.max_repeats),
            ("evaluation.ope_horizon_max", self.evaluation.ope_horizon_max > minimum.evaluation.ope_horizon_max),
            ("questions.min_difference", self.questions.min_difference < minimum.questions.min_difference),
            ("questions.threshold_grid", self.questions.threshold_grid > minimum.questions.threshold_grid),
        ]
        for name, weaker in checks:
            if weaker:
                raise SitePolicyError(
                    f"{where}: field {name}: {_show(self, name)!r} is weaker than the consortium minimum "
                    f"{_show(minimum, name)!r}"
                )


def _show(policy: SitePolicy, dotted: str) -> Any:
    obj: Any = policy
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _smaller(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def policy_path(node_config: dict, state_root: str | Path | None, site_id: str) -> Path | None:
    """Where a site's policy file is: ``node_config["site-policy"]``, else ``<state_root>/<site_id>/site_policy.toml``.

    Returns ``None`` when neither names a file (the site then enforces the shipped defaults).
    """
    configured = node_config.get(POLICY_NODE_CONFIG)
    if configured:
        return Path(str(configured))
    if state_root:
        return Path(state_root) / site_id / POLICY_FILE
    return None


def load_site_policy(node_config: dict, state_root: str | Path | None, site_id: str) -> SitePolicy:
    """The policy a site enforces: its file if there is one, else the strict defaults.

    A file named in the node config must exist (a typo must not fall back to defaults silently).

    Raises:
        SitePolicyError: the configured file is missing, or a file does not parse.
    """
    path = policy_path(node_config, state_root, site_id)
    if path is None:
        return SitePolicy()
    if not path.exists():
        if node_config.get(POLICY_NODE_CONFIG):
            raise SitePolicyError(f"{path}: the site policy named by node config {POLICY_NODE_CONFIG!r} does not exist")
        return SitePolicy()
    return SitePolicy.load(path)
