"""The rollout loop of the baselines: one place that turns a plan into actions, draws the outcome noise and builds
the :class:`~fcd_secure.model.simulator.SimResult`.

:class:`SteppedSimulator` is the template of those baselines (naive, CRN, RCGAN, TimeGAN, FedCM), in the manner of a
Flower strategy base class: it owns building (seeded), the local round, the rollout and the factual scores, and each
baseline writes only its network, its training step, its :class:`Stepper` and its factual logits.

A baseline supplies a :class:`Stepper` for a chunk of rows (its state after the logged history before ``start_t``,
already repeated ``n_samples`` times, patient-major); the loop asks it, step by step, for E[Y_t | state, do(T_t = a)]
and then tells it the sampled outcome (a gaussian outcome, which only the naive model allows, is told as its mean).
Randomness comes from one generator per row chunk seeded by ``seed`` and the chunk, and every step draws the stepper's
noise first and then (binary outcomes) one uniform per row, in the same order whatever the plan — so two plans (two
arms of an effect) share their random numbers (common random numbers; Glasserman & Yao 1992, Management Science 38(6)).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import nn

from fcd_secure.data.schema import SiteDataset
from fcd_secure.model.batch import Batch, dataset_tensors, make_loader
from fcd_secure.model.baselines.sequence import check_binary
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.simulator import Plan, SimResult, Simulator, check_window, plan_fn
from fcd_secure.model.training import run_round

__all__ = ["Stepper", "SteppedSimulator", "check_dims", "rollout"]


class Stepper(Protocol):
    """One chunk of rows being simulated (``B = rows × n_samples``)."""

    def prob(self, t: int, a: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """E[Y_t | simulated state, do(T_t = a)], ``[B]``; may draw the model's own noise from ``g``."""
        ...

    def observe(self, t: int, a: torch.Tensor, y: torch.Tensor) -> None:
        """Record the simulated step (action ``a`` and sampled outcome ``y``) before step t + 1."""
        ...


#: ``begin(rows, start_t, n_samples, g) -> Stepper``: the state after the logged history of ``rows`` before start_t.
Begin = Callable[[np.ndarray, int, int, torch.Generator], Stepper]


def check_dims(ds: SiteDataset, net: nn.Module, name: str) -> None:
    """Refuse a dataset whose dims differ from those the network ``net`` (its ``dx``, ``da``, ``n_actions``) was
    built for.

    Raises:
        ValueError: naming the dataset and both sets of dims.
    """
    have = {"dx": ds.dx, "da": ds.da, "n_actions": int(ds.n_actions)}
    want = {k: getattr(net, k) for k in have}
    if have != want:
        raise ValueError(f"{ds.name}: dims {have} do not match the {name} model {want}")


