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
order, Taubman et al. 2009, Int J Epidemiol 38:1599; McGrath et al. 2020, gfoRmula). The default draws Y_t first and
this head reads it, (b, m) = g(K_t, emb(T_t), Y_t). With ``outcome_reads_contexts`` the head draws A_{t+1} first,
(b, m) = g(K_t, emb(T_t)), and the decoder reads it: P_φ(Y_t | K_t, A_t, Â_{t+1}[:n_endo], T_t)
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

How the three forms compare on the tumour oracle (direct, purely additive Â = A_t + b, affine): docs/tumour.md,
"The context head". The form is a model setting: it is in a
run's training hash, and every site builds the same Θc shapes from it (the affine head: inputs without A_t, two
outputs per endogenous column).
"""

from __future__ import annotations

import torch
from torch import nn


__all__ = ["FORMS", "ContextHead", "l_context"]

#: the forms of the head (``ModelConfig.context_head``; module docstring)
FORMS = ("affine", "direct")


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
