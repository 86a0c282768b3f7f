"""The one entry point of DP-SGD on a site: ``DPSite`` (the counterpart of Opacus' ``PrivacyEngine``).

A site's local training under DP is, every round::

    site = DPSite.for_dataset(state_dir, ds, dp_cfg, planned_rounds, local_epochs, batch_size)
    res = site.reserve_round()                 # write-ahead; BudgetExceeded -> the site refuses the round
    model, opt, loader = site.make_private(model, opt, loader, seed=seed)
    ...  # train: every batch -> one loss.backward() of the per-sample losses, one opt.step()
    site.commit(res)                           # the steps actually taken; hooks removed
    eps, delta = site.spent()

* σ is planned **once** for the planned use (rounds × local epochs × ⌈N/B⌉ steps) and stored in the ledger, so
  every round of the plan — in this process, after a restart, in a fresh ``DPSite`` — uses the same σ through
  ``make_private(noise_multiplier=σ)``. ``make_private_with_epsilon`` is never called: Opacus 1.6 derives its σ
  assuming a zero starting point (it only warns when the accountant already holds history), so calling it every
  round overspends (a cap of ε = 8 ends near ε = 25 after 20 rounds of one epoch each, at q = 1/32).
* A new plan (a new run with other settings, or a run after the previous plan's steps are used up) is planned
  against the remaining budget: the whole history stays in the composition, so nothing resets.
* A step guard on the DP optimizer refuses any step beyond the reservation before the parameters move; the
  ledger is closed with the number of steps the guard counted and the Opacus accountant is checked against it.
* Poisson sampling with Opacus' q = 1/len(loader) (checked against the plan), ``grad_sample_mode="hooks"``,
  ``wrap_model=False`` so the model keeps its own methods (``encode``, ``simulate``).
* The budget is per record (:mod:`fcd_secure.privacy.spend`): ``DPSite.for_dataset`` gives the ledger the table's
  record keys, a round is refused before any data is read if *any* record of the table would pass the cap over
  every run on the site (whatever split or seed chose the table), σ is planned for the record that has spent the
  most, and the spend of acknowledged resets is carried forward. The design refuses the whole round rather than
  training on the records with budget left: dropping records would make the table, its size N and q depend on
  other runs' spend, and which records were dropped would itself depend on private membership.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from fcd_secure._io import SecretFileError, load_or_create_secret
from fcd_secure.anchor_records import LedgerHead
from fcd_secure.privacy.anchor import AnchorStore
from fcd_secure.privacy.config import DPConfig
from fcd_secure.privacy.identity import DatasetIdentity, dataset_identity, record_keys, record_secret
from fcd_secure.privacy.ledger import (
    BudgetExceeded,
    Ledger,
    PrivacyLedgerError,
    LedgerRollback,
    PlanRecord,
    dataset_fingerprint,
    find_ledger,
)
from fcd_secure.privacy.planner import plan_noise_multiplier, sample_rate, steps_per_epoch
from fcd_secure.privacy.spend import RecordGroup, worst_group

__all__ = [
    "BudgetExceeded",
    "DPSite",
    "PrivacyLedgerError",
    "LedgerRollback",
    "Reservation",
    "dataset_fingerprint",
    "dataset_identity",
    "ledger_folder",
    "train_round_private",
]


@dataclass(frozen=True)
class Reservation:
    """A round's reserved steps (ledger segment ``seq``) and the ε the whole history would reach with them."""

    seq: int
    steps: int
    sigma: float
    q: float
    epsilon_projected: float
    round_id: int | None = None


def ledger_folder(state_dir: str | Path, dp_cfg: DPConfig) -> Path:
    """The folder of a site's ledgers: ``dp.ledger_dir`` when configured, else ``<state_dir>/privacy``."""
    return Path(dp_cfg.ledger_dir) if dp_cfg.ledger_dir is not None else Path(state_dir) / "privacy"


class _StepGuard:
    """Wraps the accountant's step hook: counts DP steps and refuses one beyond the reservation.

    Opacus calls the hook after clipping and noising but before ``original_optimizer.step()``; raising here
    therefore stops the parameter update of the step that would overspend.
    """

    def __init__(self, inner: Any, limit: int) -> None:
        self.inner, self.limit, self.count = inner, limit, 0

    def __call__(self, optim: Any) -> None:
        if self.count >= self.limit:
            raise BudgetExceeded(
                f"DP step {self.count + 1} refused: the round reserved {self.limit} steps in the privacy ledger"
            )
        self.count += 1
        self.inner(optim)


