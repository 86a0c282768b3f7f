"""The one place where the federation layer calls the model, data and evaluation layers.

Everything the ServerApp / ClientApp / ablations need from below goes through these functions, so the contracts
between layers (docs/architecture.md) are visible in one file:

* data: ``load_site_data`` (``fcd_secure.data.registry.load_federated`` / ``load_spec_federated``), cached per
  process because a site answers many messages and the split is a pure function of the config, the table's files
  (their identity is in the key, :func:`data_key`) and the site's split secret (``data.cohorts``: derived from the
  seed for a simulated site, the site's own for a deployed one); each site's validation cut too (:func:`_site_split`);
* model: ``build_model`` (the run's :class:`~fcd_secure.model.simulator.Simulator`, ``model.simulator``, whose own
  ``manifest()``, ``get_params`` / ``set_params`` (manifest names; parts are ``fcd_secure.manifest.THETA_C`` /
  ``THETA_S`` / ``FULL``) and ``optimizer`` the callers use directly), ``round_epochs`` (a local round's passes),
  ``train_local``, ``train_local_dp``;
* evaluation: ``effects`` / ``policy_values`` / ``factual`` helpers used by ``queries.evaluation``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fcd_secure._io import Kept, arrays_sha256, file_identity
from fcd_secure.config import RunConfig
from fcd_secure.data.schema import SiteDataset

if TYPE_CHECKING:
    from fcd_secure.model.simulator import Simulator


@dataclass(frozen=True)
class SiteData:
    """One site's view of the federated data set: its own splits plus the shared (non-private) description.

    ``train`` is what the site trains on; ``validation`` (``data.validation_fraction`` of the training split, whole
    entities, never trained on; ``None`` at 0) is what the truth-free model selection scores every evaluated round
    on (``queries.selection``); ``test`` is what answers are computed on. ``propensities`` says where the
    propensities of the validation and test rows come from (:func:`with_propensities`): ``logged`` (the table's own
    column), ``estimated`` (the site's model of its logging policy) or ``none``, with ``propensity_note`` saying why
    a model could not be fitted.
    """

    train: SiteDataset
    test: SiteDataset
    site_index: int
    n_sites: int
    anchors: tuple[int, int]
    oracle: Any | None
    description: dict
    validation: SiteDataset | None = None
    propensities: str = "logged"
    propensity_note: str | None = None
    #: why a site has no propensities, a key of :data:`BEHAVIOUR_CODES` set where that is decided
    none_reason: str = "none-unlogged"

    @property
    def behaviour(self) -> str:
        """The site's propensity status as it tells the server at hello (:data:`BEHAVIOUR_CODES`: a closed
        vocabulary, so that nothing but the status leaves the site): ``propensities`` where the site has them, else
        why not, as :func:`with_propensities` decided it (``none_reason``)."""
        return self.propensities if self.propensities != "none" else self.none_reason


#: the most actions a site's model of its logging policy is fitted for: beyond, a multinomial over a site's rows is
#: neither affordable (Statics2011's ~1,200 items: L-BFGS over ~10⁵ coefficients per site) nor estimable
MAX_BEHAVIOUR_ACTIONS = 64


#: what a site's hello says of its propensities (``SiteData.behaviour``), and what the answer then says
BEHAVIOUR_CODES = {
    "logged": "logged in its table",
    "estimated": "estimated by its own model of its logging policy",
    "none-actions": f"none: more than {MAX_BEHAVIOUR_ACTIONS} actions, too many for its behaviour model",
    "none-one-action": "none: its training rows log one action only, no behaviour model can be fitted",
    "none-unlogged": "none: its table logs none and evaluation.propensities = 'logged' forbids estimating them",
}


def with_propensities(site: SiteData, mode: str, behaviour: Any | None = None, *, shared: bool = False,
                      own_intercepts: bool = False) -> SiteData:
    """The site's data with the propensities its answers use (``evaluation.propensities``).

    ``behaviour``: the consortium's shared model of the logging policy (a fitted ``RecordPropensity`` of
    ``evaluation.propensity.fit_shared``), used where the site's own model would be, by the same code; ``None``: the
    site fits its own, unless ``shared`` (``config.EvaluationSection.shares_behaviour_model``) says the run uses the
    consortium's, not known yet (hello, the fit's own rounds, training): the validation and test rows then carry no
    estimate, and an evaluation is refused without the model (``apps.site.SiteRuntime.evaluate``).
    ``own_intercepts`` (``evaluation.behaviour_model = "shared_slopes"``): ``behaviour`` holds the consortium's slopes
    only, and the site completes its copy with its own intercepts fitted on its training rows
    (``evaluation.propensity.with_own_intercepts``); they stay here with the copy.

    ``auto``: the logged column where the table has one, else the site's own model of its logging policy
    (``evaluation.propensity.RecordPropensity``) fitted on its training rows and applied to its validation and test
    rows (never to the rows it was fitted on), floored at ``PROPENSITY_FLOOR`` (the overlap check counts the steps
    below it); ``estimated``: the model even where the table logs them (to compare); ``logged``: never a model.
    A model that cannot be fitted (one action only, no valid step) leaves the site without propensities, and
    ``propensity_note`` says why. Nothing here leaves the site.
    """
    from dataclasses import replace  # noqa: PLC0415

    has = site.test.P is not None
    if mode == "logged" or (mode == "auto" and has):
        return replace(site, propensities="logged" if has else "none")
    from fcd_secure.evaluation.propensity import PROPENSITY_FLOOR  # noqa: PLC0415

    train = site.train
    acts = np.unique(train.T[train.M > 0])
    if train.n_actions > MAX_BEHAVIOUR_ACTIONS:
        return replace(site, test=site.test.without_propensities(),
                       validation=None if site.validation is None else site.validation.without_propensities(),
                       propensities="none", none_reason="none-actions",
                       propensity_note=f"{train.n_actions} actions: a model of how they were "
                       f"chosen is fitted for at most {MAX_BEHAVIOUR_ACTIONS}")
    if acts.size < 2:
        return replace(site, test=site.test.without_propensities(),
                       validation=None if site.validation is None else site.validation.without_propensities(),
                       propensities="none", none_reason="none-one-action",
                       propensity_note=f"its training rows log {acts.size} action(s): no "
                       "model of how actions were chosen can be fitted")
    if behaviour is None and shared:
        return replace(site, test=site.test.without_propensities(),
                       validation=None if site.validation is None else site.validation.without_propensities(),
                       propensities="estimated",
                       propensity_note="the consortium's shared behaviour model is not fitted yet")
    if behaviour is None:
        model = _behaviour_model(train)
    elif own_intercepts:
        from fcd_secure.evaluation.propensity import with_own_intercepts  # noqa: PLC0415

        model = with_own_intercepts(behaviour, *behaviour.training_design(train))
    else:
        model = behaviour

    def estimate(ds: SiteDataset | None) -> SiteDataset | None:
        if ds is None:
            return None
        raw, valid = model.logged_probs(ds), ds.M > 0
        # per row, so that they follow a cohort's rows (SiteDataset.subset): the overlap check and the reliability sums
        below = ((raw < PROPENSITY_FLOOR) & valid).sum(axis=1)
        p = np.where(valid, np.maximum(raw, PROPENSITY_FLOOR), 1.0)
        return replace(ds, P=p, meta={**ds.meta, "propensity_below_floor": below,
                                      "propensity_calibration": model.calibration(ds)})

    return replace(site, test=estimate(site.test), validation=estimate(site.validation), propensities="estimated")


#: the sites' fitted behaviour models by the digest of their training rows (:func:`_behaviour_model`)
_BEHAVIOUR_FITS: Kept[str, Any] = Kept(32)


def _behaviour_model(train: SiteDataset):
    """The site's ``RecordPropensity`` fitted on ``train``, fitted once per content of its training rows: a site
    reloads its data on every request that brings the consortium's statistics (``apps.site.SiteRuntime``), and the
    fit is deterministic (a convex problem started at zero), so the same rows give the same model; refitting it on
    every message cost minutes per round with 50 actions."""
    from fcd_secure.evaluation.propensity import RecordPropensity  # noqa: PLC0415

    key = arrays_sha256(repr((train.n_actions, train.da)), (train.T, train.Y, train.M, train.X, train.A))
    return _BEHAVIOUR_FITS.get(key, lambda: RecordPropensity(train.n_actions, train.da,
                                                            train.X.reshape(train.n, -1).shape[1]).fit(train))


def behaviour_fit_sums(site: SiteData, step) -> dict[str, object]:
    """The site's sums for one step of the consortium's shared behaviour model (``evaluation.propensity
    .shared_fit_sums``, a ``SharedFitStep``) over its training rows as loaded (never z-scored with the consortium's
    statistics: the fit z-scores its features with their pooled moments, and the sites apply it to the rows as
    loaded, :func:`load_site_data`).

    Raises:
        SharedFitError: more coefficients than a shared fit takes.
        ValueError: the training rows hold no valid step.
    """
    from fcd_secure.evaluation.propensity import shared_fit_sums  # noqa: PLC0415

    train = site.train
    F, a = shared_behaviour_model(dims_of(train, site.n_sites)).training_design(train)
    return shared_fit_sums(F, a, train.n_actions, step)


def shared_behaviour_model(dims: dict[str, int], step=None):
    """The consortium's shared behaviour model of sites of ``dims`` (:func:`dims_of`): unfitted, or fitted with the
    pooled z-scoring and coefficients of ``step`` (a ``SharedFitStep``, as the server sends it).

    Raises:
        SharedFitError: more coefficients than a shared fit takes, or ``step`` does not fit these dims.
    """
    from fcd_secure.evaluation.propensity import RecordPropensity, check_shared_size  # noqa: PLC0415

    K, da, dx = int(dims["n_actions"]), int(dims["da"]), int(dims["dx"])
    check_shared_size(K, da, dx)
    return RecordPropensity(K, da, dx) if step is None else RecordPropensity.from_shared(K, da, dx, step)


def split_validation(train: SiteDataset, fraction: float, secret: bytes) -> tuple[SiteDataset, SiteDataset | None]:
    """``(train, validation)``: the site's next entities in its fixed key order after the test set
    (:func:`fcd_secure.data.cohorts.split_rows` under the site's split secret), about ``fraction`` of the training
    split's rows (on the 5 % grid), held out; ``(train, None)`` at 0 or when the split is too small to spare a row.
    No seed or server value moves it (docs/threats.md P40)."""
    from fcd_secure.data.cohorts import row_ids, split_rows  # noqa: PLC0415

    if fraction <= 0 or train.n < 4:
        return train, None
    fit, val = split_rows(row_ids(train), fraction, secret)
    return train.subset(fit, name=train.name), train.subset(val, name=f"{train.name}/validation")


def simulated_secret(cfg: RunConfig, site_index: int) -> bytes:
    """A simulated site's split secret: derived from the dataset's seed and the site's index (``data.cohorts``)."""
    from fcd_secure.data.cohorts import seeded_secret  # noqa: PLC0415
    # with the site's data code, not with this module: ``data.partition`` imports pandas, which the ServerApp (it
    # imports this module for ``build_model``) would otherwise pay at its start (``apps.server_app.later_imports``)
    from fcd_secure.data.partition import site_split_seed  # noqa: PLC0415

    return seeded_secret(site_split_seed(cfg.seed, site_index))


@functools.lru_cache(maxsize=4)
def _load_federated_cached(key: str, cfg_json: str):
    cfg = RunConfig.from_json(cfg_json)
    d = cfg.data
    from fcd_secure.data import registry  # noqa: PLC0415

    if d.dataset == "spec":
        return registry.load_spec_federated(
            d.spec, d.table, n_sites=d.n_sites, alpha=d.alpha, seed=cfg.seed, test_fraction=d.test_fraction,
            standardize=d.standardize == "pooled",
        )
    return registry.load_federated(
        d.dataset,
        n_sites=d.n_sites,
        alpha=d.alpha,
        seed=cfg.seed,
        preset=d.preset,
        data_dir=d.data_dir,  # None: the data layer's default (``$FCD_DATA_DIR``, then ../shared/data)
        test_fraction=d.test_fraction,
        standardize=d.standardize == "pooled",
        world=d.world_options(),
    )


def data_key(cfg: RunConfig) -> str:
    """What a run's loaded data is a function of: its data settings and seed and, for a table read with a spec,
    the spec's and the table's file identities (:func:`source_files`), so that a process-wide cache reads a changed
    file again instead of serving the rows it read before."""
    d = cfg.data
    files = source_files(d.spec, d.table) if d.dataset == "spec" else ()
    return repr((d.dataset, d.preset, d.n_sites, d.alpha, d.test_fraction, d.data_dir, d.spec, d.table, d.standardize,
                 sorted(d.world_options().items()), cfg.seed, files))


def source_files(*paths) -> tuple:
    """``fcd_secure._io.file_identity`` of each of ``paths`` (None for a path that is not a readable file: the
    loader then raises its own error naming it)."""
    out = []
    for path in paths:
        try:
            out.append(None if path is None else file_identity(path))
        except OSError:
            out.append(None)
    return tuple(out)


#: each site's (train, validation) cut by (its loaded data's key, site, validation fraction, split secret)
#: (:func:`_site_split`)
_SPLITS: Kept[tuple, tuple[SiteDataset, SiteDataset | None]] = Kept(64)


def _site_split(key: tuple, train: SiteDataset, fraction: float, secret: bytes) -> tuple[SiteDataset, SiteDataset | None]:
    """:func:`split_validation` of ``train``, once per process for each ``key`` (which names the loaded data ``train``
    comes from and the site: every input of the cut is in the key). A site answers every message from its data
    (``apps.site.SiteRuntime.data``): the cut is the same each time, so it is made once."""
    return _SPLITS.get((key, float(fraction), bytes(secret)), lambda: split_validation(train, fraction, secret))


def load_federated(cfg: RunConfig):
    """The whole ``FederatedData`` of a run (simulation and ablations; a deployed site only keeps its own part)."""
    return _load_federated_cached(data_key(cfg), _data_json(cfg))


def _data_json(cfg: RunConfig) -> str:
    only_data = cfg.model_copy(update={"federation": cfg.federation.model_copy(), "out": None, "state_dir": None})
    return only_data.to_json()


def consortium_anchors(statistics: dict[str, list[float]] | None, own: tuple[int, int] | list[int]) -> tuple[int, int]:
    """The anchor actions a site binds the paper's policies to: the consortium's, from the secure round 0
    (``data.moments``), when it sent them; else those of the data the site loaded (pooled in a simulation)."""
    if statistics is not None and "anchors" in statistics:
        a_off, a_on = statistics["anchors"]
        return int(a_off), int(a_on)
    return int(own[0]), int(own[1])


def load_site_data(cfg: RunConfig, site_index: int, statistics: dict[str, list[float]] | None = None,
                   behaviour: Any | None = None) -> SiteData:
    """One site's data. With ``data.standardize = "secure"`` the sites are unscaled until the consortium's
    statistics (``statistics``: from the secure round 0, ``federation.secure.secure_stats``) are applied here;
    ``behaviour``: the consortium's shared behaviour model (:func:`with_propensities`), applied to the rows as loaded,
    as it was fitted on them (:func:`behaviour_fit_sums`)."""
    key = data_key(cfg)
    fd = _load_federated_cached(key, _data_json(cfg))
    n_sites = len(fd.train)
    if not 0 <= site_index < n_sites:
        raise ValueError(f"site index {site_index} is outside the {n_sites} sites of {cfg.data.dataset!r}")
    train, test = fd.train[site_index], fd.test[site_index]
    train, validation = _site_split(("federated", key, int(site_index)), train, cfg.data.validation_fraction,
                                    simulated_secret(cfg, site_index))
    return _scaled(with_propensities(SiteData(
        train=train,
        test=test,
        site_index=site_index,
        n_sites=n_sites,
        anchors=consortium_anchors(statistics, fd.anchors),
        oracle=fd.oracle,
        description=dict(fd.description or {}),
        validation=validation,
    ), cfg.evaluation.propensities, behaviour, shared=cfg.evaluation.shares_behaviour_model,
        own_intercepts=cfg.evaluation.own_intercepts), statistics)


def _scaled(site: SiteData, statistics: dict[str, list[float]] | None) -> SiteData:
    """``site`` z-scored with the consortium's ``statistics`` (secure round 0; ``None``: as loaded), its propensities
    kept. The propensities are estimated before (:func:`with_propensities` on the rows as loaded): the behaviour model
    z-scores its own features, so the same rows give the same model with or without the statistics, and a site that
    loads its rows unscaled at hello and scaled on every later request fits it once per run
    (:func:`_behaviour_model`'s cache is keyed by the rows)."""
    if statistics is None:
        return site
    from dataclasses import replace  # noqa: PLC0415

    from fcd_secure.data.moments import standardizer_for  # noqa: PLC0415

    std = standardizer_for(site.train, statistics)
    # copies: the process-wide cache stays unscaled
    return replace(site, train=std.apply(site.train), test=std.apply(site.test),
                   validation=None if site.validation is None else std.apply(site.validation))


@functools.lru_cache(maxsize=2)
def _own_table_cached(spec: str, table: str, secret: bytes, test_fraction: float, files: tuple):
    """The site's own table cut by its secret; ``files``: the spec's and the table's identities
    (:func:`source_files`), in the key only, so that a table the site rewrites is read again."""
    from fcd_secure.data import registry  # noqa: PLC0415

    # seed 0: with one site nothing is drawn; the cut is the site's secret's (data.cohorts), never the run's seed
    fd = registry.load_spec_federated(spec, table, n_sites=1, seed=0, test_fraction=test_fraction, standardize=False,
                                      secrets=[secret])
    if len(fd.train) != 1:
        raise ValueError(f"{table}: the table names {len(fd.train)} sites; a site's own table holds its own rows only")
    return fd


def load_own_site_data(
    cfg: RunConfig, spec: str, table: str, site_index: int, statistics: dict[str, list[float]] | None = None,
    behaviour: Any | None = None, *, secret: bytes,
) -> SiteData:
    """A deployed site's data: its own table read with the spec (unscaled until ``statistics`` of the secure round 0
    are given), cut into test / validation / train by the site's own split secret (``data.cohorts``) at the fractions
    of ``cfg.data`` (the site's policy's: ``SitePolicy.admit`` put them there; the run's seed plays no part); the
    site's index and the number of sites are the consortium's."""
    key = (str(spec), str(table), bytes(secret), cfg.data.test_fraction, source_files(spec, table))
    fd = _own_table_cached(*key)
    train, test = fd.train[0], fd.test[0]
    train, validation = _site_split(("own",) + key, train, cfg.data.validation_fraction, secret)
    return _scaled(with_propensities(SiteData(train=train, test=test, site_index=int(site_index),
                                              n_sites=cfg.data.n_sites,
                                              anchors=consortium_anchors(statistics, fd.anchors), oracle=None,
                                              description=dict(fd.description or {}), validation=validation),
                                     cfg.evaluation.propensities, behaviour,
                                     shared=cfg.evaluation.shares_behaviour_model,
                                     own_intercepts=cfg.evaluation.own_intercepts), statistics)


# -- model ---------------------------------------------------------------------------------------------------


def model_config(cfg: RunConfig):
    """The ModelConfig of a run; its init seed is the run seed so that every site builds the same initial Θc."""
    return cfg.model.model_copy(update={"seed": cfg.seed})


def build_model(cfg: RunConfig, dims: dict[str, int]) -> Simulator:
    """The run's simulator (``model.simulator``, a key of ``fcd_secure.model.baselines.SIMULATORS``), initialised
    from the run seed. Every function below takes it; a simulator without a Θs part is synchronised whole.

    Raises:
        ValueError: an unknown ``model.simulator``.
    """
    from fcd_secure.model.baselines import get_simulator  # noqa: PLC0415

    sim = get_simulator(cfg.model.simulator)
    return sim.from_dims(model_config(cfg), dims["dx"], dims["da"], dims["n_actions"], dims["n_sites"],
                         n_endogenous=dims.get("n_endogenous", 0))


def dims_of(ds: SiteDataset, n_sites: int) -> dict[str, int]:
    """The data dims a model is built from (what a site announces in ``query.hello``): no counts, no values."""
    from fcd_secure.data.spec import n_endogenous  # noqa: PLC0415

    return {"dx": ds.dx, "da": ds.da, "n_actions": int(ds.n_actions), "n_sites": int(n_sites), "L": ds.L,
            "n_endogenous": n_endogenous(ds.meta, ds.da)}


def train_local(model, ds: SiteDataset, cfg: RunConfig, site_index: int | None, n_sites: int, epochs: int, seed: int, optimizer) -> dict:
    """One site's local step (``Simulator.train_site``; for Fed-CausalDiff the paper's §III-C local objective).
    Propensities are dropped, except that Fed-CausalDiff's ``model.ipw`` turns them into loss weights on the site
    (``model.training.training_view``); no network ever sees P.

    ``site_index=None`` trains on a pooled dataset whose ``meta['site']`` holds per-row site labels.

    Only the loss parts the egress gate allow-lists (``audit.TRAIN_METRICS``: Fed-CausalDiff's parts, ``total``,
    ``n``, ``steps``, ``epochs``) are returned; another simulator's own parts (a GAN's discriminator loss, ...) stay
    on the site.

    Raises:
        ValueError: if ``optimizer`` is not the simulator's own (``Simulator.optimizer``).
    """
    from fcd_secure.audit.allowlist import TRAIN_METRICS  # noqa: PLC0415
    from fcd_secure.model.baselines import FedCausalDiffSimulator  # noqa: PLC0415

    if optimizer is not model.optimizer:
        raise ValueError("train_local: pass the simulator's own optimiser (Simulator.optimizer)")
    # Fed-CausalDiff applies training_view itself (P only under model.ipw); any other simulator never gets P
    view = ds if isinstance(model, FedCausalDiffSimulator) else ds.without_propensities()
    fit = model.train_site(view, site_index, n_sites, epochs=epochs, seed=seed)
    return {k: v for k, v in fit.items() if k in TRAIN_METRICS}


def round_epochs(epochs: int, min_steps: int, n_rows: int, batch_size: int) -> int:
    """Passes over a site's training rows in one local round: ``epochs`` (``federation.local_epochs``), raised to the
    fewest whole passes that make at least ``min_steps`` optimiser steps (``federation.min_local_steps``; 0: off).

    Why: FedAvg's progress per round is about one site's local updates, u = E·n_k/B (McMahan et al. 2017, AISTATS,
    §3 and Table 2: more local updates per round, fewer rounds to a target), so with E = 1 a site whose rows fill
    three batches moves the shared model three steps a round. On the tumour world's default sizes (~190 training rows
    a site, B = 64) ten rounds made ~40 steps of progress against the centralised g-formula's 300 (10 pooled
    epochs), and the federated simulator predicted the same value under every regimen (issue 42; docs/benchmarks.md).
    Whole passes, never a partial one, so every row weighs the same in a round and DP-SGD's plan of ``epochs``
    Poisson passes (``privacy.planner.steps_per_epoch``) counts the same steps.

    Raises:
        ValueError: ``epochs`` < 1, ``min_steps`` < 0 or ``batch_size`` < 1.
    """
    from fcd_secure.privacy.planner import steps_per_epoch  # noqa: PLC0415

    if epochs < 1 or min_steps < 0 or batch_size < 1:
        raise ValueError(f"round_epochs: epochs {epochs} >= 1, min_steps {min_steps} >= 0, batch_size {batch_size} "
                         ">= 1 expected")
    if min_steps == 0 or n_rows < 1:
        return int(epochs)
    per_pass = steps_per_epoch(n_rows, min(batch_size, n_rows))  # make_loader caps the batch at the site's rows
    return max(int(epochs), -(-int(min_steps) // per_pass))


def round_seed(seed: int, server_round: int, site_index: int, salt: int = 0) -> int:
    """A per-(run, round, site) seed: independent streams, reproducible, never shared between sites."""
    ss = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(server_round), int(site_index), int(salt)])
    return int(ss.generate_state(1, dtype=np.uint32)[0])


#: where a site's signed audit chain may be, inside its state directory (the runtime's slot; ``SiteLedger.open``)
_SITE_CHAIN_DIRS = ("slots", "audit")


def privacy_witness(state_dir) -> tuple:
    """The heads of the site's DP ledgers its own signed audit chain recorded (every upload line carries them,
    ``audit.gate``), the largest per ledger: what the site had spent, even if its ledger and anchor were deleted.

    Raises:
        PrivacyLedgerError: the chain holds a line that is not JSON (fail closed: the spend it records is unknown).
    """
    import json  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from fcd_secure._io import file_lock  # noqa: PLC0415
    from fcd_secure.anchor_records import PrivacyAnchor  # noqa: PLC0415
    from fcd_secure.audit.ledger import SITE_LEDGER_FILE, read_lines  # noqa: PLC0415
    from fcd_secure.privacy.errors import PrivacyLedgerError  # noqa: PLC0415

    heads: dict[str, PrivacyAnchor] = {}
    for folder in _SITE_CHAIN_DIRS:
        chain = Path(state_dir) / folder / SITE_LEDGER_FILE
        if not chain.is_file():
            continue
        with file_lock(chain):  # the chain's own append lock: never half a line
            lines = list(read_lines(chain))
        for ln, text in lines:
            try:
                line = json.loads(text)
            except json.JSONDecodeError as exc:
                raise PrivacyLedgerError(f"{chain}:{ln}: unreadable audit line ({exc}); refusing to train") from None
            if not isinstance(line, dict) or line.get("kind") != "upload":
                continue
            for raw in line.get("privacy_anchors") or ():
                head = PrivacyAnchor.model_validate(raw)
                if head.key not in heads or head.segments > heads[head.key].segments:
                    heads[head.key] = head
    return tuple(heads.values())


def check_privacy_witness(state_dir) -> tuple:
    """Refuse (``LedgerRollback``) if a ledger head the site's audit chain recorded is gone from its anchor (ledger
    and anchor deleted together); returns the witnessed heads."""
    from fcd_secure.privacy.anchor import AnchorStore  # noqa: PLC0415

    witnessed = privacy_witness(state_dir)
    AnchorStore(state_dir).check_witness(witnessed)
    return witnessed


def train_local_dp(
    model, ds: SiteDataset, cfg: RunConfig, site_index: int, n_sites: int, epochs: int, seed: int, optimizer,
    state_dir, server_round: int,
) -> dict:
    """The same local step under DP-SGD (``fcd_secure.privacy``): the site's write-ahead privacy ledger lives in its
    state directory; a round that does not fit the site's budget raises ``BudgetExceeded`` before any data is
    touched (the site then answers with an error and is counted as a failure for that round). The budget is per
    record across every run on the site (``privacy.spend``); a ledger lost together with its anchor, which the
    site's own audit chain still records, raises ``LedgerRollback`` at start (:func:`check_privacy_witness`).

    σ is planned for ``federation.rounds`` rounds of ``local_epochs`` (every round, as if the site were sampled
    each time: conservative under 5-of-10 sampling, whose amplification is not claimed).
    """
    from fcd_secure.model.baselines import FedCausalDiffSimulator  # noqa: PLC0415
    from fcd_secure.privacy.engine import DPSite, train_round_private  # noqa: PLC0415

    from fcd_secure.model.training import site_objective, training_view  # noqa: PLC0415

    if not isinstance(model, FedCausalDiffSimulator):
        raise ValueError(
            f"DP-SGD trains Fed-CausalDiff's local objective; model.simulator = {cfg.model.simulator!r} has none"
        )
    witnessed = check_privacy_witness(state_dir)  # before any data is read
    mc = site_objective(ds, model_config(cfg))
    ds = training_view(ds, mc)
    # keyed by the records themselves: the same table reordered, or with a record dropped, keeps its budget
    site = DPSite.for_dataset(
        state_dir, ds, cfg.dp, cfg.federation.rounds, epochs, mc.batch_size, run_id=cfg.training_hash()[:16],
        witnessed=witnessed,
    )
    return dict(
        train_round_private(
            site, model.module, ds, mc, site_index, n_sites, epochs=epochs, seed=seed, optimizer=optimizer,
            round_id=server_round,
        )
    )
