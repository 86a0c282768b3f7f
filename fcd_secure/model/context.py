"""The context head: time-varying contexts simulated under an intervention (g-computation; Robins 1986).

A context A_t that past treatment can change (a tumour's diameter, a lab value) must be *generated* when a policy is
rolled out: replaying the logged A_t would keep the consequences of the logged treatment under a different one. The
data layer marks such columns ``endogenous`` and puts them first in A (:func:`fcd_secure.data.spec.context_dynamics`);
the network then carries this head over its first ``n_endogenous`` columns:

    (b, m) = g(K_t, emb(T_t), Y_t)
    Â_{t+1} = A_t[:n_endo] ⊙ (1 + tanh m) + b    ``ModelConfig.context_head = "affine"`` (the default)
    Â_{t+1} = g(K_t, A_t, emb(T_t), Y_t)         ``"direct"`` (a free regression of the next value)

(the conditional mean of the next endogenous contexts), trained with the other losses as ``L_context`` =
E_t ‖A_{t+1}[:n_endo] − Â_{t+1}‖² over pairs (t, t+1) that are both valid (``ModelConfig.use_context`` /
``lambda_context``; per sample, so safe under DP-SGD). In a rollout the generated columns replace the logged ones
from the first simulated step after ``start_t`` on (A at ``start_t`` is observed before the first intervened
decision), and exogenous columns are replayed. The head is shared (Θc): how a context responds to treatment is part
of the causal mechanism every site has in common.

The order of a simulated step (``ModelConfig.outcome_reads_contexts``). The joint p(Y_t, A_{t+1} | H_t, do(T_t)) of
the step's outcome and next endogenous contexts may be factored either way (Robins 1986's g-formula holds for any
order of the time-varying variables that follows T_t; the parametric g-formula simulates them in a fixed temporal
order, Taubman et al. 2009, Int J Epidemiol 38:1599; McGrath et al. 2020, gfoRmula). With ``outcome_reads_contexts``
off, Y_t is drawn first and this head reads it, (b, m) = g(K_t, emb(T_t), Y_t). On (the default) the head draws
A_{t+1} first, (b, m) = g(K_t, emb(T_t)), and the decoder reads it: P_φ(Y_t | K_t, A_t, Â_{t+1}[:n_endo], T_t)
(``FedCausalDiff.decode``), trained on the logged A_{t+1} (teacher forcing) wherever the log has step t+1 and on the
head's own (detached) Â_{t+1} where it has not (a trajectory's last step). Where the world makes Y_t a function of
A_{t+1} (the tumour's Y_t = 1[d_{t+1} <= 3 cm], docs/tumour.md) the drawn outcome then agrees with the drawn context
by construction, where the outcome-first order let the decoder read its own last outcome Y_{t−1} against a generated
diameter that contradicts it (docs/benchmarks.md, issue 42, "The untreated course"). The one-step
E[Y_t | H_t, do(a)] (D₁, the factual AUC, the natural course) is then read at the head's Â_{t+1}.

The head gives the conditional mean, not a draw: for a context that enters the outcome model non-linearly this is
the plug-in approximation of g-computation (exact for linear dependence); the rollout's randomness still comes from
the diffusion transition and the sampled outcomes it conditions on. Integer-id categorical columns are regressed as
numbers.

Why the affine form by default: a clinical marker moves little from one step to the next, so "the same as today"
(carry forward, the persistence forecast) is the floor any forecast of it must beat. The affine head's last layer
starts at zero, so the untrained head *is* carry forward and training only has to learn the change, as a residual
block starts as the identity (He et al. 2016, "Deep residual learning for image recognition", CVPR). The change
scales with the level through the rate m (growth and cell kill are proportional to the tumour's volume in the PK-PD
model of Geng et al. 2017, as in most compartment models) and moves by amounts through b (a standardised context
near zero). The head reads A_t only through the skip (K_t summarises it): a rate that reads A_t multiplies A_t by a
function of itself, and beyond the range it was trained on (an untreated tumour simulated for 55 days) that feedback
diverges doubly exponentially, to −inf (docs/tumour.md, "The context head"). With m and b functions
of the bounded K_t (tanh range), the action and the outcome, and the factor 1 + tanh m in (0, 2), the multiplicative
part keeps the context's sign and a generated context grows at most geometrically.

A generated context can still leave every value a patient ever had: the affine head compounds a cumulative state
past its logged range and has no floor (on the carry-over world it drove severity below its floor of 0 and
toxicity to three times its largest logged value; docs/benchmarks.md, issue 42). The parametric g-formula's
standard guard is to truncate each simulated time-varying covariate to the range observed in the data (Taubman et
al. 2009, Int J Epidemiol 38:1599; McGrath et al. 2020, Patterns 1:100008, gfoRmula's ``restrictions`` and the
observed-range truncation of continuous covariates). :class:`ContextBounds` is that range, per endogenous column,
over one site's own valid training steps (``ModelConfig.clamp_contexts``: ``"range"`` both sides, ``"floor"`` the
minimum only (the default), ``"off"``). It is a record's value, so it is kept where the rows are: the simulator holds it as a
plain attribute, never as a parameter or buffer, and so it is in no Θc, Θs, checkpoint or message
(``Simulator.keep_context_range``).

How the three forms compare on the tumour oracle (direct, purely additive Â = A_t + b, affine): docs/tumour.md,
"The context head". The form is a model setting: it is in a
run's training hash, and every site builds the same Θc shapes from it (the affine head: inputs without A_t, two
outputs per endogenous column).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fcd_secure.data.schema import SiteDataset

__all__ = ["BOUND_KINDS", "FORMS", "ContextBounds", "ContextHead", "l_context"]

#: the forms of the head (``ModelConfig.context_head``; module docstring)
FORMS = ("affine", "direct")
#: the truncations of a generated context (``ModelConfig.clamp_contexts`` other than ``"off"``; module docstring)
BOUND_KINDS = ("range", "floor")


@dataclass(frozen=True)
class ContextBounds:
    """The observed range of each generated (endogenous) context column over one site's training rows: the
    g-formula's truncation of a simulated covariate to the range observed in the data (module docstring).

    Attributes:
        low: the smallest value of each of the leading ``n_endogenous`` context columns over the valid steps, float32.
        high: the largest (``+inf`` for kind ``"floor"``: a floor only), float32.
    """

    low: np.ndarray
    high: np.ndarray

    @classmethod
    def of(cls, ds: SiteDataset, n_endogenous: int, kind: str) -> "ContextBounds":
        """The bounds of ``ds``'s leading ``n_endogenous`` context columns over its valid steps (padding excluded).

        Raises:
            ValueError: an unknown kind, ``n_endogenous`` outside [1, da], or no valid step.
        """
        if kind not in BOUND_KINDS:
            raise ValueError(f"unknown context bounds {kind!r}; expected one of {BOUND_KINDS}")
        if not 0 < n_endogenous <= ds.da:
            raise ValueError(f"n_endogenous must be in [1, da={ds.da}], got {n_endogenous}")
        valid = ds.M.astype(bool)
        if not valid.any():
            raise ValueError(f"{ds.name}: no valid step to take the contexts' range from")
        seen = ds.A[valid][:, :n_endogenous].astype(np.float32)  # [valid steps, n_endogenous]
        high = seen.max(0) if kind == "range" else np.full(n_endogenous, np.inf, dtype=np.float32)
        return cls(low=seen.min(0), high=high)

    def clamp(self, A: torch.Tensor) -> torch.Tensor:
        """``A`` [..., n_endogenous] truncated to [low, high] column by column."""
        return torch.minimum(torch.maximum(A, torch.as_tensor(self.low, dtype=A.dtype)),
                             torch.as_tensor(self.high, dtype=A.dtype))


class ContextHead(nn.Module):
    """(K_t, A_t, emb(T_t), Y_t) → Â_{t+1}[:n_endogenous], in the form of the module docstring.

    Args:
        k: dim of K_t.
        da: context features per step.
        action_emb: size of the action embedding the network shares.
        n_endogenous: leading context columns to generate.
        hidden: MLP width.
        form: ``"affine"`` or ``"direct"`` (module docstring).
        reads_outcome: read the step's outcome Y_t (the outcome drawn first); False draws the contexts before the
            outcome, from (K_t, A_t, emb(T_t)) alone (``ModelConfig.outcome_reads_contexts``, module docstring).

    Raises:
        ValueError: ``n_endogenous`` outside [1, da], or an unknown form.
    """

    def __init__(self, k: int, da: int, action_emb: int, n_endogenous: int, hidden: int, form: str = "affine",
                 reads_outcome: bool = True) -> None:
        super().__init__()
        if not 0 < n_endogenous <= da:
            raise ValueError(f"n_endogenous must be in [1, da={da}], got {n_endogenous}")
        if form not in FORMS:
            raise ValueError(f"unknown context head form {form!r}; expected one of {FORMS}")
        self.n_endogenous = n_endogenous
        self.form = form
        self.reads_outcome = reads_outcome
        affine = form == "affine"
        # the affine head reads A_t only through the skip (module docstring): its change is bounded
        n_in = k + action_emb + int(reads_outcome) + (0 if affine else da)
        # one hidden layer, as the other heads of the network (networks.mlp with depth 1)
        n_out = 2 * n_endogenous if affine else n_endogenous  # the affine head's (b, m)
        self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.SiLU(), nn.Linear(hidden, n_out))
        if affine:
            # the untrained head is carry forward
            with torch.no_grad():
                self.net[-1].weight.zero_()
                self.net[-1].bias.zero_()

    def forward(self, K: torch.Tensor, A: torch.Tensor, T_emb: torch.Tensor, Y: torch.Tensor | None) -> torch.Tensor:
        """Â_{t+1} for inputs that share their leading axes (``Y`` without the feature axis; read only by a head that
        ``reads_outcome``, which requires it).

        Raises:
            ValueError: a head that reads the outcome was given none.
        """
        n = self.n_endogenous
        parts = [K, T_emb]
        if self.reads_outcome:
            if Y is None:
                raise ValueError("this context head reads the step's outcome Y_t: give it")
            parts.append(Y.unsqueeze(-1))
        if self.form == "direct":
            return self.net(torch.cat([K, A, *parts[1:]], dim=-1))
        g = self.net(torch.cat(parts, dim=-1))
        return A[..., :n] * (1.0 + torch.tanh(g[..., n:])) + g[..., :n]


def l_context(model: nn.Module, K: torch.Tensor, batch) -> torch.Tensor:
    """L_context per sample ``[B]``: the mean squared error of Â_{t+1} against the logged endogenous A_{t+1}, over the
    pairs (t, t+1) that are both valid (module docstring)."""
    A, T, Y, M = batch.A, batch.T, batch.Y, batch.M
    n = model.n_endogenous
    pred = model.next_context(K[:, :-1], A[:, :-1], T[:, :-1], Y[:, :-1])
    err = ((pred - A[:, 1:, :n]) ** 2).mean(-1)
    pair = M[:, :-1] * M[:, 1:]
    return (err * pair).sum(1) / pair.sum(1).clamp(min=1.0)