@torch.no_grad()
def rollout(
    ds: SiteDataset,
    plan: Plan,
    n_samples: int,
    seed: int,
    start_t: int,
    horizon: int | None,
    anchors: tuple[int, int] | None,
    n_actions: int,
    begin: Begin,
    meta: dict,
    chunk_rows: int = 512,
    binary: bool = True,
) -> SimResult:
    """Simulate ``plan`` for every row of ``ds`` from ``start_t`` (see the module docstring); ``binary`` false: the
    outcome is gaussian and its mean is fed back.

    Raises:
        ValueError: a window outside the data, ``n_samples`` < 1, or a plan that returns a wrong shape or an action
            outside ``[0, n_actions)``.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    H = check_window(ds.L, start_t, horizon)
    fn, name = plan_fn(plan, anchors, ds)
    n, S = ds.n, n_samples
    probs = np.zeros((n, S, H), np.float32)
    ys = np.zeros((n, S, H), np.float32)
    acts = np.zeros((n, S, H), np.int64)
    for c0 in range(0, n, chunk_rows):
        rows = np.arange(c0, min(n, c0 + chunk_rows))
        b = len(rows)
        g = torch.Generator().manual_seed(int(seed) * 1_000_003 + c0)
        stepper = begin(rows, start_t, S, g)
        rows_rep = np.repeat(rows, S)
        lengths = np.repeat(ds.lengths[rows], S)
        y_hist = np.repeat(ds.Y[rows, :start_t], S, axis=0).astype(np.float32)
        A_rep = np.repeat(ds.A[rows], S, axis=0)
        for h in range(H):
            t = start_t + h
            # no context model: a context-reading policy sees the logged contexts (SimResult.contexts: replayed)
            a = np.asarray(fn(h, t, y_hist, lengths, rows_rep, A_rep[:, : t + 1]), dtype=np.int64)
            if a.shape != (b * S,):
                raise ValueError(f"policy {name} returned shape {a.shape} at t={t}, expected ({b * S},)")
            if (a < 0).any() or (a >= n_actions).any():
                raise ValueError(f"policy {name} returned an action outside [0, {n_actions}) at t={t}")
            at = torch.as_tensor(a)
            p = stepper.prob(t, at, g)
            y = (torch.rand(b * S, generator=g) < p).float() if binary else p
            stepper.observe(t, at, y)
            probs[rows, :, h] = p.view(b, S).numpy()
            ys[rows, :, h] = y.view(b, S).numpy()
            acts[rows, :, h] = a.reshape(b, S)
            y_hist = np.concatenate([y_hist, y.numpy()[:, None]], axis=1)
    return SimResult.from_rollout(name, ds, start_t, probs, ys, acts, meta={**meta, "seed": seed})


class SteppedSimulator(Simulator):
    """The template of the baselines: one network ``net`` built by :meth:`build_network`, trained by
    :meth:`train_step` on every batch, rolled out by :func:`rollout` with the baseline's :meth:`stepper`, scored on the
    logged history by :meth:`factual_tensor`.

    Attributes:
        network: the network class, built as ``network(cfg, dx, da, n_actions)`` unless :meth:`build_network` is
            overridden; a network keeps ``dx``, ``da`` and ``n_actions`` as attributes.
        label: the baseline's name in messages ("CRN", "RCGAN", ...).
        chunk_rows: rows rolled out together, each chunk with its own generator (None: all rows at once).
    """

    network: ClassVar[type[nn.Module]]
    label: ClassVar[str]
    chunk_rows: ClassVar[int | None] = 512

    def __init__(self, net: nn.Module, config: ModelConfig) -> None:
        super().__init__(net, config)
        self.net = net

    @classmethod
    def from_dims(
        cls, cfg: ModelConfig, dx: int, da: int, n_actions: int, n_sites: int, n_endogenous: int = 0
    ) -> "SteppedSimulator":
        """:meth:`build_network` with parameters initialised from ``cfg.seed``; ``n_sites`` unused; ``n_endogenous``
        too: like their papers these baselines have no context model, so rollouts replay every logged context."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            net = cls.build_network(cfg, dx, da, n_actions)
        return cls(net, cfg)

    @classmethod
    def build_network(cls, cfg: ModelConfig, dx: int, da: int, n_actions: int) -> nn.Module:
        """``network(cfg, dx, da, n_actions)``.

        Raises:
            ValueError: for a non-binary outcome (the recurrent baselines model binary outcomes only).
        """
        check_binary(cfg, cls.name)
        return cls.network(cfg, dx, da, n_actions)

    def make_optimizer(self) -> torch.optim.Optimizer:
        """Adam at ``cfg.lr`` over every parameter (the adversarial baselines keep one over their players' groups)."""
        return torch.optim.Adam(self.net.parameters(), lr=self.config.lr)

    def _simulate(self, ds: SiteDataset, plan: Plan, n_samples: int, seed: int, start_t: int, horizon: int | None,
                  anchors: tuple[int, int] | None, **kw: Any) -> SimResult:
        """The stepper's rollout (module docstring).

        Raises:
            TypeError: for options only another simulator knows (``kw`` must be empty).
            ValueError: dims that do not match, or a bad window or plan.
        """
        if kw:
            raise TypeError(f"the {self.label} simulator takes no options {sorted(kw)}")
        check_dims(ds, self.net, self.name)
        with self.evaluating():
            return rollout(ds, plan, n_samples, seed, start_t, horizon, anchors, self.net.n_actions,
                           lambda rows, t0, S, g: self.stepper(ds, rows, t0, S, g), {"model": self.name},
                           chunk_rows=self.chunk_rows or max(ds.n, 1), binary=self.config.outcome == "binary")

    @torch.no_grad()
    def factual_probs(self, ds: SiteDataset) -> np.ndarray:
        """:meth:`factual_tensor` on the logged history, in eval mode, float64 ``[n, L]``."""
        with self.evaluating():
            p = self.factual_tensor(dataset_tensors(ds, 0), ds)
        return p.numpy().astype(np.float64)

    @torch.no_grad()
    def one_step_probs(self, ds: SiteDataset, action: int) -> np.ndarray:
        """The stepper's ``prob(t, action)`` after the logged history before t: each step is scored with ``action``,
        then the logged action and outcome are observed, float64 ``[n, L]``. The generator is fixed, so a baseline
        that draws its own noise (a GAN's) gives the same numbers each call."""
        check_dims(ds, self.net, self.name)
        out = np.zeros((ds.n, ds.L), np.float64)
        if ds.n == 0:
            return out
        with self.evaluating():
            g = torch.Generator().manual_seed(0)
            stepper = self.stepper(ds, np.arange(ds.n), 0, 1, g)
            a = torch.full((ds.n,), int(action), dtype=torch.int64)
            T = torch.as_tensor(np.asarray(ds.T, dtype=np.int64))
            Y = torch.as_tensor(np.asarray(ds.Y, dtype=np.float32))
            for t in range(ds.L):
                out[:, t] = stepper.prob(t, a, g).numpy()
                stepper.observe(t, T[:, t], Y[:, t])
        return out

    def train_site(
        self, ds: SiteDataset, site_index: int | None, n_sites: int, epochs: int = 1, seed: int = 0
    ) -> dict[str, float]:
        """One local round (:func:`~fcd_secure.model.training.run_round`): :meth:`train_step` on every batch of
        ``epochs`` passes shuffled by ``seed``. The site label is not used, nor are the propensities."""
        loader = make_loader(ds.without_propensities(), self.config.batch_size, seed, site_index=0)
        return run_round(self.net, loader, ds, epochs, seed, self.train_step)

    @abstractmethod
    def train_step(self, b: Batch) -> dict[str, float]:
        """One optimisation step on batch ``b`` (e.g. :func:`~.fitting.step_group`); returns its loss parts,
        ``total`` among them."""

    @abstractmethod
    def stepper(self, ds: SiteDataset, rows: np.ndarray, start_t: int, S: int, g: torch.Generator) -> Stepper:
        """The baseline's state for ``rows`` after their logged history before ``start_t`` (:class:`Stepper`)."""

    @abstractmethod
    def factual_tensor(self, b: Batch, ds: SiteDataset) -> torch.Tensor:
        """E[Y_t | logged history, logged T_t] at every step, ``[n, L]`` (``b``: ``ds`` as tensors)."""
