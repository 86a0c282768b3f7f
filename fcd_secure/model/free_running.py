"""The free-running loss: the simulator rolled forward k steps from every logged history under the logged actions,
feeding back its own contexts, and scored against what the log then shows (``ModelConfig.free_running_steps``).

Why. The other terms train the simulator one step ahead from the encoder's state of the *logged* history (teacher
forcing): L_recon, L_diff and L_context each see the true A_t, and L_cf (``losses.l_cf``) rolls the latent state
forward but reads the logged contexts at every step. A rollout under a policy instead feeds the simulator its own
generated endogenous contexts (``model.simulate``), so a small one-step error of the context head compounds over a
30-step horizon, which no training term measured: whole-trajectory values were off by 0.1-0.4 on 30-step worlds while
every one-step figure looked fine (issue 42). Training on the model's own predictions over several steps is the
remedy of Venkatraman, Hebert & Bagnell 2015 ("Improving multi-step prediction of learned time series models",
AAAI; DAgger for simulators), of scheduled sampling (Bengio, Vinyals, Jaitly & Shazeer 2015, NeurIPS) and of
professor forcing (Lamb et al. 2016, NeurIPS); under the logged actions the simulated and the observed trajectories
estimate the same distribution, which is the natural-course check of the parametric g-formula (Taubman et al. 2009;
``evaluation.natural_course``) made into a training loss.

What. From every ``free_running_stride``-th start step t (all in parallel on the ``[B, L]`` grid, as L_cf),
K̂_t = K_t (the encoder's), Â_t = A_t (logged), and for r = 1 … k::

    K̂_{t+r} = transition(K̂_{t+r−1}, Â_{t+r−1}, do(T_{t+r−1} = logged))      (differentiable DDIM, cf_sampler_steps)
    Â_{t+r} = [next_context(K̂_{t+r−1}, Â_{t+r−1}, T_{t+r−1}, Y_{t+r−1}),  A_{t+r}[n_endo:] replayed]
    ℓ_r     = −log P_φ(Y_{t+r} | K̂_{t+r}, Â_{t+r}, T_{t+r})  +  ‖Â_{t+r}[:n_endo] − A_{t+r}[:n_endo]‖² / n_endo

over the pairs where both t and t+r are logged; L_free = Σ_r w_r ℓ_r with w_r ∝ ``free_running_discount``^(r−1),
normalised to sum to one (the per-step weights; a discount below 1 weights the near steps more). The outcomes fed to
the transition (``transition_given_y``) and to the context head are the logged ones: under the logged actions they are
draws of the same distribution the simulator samples from, and they keep the loss's gradient free of sampling noise
(scheduled sampling of the outcome is left out on purpose: a sampled binary outcome carries no gradient). The
contexts are the simulator's own: the context error of step r reaches the context head through every earlier step,
while the transition and the decoder read the generated contexts as inputs only (detached), so that they learn to
work on the simulator's own contexts without the outcome's gradient bending the context head away from the logged
contexts (measured on the tumour world, seed 10: with that gradient the natural-course gap of the generated volume
grew ninefold, 0.010 → 0.089).

With the encoder rollout (``ModelConfig.rollout_kind``) the simulator does not step K with the transition but feeds the simulated step
back through the encoder (``model.simulate``); the loss then rolls the way the simulator is run: from t = 0 only
(the natural course itself; the recurrent encoder runs one step at a time, so further start steps would each cost a
pass of the encoder), K̃_0 = K_0 and for r = 1 … k::

    Â_r = [next_context(K̃_{r−1}, Â_{r−1}, T_{r−1}, Y_{r−1}),  A_r[n_endo:] replayed]
    K̃_r = encoder step(K̃_{r−1}'s state; X, Â_r, T_{r−1}, Y_{r−1})
    ℓ_r = −log P_φ(Y_r | K̃_r, Â_r, T_r) + ‖Â_r[:n_endo] − A_r[:n_endo]‖² / n_endo

with the same weights and the same detaching of the contexts where the encoder and the decoder read them. Where the
data has no endogenous context the encoder would re-read the logged history exactly (L_recon again), so the loss is
zero there.

Privacy. Every operation is per row (the start steps are an axis of the record, never folded into the batch axis),
so each record's loss, and Opacus' clipped per-sample gradient, depends on that record alone (Abadi et al. 2016,
§3.1); nothing new leaves a site: it trains the same Θc and Θs. IPW weights (``ModelConfig.ipw``) weight step t+r as
in L_cf.
"""

from __future__ import annotations

import torch

from fcd_secure.model.batch import Batch
from fcd_secure.model.losses import masked_mean, outcome_nll
from fcd_secure.model.networks import FedCausalDiff