class DPSite:
    """Per-site DP-SGD: the plan, the write-ahead ledger and Opacus' ``make_private`` for each round.

    Parameters mirror the planned use: ``planned_rounds`` rounds of ``local_epochs`` epochs of Poisson batches
    of expected size ``batch_size`` from ``n_site`` trajectories. The ledger lives in
    ``<state_dir>/privacy/ledger-<fingerprint>.json``, or ``<dp_cfg.ledger_dir>/ledger-<fingerprint>.json`` when a
    persistent ledger folder is configured. Either must outlive a run, or a new run would start a new budget.
    ``state_dir``'s name is recorded as the site's label.
    """

    def __init__(
        self,
        state_dir: str | Path,
        dataset_fingerprint: str | DatasetIdentity,
        dp_cfg: DPConfig,
        n_site: int,
        planned_rounds: int,
        local_epochs: int,
        batch_size: int,
        *,
        run_id: str | None = None,
        records: Sequence[str] | None = None,
        witnessed: Sequence[LedgerHead] = (),
    ) -> None:
        """Open (or start) the ledger of a site's data and plan σ for the planned use.

        Args:
            state_dir: the site's state directory (its anchor file lives there; the ledger too unless
                ``dp_cfg.ledger_dir`` is set).
            dataset_fingerprint: the table's :class:`~fcd_secure.privacy.identity.DatasetIdentity` (the same data
                reordered, or with a record dropped or added, then finds its ledger), or a bare fingerprint (only
                that exact table finds it). :meth:`for_dataset` computes the identity.
            dp_cfg: the ``[dp]`` settings.
            n_site: trajectories the site trains on.
            planned_rounds: rounds of the planned use.
            local_epochs: local epochs per round.
            batch_size: expected Poisson batch size.
            run_id: recorded with each segment.
            records: the table's record keys (:func:`~fcd_secure.privacy.identity.record_keys`): the budget is then
                accounted per record over every ledger of the site (:mod:`fcd_secure.privacy.spend`); ``None`` (a
                bare fingerprint) accounts this ledger alone. :meth:`for_dataset` gives them.
            witnessed: the ledger heads the site's signed audit chain recorded
                (:meth:`~fcd_secure.privacy.anchor.AnchorStore.check_witness`): one the anchor lost is refused.

        Raises:
            LedgerRollback: the ledger of this data was deleted or rolled back since the site anchored it; the site
                refuses until an operator acknowledges (``fcd privacy acknowledge-reset``).
            PrivacyLedgerError: the ledger cannot be trusted, or the settings contradict it (raised cap, another δ).
        """
        if not dp_cfg.enabled:
            raise ValueError("DPSite needs dp.enabled = true")
        if planned_rounds < 1 or local_epochs < 1:
            raise ValueError(f"dp: planned_rounds and local_epochs must be ≥ 1, got {planned_rounds}, {local_epochs}")
        identity = (
            dataset_fingerprint
            if isinstance(dataset_fingerprint, DatasetIdentity)
            else DatasetIdentity(fingerprint=dataset_fingerprint, n=int(n_site))
        )
        self.cfg = dp_cfg
        self.state_dir = Path(state_dir)
        self.identity = identity
        self.fingerprint = identity.fingerprint
        self.n_site = int(n_site)
        self.batch_size = int(batch_size)
        self.run_id = run_id
        self.delta = dp_cfg.resolve_delta(self.n_site)
        self.sample_rate = sample_rate(self.n_site, self.batch_size)
        self.steps_per_round = int(local_epochs) * steps_per_epoch(self.n_site, self.batch_size)
        anchor = AnchorStore(self.state_dir)
        anchor.check_witness(witnessed)  # before anything is written: a ledger lost with its anchor stops the site
        self.records = sorted(set(records)) if records is not None else None
        #: ε carried forward by acknowledged resets, charged to every record of the site
        self.carried = anchor.carried()
        folder = ledger_folder(self.state_dir, dp_cfg)
        self.ledger = Ledger(find_ledger(folder, identity, anchor), anchor=anchor)
        self.ledger.open_or_create(
            identity=identity,
            n_site=self.n_site,
            delta=self.delta,
            epsilon_cap=dp_cfg.epsilon,
            clip=dp_cfg.clip,
            accountant=dp_cfg.accountant,
            align_under_dp=dp_cfg.align_under_dp,
            noise_seed=dp_cfg.noise_seed,
            site=self.state_dir.name or None,
            records=self.records,
        )
        #: why every round will be refused (the budget left cannot pay for the planned use), or None
        self.refusal: str | None = None
        self.plan = self._plan(planned_rounds, local_epochs)
        self._open: dict[int, tuple[Any, _StepGuard, Any]] = {}
        self._mine: list[int] = []  # reservations made by this instance, not yet given to make_private

    @classmethod
    def for_dataset(
        cls,
        state_dir: str | Path,
        ds: Any,
        dp_cfg: DPConfig,
        planned_rounds: int,
        local_epochs: int,
        batch_size: int,
        *,
        run_id: str | None = None,
        witnessed: Sequence[LedgerHead] = (),
    ) -> "DPSite":
        """The :class:`DPSite` of a site's training table ``ds`` (a ``SiteDataset``), keyed by its records.

        The same records in another row order, or with a record dropped or added, keep their ledger
        (:mod:`fcd_secure.privacy.identity`), and every record's spend is accounted across all the site's ledgers.
        A record's id is its raw values under the record secret of the ledgers' folder, so no standardisation the
        coordinator sends moves it (docs/threats.md P45).

        Raises:
            PrivacyLedgerError: the folder's ledgers list records but its record secret is gone.
            DataError: ``ds`` is standardised without the digests of its raw records.
        """
        secret = record_secret(ledger_folder(state_dir, dp_cfg))
        return cls(state_dir, dataset_identity(ds, secret), dp_cfg, ds.n, planned_rounds, local_epochs, batch_size,
                   run_id=run_id, records=record_keys(ds, secret), witnessed=witnessed)

    # -- planning ------------------------------------------------------------------------------------
    @property
    def noise_multiplier(self) -> float:
        """σ of this site's plan (Gaussian std / C per step), fixed for the whole planned use."""
        return self.plan.sigma

    def _plan(self, planned_rounds: int, local_epochs: int) -> PlanRecord:
        """Reuse the current plan when it describes this use and has steps left; else plan the remaining budget."""
        want = dict(
            q=self.sample_rate,
            batch_size=self.batch_size,
            steps_per_round=self.steps_per_round,
            planned_rounds=int(planned_rounds),
            local_epochs=int(local_epochs),
        )
        state = self.ledger.load()
        if state.plans:
            last = state.plans[-1]
            used = sum(s.reserved_steps for s in state.segments if s.plan_id == last.plan_id)
            same = all(getattr(last, k) == v for k, v in want.items())
            if same and used < last.planned_steps:
                return last
        try:
            sigma = self._plan_sigma(state, self.steps_per_round * int(planned_rounds))
        except ValueError as exc:
            # What is left of the budget cannot pay for this use at a useful σ. No plan is recorded; every
            # reservation is refused with the reason (fail closed, and say why instead of training on noise).
            self.refusal = f"{exc} (ledger {self.ledger.path})"
            return PlanRecord(plan_id=0, sigma=self.cfg.max_noise_multiplier, created_at=0.0, **want)
        return self.ledger.add_plan(dict(sigma=sigma, **want))

    def _plan_sigma(self, state: Any, planned_steps: int) -> float:
        """The smallest σ that keeps every record of the table within the cap (less the carried spend).

        Planned for the record group that has spent the most, then checked against every other group (their
        histories mix other (σ, q)); a group still above the cap is planned for in turn and the largest σ kept.
        """
        budget = state.epsilon_cap - self.carried
        if budget <= 0:
            raise ValueError(f"the budget is already spent: {self.carried:.3f} carried by acknowledged resets")
        gs = self.ledger.record_groups(state, self.records)
        spent, target = worst_group(gs, state.accountant)
        share = self.cfg.run_epsilon
        if share is not None:
            # the run's share of the lifetime cap: the plan ends the run at most `share` above the worst record's
            # spend; the site, not the server, decides whether that much is left
            left = budget - spent
            if share > left + 1e-9:
                raise ValueError(f"the run asks for ε {share:g} and the site has ε {max(left, 0.0):.3f} left of its "
                                 f"cap {state.epsilon_cap:g}: the site refuses (ask for at most what is left)")
            budget = spent + share
        sigma = 0.0
        for _ in range(len(gs) + 1):
            if target is None:  # no record to plan for (cannot happen: a table has at least one record)
                break
            sigma = max(sigma, plan_noise_multiplier(
                epsilon_cap=budget,
                delta=target.delta,
                q=self.sample_rate,
                planned_steps=planned_steps,
                accountant=state.accountant,
                history=target.history,
                sigma_max=self.cfg.max_noise_multiplier,
            ))
            eps, target = worst_group(gs, state.accountant, [(sigma, self.sample_rate, planned_steps)])
            if eps <= budget:
                return sigma
        raise ValueError(f"no σ ≤ {self.cfg.max_noise_multiplier:g} keeps every record within ε ≤ {budget:g}")

    def _groups(self) -> tuple[Any, list[RecordGroup]]:
        state = self.ledger.load()
        return state, self.ledger.record_groups(state, self.records)

    # -- one round -----------------------------------------------------------------------------------
    def reserve_round(self, steps: int | None = None, *, round_id: int | None = None) -> Reservation:
        """Write-ahead: record ``steps`` (default: one round of the plan) before any private data is read.

        Raises ``BudgetExceeded`` if the projected ε of the whole history would exceed the cap; the caller turns
        it into an error reply (the server counts the site as failed for that round and goes on).
        """
        steps = self.steps_per_round if steps is None else int(steps)
        if self.refusal is not None:
            raise BudgetExceeded(f"privacy budget exhausted: {self.refusal}")
        seg = self.ledger.reserve(
            plan_id=self.plan.plan_id,
            sigma=self.plan.sigma,
            q=self.sample_rate,
            steps=steps,
            round_id=round_id,
            run_id=self.run_id,
            records=self.records,
            carried=self.carried,
        )
        self._mine.append(seg.seq)
        return Reservation(seg.seq, steps, seg.sigma, seg.q, seg.epsilon_projected + self.carried, round_id)

    def _generator(self, purpose: str, seed: int, seq: int) -> torch.Generator:
        """The RNG of the Gaussian noise or of the Poisson draws of one round.

        Both must be unpredictable to the adversary: known noise can be subtracted, and knowing which records a
        step sampled voids the amplification by subsampling that the accountant credits. With the default
        ``noise_seed = "site_secret"`` the seed mixes a secret that never leaves the site with the run seed and
        the ledger segment, so a site re-running with the same state reproduces its numbers and no one else can.
        """
        head = b"run" if self.cfg.noise_seed == "run_seed" else self._site_secret()
        # the dataset fingerprint too: ledger segments restart at 1 per dataset, and two datasets trained from one
        # state folder with the same run seed must not share a noise stream
        material = head + f"|{self.fingerprint}|{purpose}|{seed}|{seq}".encode()
        g = torch.Generator()
        g.manual_seed(int.from_bytes(hashlib.sha256(material).digest()[:8], "little"))
        return g

    def _site_secret(self) -> bytes:
        """32 random bytes in the site's state (mode 0600); they make the noise unpredictable to anyone but the site.

        Raises:
            PrivacyLedgerError: the secret file exists with another size, or cannot be read (the site must not train with
                a noise seed it cannot trust).
        """
        try:
            return load_or_create_secret(self.state_dir / "privacy" / "noise_secret.bin", 32)
        except SecretFileError as exc:
            raise PrivacyLedgerError(str(exc)) from None

    def make_private(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader, *, seed: int = 0
    ) -> tuple[torch.nn.Module, Any, DataLoader]:
        """Opacus ``make_private(noise_multiplier=σ)`` for the open reservation; returns (model, DP optimizer, loader).

        ``loader`` is an ordinary (non-Poisson) loader over the site's ``n_site`` trajectories with batch size
        ``batch_size``; Opacus replaces it by Poisson sampling with q = 1/len(loader), which must equal the planned
        q. The model is returned unwrapped (``wrap_model=False``) with per-sample hooks attached until ``commit``.
        Training must call ``loss.backward()`` on the mean of per-sample losses exactly once per optimizer step and
        must run the forward on empty Poisson batches too (a skipped noisy step would reveal the empty batch).
        """
        from opacus import PrivacyEngine

        if not self._mine:
            raise BudgetExceeded("make_private without a reservation: call reserve_round() first")
        seq = self._mine[-1]
        res_steps = self.ledger.load().segments[seq - 1].reserved_steps
        n = len(loader.dataset)  # type: ignore[arg-type]
        if n != self.n_site:
            raise ValueError(f"dp: the loader holds {n} trajectories, the plan was made for n_site={self.n_site}")
        if 1.0 / len(loader) != self.sample_rate:
            raise ValueError(
                f"dp: Opacus would sample at q=1/{len(loader)}, the plan accounts q={self.sample_rate:g} "
                f"(batch_size {self.batch_size}); build the loader with batch_size={self.batch_size}"
            )
        # Opacus draws the Poisson batches with the loader's generator: give it the round's private one (the
        # caller's loader may be seeded from the public run seed, or use the global RNG).
        loader = DataLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            collate_fn=loader.collate_fn,
            generator=self._generator("poisson", seed, seq),
        )
        # torch warns on every backward that a full backward hook fires on a first layer whose input needs no
        # gradient (Opacus' hooks); the per-sample gradients are unaffected.
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
        with warnings.catch_warnings():
            # "Secure RNG turned off" is a documented limitation (the report lists it), not news every round.
            warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG.*")
            engine = PrivacyEngine(accountant=self.cfg.accountant, secure_mode=False)
            hooks, dp_opt, dp_loader = engine.make_private(
                module=model,
                optimizer=optimizer,
                data_loader=loader,
                noise_multiplier=self.plan.sigma,
                max_grad_norm=self.cfg.clip,
                poisson_sampling=True,
                grad_sample_mode=self.cfg.grad_sample_mode,
                wrap_model=False,
                noise_generator=self._generator("noise", seed, seq),
                loss_reduction="mean",
            )
        guard = _StepGuard(dp_opt.step_hook, res_steps)
        dp_opt.attach_step_hook(guard)
        self._open[seq] = (hooks, guard, engine)
        self._mine.remove(seq)
        return model, dp_opt, dp_loader

    def commit(self, reservation: Reservation) -> float:
        """Close the reservation with the steps actually taken, remove the hooks; returns ε spent so far.

        Safe to call after a failed round: the guard's count is exact, so only steps that ran are charged.
        A reservation never passed to ``make_private`` is committed with 0 steps.
        """
        hooks, guard, engine = self._open.pop(reservation.seq, (None, None, None))
        if reservation.seq in self._mine:
            self._mine.remove(reservation.seq)
        taken = 0
        if guard is not None:
            taken = guard.count
            hist = [tuple(h) for h in engine.accountant.history]
            expect = [(reservation.sigma, reservation.q, taken)] if taken else []
            if hist != expect:
                raise PrivacyLedgerError(
                    f"Opacus accounted {hist} but the ledger reserved {[(reservation.sigma, reservation.q)]} "
                    f"for {taken} steps; the reservation stays charged in full"
                )
            hooks.cleanup()
        self.ledger.commit(reservation.seq, taken)
        return self.spent()[0]

    # -- reading -------------------------------------------------------------------------------------
    def spent(self) -> tuple[float, float]:
        """(ε, δ) of the record of this table that has spent the most, over every ledger of the site (open
        reservations counted in full) plus the spend carried by acknowledged resets."""
        state, gs = self._groups()
        return worst_group(gs, state.accountant)[0] + self.carried, state.delta

    def remaining(self) -> float:
        """ε left under the cap for the record of this table that has spent the most (0 when spent)."""
        return max(0.0, self.ledger.load().epsilon_cap - self.spent()[0])

    def projected(self, steps: int | None = None) -> float:
        """ε the most-spent record would reach with one more round (what ``reserve_round`` checks against the cap)."""
        state, gs = self._groups()
        steps = self.steps_per_round if steps is None else int(steps)
        return worst_group(gs, state.accountant, [(self.plan.sigma, self.sample_rate, steps)])[0] + self.carried