__all__ = ["l_free_running", "step_weights"]


def step_weights(k: int, discount: float) -> torch.Tensor:
    """w_r ∝ discount^(r−1), r = 1 … k, summing to one."""
    w = torch.tensor([float(discount) ** r for r in range(k)])
    return w / w.sum()


def l_free_running(model: FedCausalDiff, K: torch.Tensor, h: torch.Tensor, batch: Batch,
                   W: torch.Tensor | None = None) -> torch.Tensor:
    """L_free per sample ``[B]`` (module docstring); zero with a graph when the trajectories have one step.

    Args:
        model: the bare network.
        K: the encoder's K_t of the logged history, ``[B, L, k]``.
        h: the encoder's trunk states, ``[B, L, hidden]`` (the state an encoder rollout starts from).
        batch: the batch.
        W: per-step IPW weights ``[B, L]`` or None.
    """
    A, T, Y, M = batch.A, batch.T, batch.Y, batch.M
    cfg = model.cfg
    B, L, _ = K.shape
    k = min(cfg.free_running_steps, L - 1)
    if k < 1:
        return K.sum((1, 2)) * 0.0
    if cfg.rollout_kind == "encoder":
        return _through_encoder(model, K, h, batch, k, W)
    n_endo = model.n_endogenous
    start = torch.arange(0, L - 1, cfg.free_running_stride)  # start steps t (the last step has no successor)

    def pad(x: torch.Tensor) -> torch.Tensor:
        z = torch.zeros((B, k) + tuple(x.shape[2:]), dtype=x.dtype)
        return torch.cat([x, z], 1)

    Ap, Tp, Yp, Mp = pad(A), pad(T), pad(Y), pad(M)
    Wp = None if W is None else pad(W)
    w = step_weights(k, cfg.free_running_discount)
    Kh, Ah = K[:, start], A[:, start]
    m0 = M[:, start]
    total = torch.zeros(B)
    for r in range(1, k + 1):
        prev, cur = start + (r - 1), start + r
        T_prev, Y_prev = Tp[:, prev], Yp[:, prev]
        # the generated contexts reach the transition and the decoder as inputs only (detached): the outcome's
        # gradient must not bend the context head away from the logged contexts (its own error term trains it)
        K_next = model.transition(Kh, Ah.detach(), T_prev, sampler="ddim", steps=cfg.cf_sampler_steps, y=Y_prev)
        A_next = Ap[:, cur]
        ctx_err = None
        if n_endo:
            gen = model.next_context(Kh, Ah, T_prev, Y_prev)
            ctx_err = ((gen - A_next[..., :n_endo]) ** 2).mean(-1)
            A_next = torch.cat([gen, A_next[..., n_endo:]], -1)
        Kh, Ah = K_next, A_next
        step = outcome_nll(model, Kh, Ah.detach(), Tp[:, cur], Yp[:, cur])
        if ctx_err is not None:
            step = step + ctx_err
        if Wp is not None:
            step = step * Wp[:, cur]
        total = total + w[r - 1] * masked_mean(step, Mp[:, cur] * m0)
    return total


def _through_encoder(model: FedCausalDiff, K: torch.Tensor, h: torch.Tensor, batch: Batch, k: int,
                     W: torch.Tensor | None) -> torch.Tensor:
    """L_free of an encoder rollout from t = 0 (module docstring)."""
    A, T, Y, M = batch.A, batch.T, batch.Y, batch.M
    n_endo = model.n_endogenous
    if not n_endo:  # every context replayed: the encoder would re-read the logged history, L_recon once more
        return K.sum((1, 2)) * 0.0
    w = step_weights(k, model.cfg.free_running_discount)
    Kh, Ah, state = K[:, 0], A[:, 0], model.start_state(h[:, 0])
    total = torch.zeros(K.shape[0])
    for r in range(1, k + 1):
        gen = model.next_context(Kh, Ah, T[:, r - 1], Y[:, r - 1])
        ctx_err = ((gen - A[:, r, :n_endo]) ** 2).mean(-1)
        Ah = torch.cat([gen, A[:, r, n_endo:]], -1)
        Kh, state = model.encode_step(state, batch.X, Ah.detach(), T[:, r - 1], Y[:, r - 1])
        step = outcome_nll(model, Kh, Ah.detach(), T[:, r], Y[:, r]) + ctx_err
        if W is not None:
            step = step * W[:, r]
        m = M[:, r] * M[:, 0]
        total = total + w[r - 1] * step * m
    # the per-step weights over the steps each row has (a short row's mean over its own steps, as masked_mean)
    seen = (w[:, None] * M[:, 1:k + 1].T).sum(0)
    return total / seen.clamp(min=1e-12)