def train_round_private(
    site: DPSite,
    model: torch.nn.Module,
    ds: Any,
    model_cfg: Any,
    site_index: int | None,
    n_sites: int,
    *,
    epochs: int,
    seed: int,
    optimizer: torch.optim.Optimizer | None = None,
    round_id: int | None = None,
) -> dict[str, float]:
    """One DP round of local training: reserve → ``make_private`` → ``model.training.train_local`` → commit.

    ``model_cfg`` is switched to ``dp_mode`` with the configured ``align_under_dp``, so no batch-coupled loss term
    reaches DP-SGD (per-sample clipping bounds one record's influence only if each loss term depends on one record;
    Opacus does not inspect losses). The reservation is committed even if training fails, with the steps that
    actually ran.

    Args:
        site: the site's :class:`DPSite` (plan and ledger).
        model: the site's model; returned unwrapped, with its parameters trained in place.
        ds: the site's training dataset (``site.n_site`` trajectories).
        model_cfg: the model configuration (``fcd_secure.model.config.ModelConfig``).
        site_index: the site's index for the site discriminator, or ``None``.
        n_sites: number of sites of the federation.
        epochs: local epochs of this round.
        seed: the run seed (mixed with the site secret for the noise and Poisson draws).
        optimizer: the optimizer to make private (default: the model's own).
        round_id: the federated round, recorded in the ledger.

    Returns:
        ``train_local``'s metrics plus ``dp_epsilon``, ``dp_delta``, ``dp_sigma`` and ``dp_steps``.

    Raises:
        BudgetExceeded: before touching the data, if the round does not fit the budget.
        ValueError: the dataset does not match the plan, or the configuration has batch-coupled loss terms.
    """
    from fcd_secure.model.training import make_loader, make_optimizer, train_local

    if ds.n != site.n_site:
        raise ValueError(f"dp: dataset {ds.name} has {ds.n} trajectories, the site's plan has n_site={site.n_site}")
    cfg = model_cfg.model_copy(update={"dp_mode": True, "align_under_dp": site.cfg.align_under_dp})
    if not cfg.per_sample_safe:
        raise ValueError(f"dp: batch-coupled loss terms {cfg.batch_coupled_terms} cannot run under DP-SGD")
    reservation = site.reserve_round(epochs * steps_per_epoch(site.n_site, site.batch_size), round_id=round_id)
    steps_taken = 0
    frozen = _unused_parameters(model, ds, cfg, site_index, n_sites)
    try:
        for p in frozen:
            p.requires_grad_(False)
        opt = optimizer if optimizer is not None else make_optimizer(model, cfg)
        loader = make_loader(ds, site.batch_size, seed, site_index, poisson=False)
        model, dp_opt, dp_loader = site.make_private(model, opt, loader, seed=seed)
        metrics = train_local(
            model, ds, cfg, site_index, n_sites, epochs=epochs, seed=seed, optimizer=dp_opt, loader=dp_loader
        )
        steps_taken = int(metrics.get("steps", 0))
    finally:
        site.commit(reservation)
        for p in frozen:
            p.requires_grad_(True)
    eps, delta = site.spent()
    metrics.update(dp_epsilon=eps, dp_delta=delta, dp_sigma=site.noise_multiplier, dp_steps=float(steps_taken))
    return metrics


def _unused_parameters(model: torch.nn.Module, ds: Any, cfg: Any, site_index: int | None, n_sites: int) -> list:
    """Parameters the configured loss never reaches (e.g. the L_dis heads in the w/o-L_dis ablation).

    Opacus refuses a step when a trainable parameter got no per-sample gradient, so these are frozen for the round
    (they are not updated, so releasing them costs nothing). Found with an *empty* batch: only the configuration
    decides which parameters the loss reaches, and no record is read.
    """
    from fcd_secure.model.training import batch_loss, dataset_tensors

    empty = tuple(t[:0] for t in dataset_tensors(ds, site_index))
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.random.fork_rng(devices=[]):
        loss, _ = batch_loss(model, empty, cfg, n_sites)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [p for p, g in zip(params, grads) if g is None]
