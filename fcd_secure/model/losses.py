"""The terms of the Fed-CausalDiff local objective (paper §III-C)::

    L = L_recon + λ_diff·L_diff + λ1·L_align + λ2·L_dis + λ3·L_cf

Every per-sample term returns a vector ``[B]``: the masked mean over that trajectory's valid steps. Nothing is
reduced across the batch here except in the batch MMD, which is the only batch-coupled term and is never used
under DP-SGD (``ModelConfig.align_form``; Opacus ``grad_sample/README.md``: no joint computation over batch samples;
Kong et al. 2023, arXiv 2310.03104). Per-sample randomness (diffusion steps, noise) is drawn per row inside these
functions, so each row's loss, and its clipped gradient, depends on that record alone (Abadi et al. 2016, §3.1).

``batch`` is a :class:`~fcd_secure.model.batch.Batch` (``X[B,dx], A[B,L,da], T[B,L], Y[B,L], M[B,L], site[B],
P[B,L]``); P (the logged propensity) is read only by :func:`ipw_weights`. The likelihood terms take optional per-step
weights ``W [B, L]`` (inverse-propensity weights, ``ModelConfig.ipw``); ``None`` is the paper's unweighted objective.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fcd_secure.model.batch import Batch
from fcd_secure.model.config import ModelConfig
from fcd_secure.model.networks import FedCausalDiff


def masked_mean(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Per-row mean of ``v`` over steps where ``m`` = 1 (rows with no such step give 0). Shapes [B, L] → [B]."""
    return (v * m).sum(1) / m.sum(1).clamp(min=1.0)


def outcome_nll(model: FedCausalDiff, K: torch.Tensor, A: torch.Tensor, T: torch.Tensor, Y: torch.Tensor,
                A_next: torch.Tensor | None = None) -> torch.Tensor:
    """−log P_φ(Y_t | K_t, A_t, T_t) per step: Bernoulli(logit) or N(mean, σ²) with learned log σ. ``A_next``: the
    step's next endogenous contexts where the decoder reads them (``FedCausalDiff.decode``)."""
    out = model.decode(K, A, T, A_next)
    if model.cfg.outcome == "binary":
        return F.binary_cross_entropy_with_logits(out[..., 0], Y, reduction="none")
    mean, log_sigma = out[..., 0], out[..., 1].clamp(-5.0, 5.0)
    return 0.5 * ((Y - mean) * torch.exp(-log_sigma)) ** 2 + log_sigma


def teacher_contexts(model: FedCausalDiff, K: torch.Tensor, A: torch.Tensor, T: torch.Tensor, A_after: torch.Tensor,
                     logged: torch.Tensor) -> torch.Tensor | None:
    """The next endogenous contexts the decoder reads in training (``ModelConfig.outcome_reads_contexts``): the logged
    A_{t+1}[:n_endo] (``A_after``, aligned with step t) where ``logged`` [..] is 1 (teacher forcing), the context
    head's detached Â_{t+1} where the log has no step t+1; None where the decoder reads no contexts."""
    if not model.outcome_reads_contexts:
        return None
    with torch.no_grad():  # detached: and no activation kept for Opacus' hooks, whose backward would pop it
        gen = model.next_context(K, A, T, None)
    return torch.where(logged.unsqueeze(-1) > 0, A_after[..., : model.n_endogenous], gen)


def _after(x: torch.Tensor) -> torch.Tensor:
    """x shifted one step back along axis 1 (x_{t+1} at t), zero-padded at the end."""
    return torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], 1)


def _w(v: torch.Tensor, W: torch.Tensor | None) -> torch.Tensor:
    return v if W is None else v * W


def l_recon(model: FedCausalDiff, K: torch.Tensor, batch: Batch, W: torch.Tensor | None = None) -> torch.Tensor:
    """L_recon = E_t[−log P_φ(Y_t | K_t, A_t, T_t)] over valid steps (Phase A + C, "trajectory reconstruction").

    Our reading: the encoder's K_t (history before T_t) must let the decoder reproduce the factual outcome; the
    next-step inputs are not reconstructed separately (K_{t+1} is the diffusion's target, which covers it).
    """
    A, T, M = batch.A, batch.T, batch.M
    nxt = teacher_contexts(model, K, A, T, _after(A), M * _after(M))
    return masked_mean(_w(outcome_nll(model, K, A, T, batch.Y, nxt), W), M)


def l_diff(model: FedCausalDiff, K: torch.Tensor, batch: Batch, W: torch.Tensor | None = None) -> torch.Tensor:
    """L_diff = E_{t,n,ε} ‖ε − (ε_c(K^(n)_{t+1}, n, K_t, A_t, T_t) + ε_s(K^(n)_{t+1}, n, K_t, A_t))‖² (eq. 1).

    Over pairs (t, t+1) that are both valid; ``cfg.diff_samples`` diffusion steps n per pair, kept as an extra
    axis ``[B, L−1, S, k]`` (never folded into the batch axis, which would make Opacus count each copy as a person:
    S clipped gradients per record, sensitivity S·C, ε under-reported). Target and condition are the encoder's K, detached: the score networks follow the encoder
    (latent-diffusion convention) instead of pulling it toward an easy-to-denoise collapse.

    For the deterministic g-formula baseline the same slot holds ‖K_{t+1} − f(K_t, A_t, T_t)‖². With
    ``cfg.transition_given_y`` the nets also read the logged Y_t; the pair (t, t+1) carries step t's weight.
    """
    A, T, M = batch.A, batch.T, batch.M
    cfg = model.cfg
    B, L, k = K.shape
    if L < 2:
        return K.sum((1, 2)) * 0.0
    pair = M[:, :-1] * M[:, 1:]
    wt = None if W is None else W[:, :-1]
    Yt = batch.Y[:, :-1] if cfg.transition_given_y else None
    Kt, Kn = K[:, :-1].detach(), K[:, 1:].detach()
    if cfg.transition == "deterministic":
        pred = model.transition(Kt, A[:, :-1], T[:, :-1], y=Yt)
        return masked_mean(_w(((pred - Kn) ** 2).mean(-1), wt), pair)
    S = cfg.diff_samples
    shp = (B, L - 1, S)
    n = torch.randint(0, cfg.diffusion_steps, shp)
    eps = torch.randn(*shp, k)
    x_n = model.schedule.q_sample(Kn.unsqueeze(2).expand(*shp, k), n, eps)
    pred = model.eps(
        x_n,
        n,
        Kt.unsqueeze(2).expand(*shp, k),
        A[:, :-1].unsqueeze(2).expand(*shp, A.shape[-1]),
        T[:, :-1].unsqueeze(2).expand(*shp),
        None if Yt is None else Yt.unsqueeze(2).expand(*shp),
    )
    return masked_mean(_w(((pred - eps) ** 2).mean((-1, -2)), wt), pair)


def _rbf(a: torch.Tensor, b: torch.Tensor, bw: float) -> torch.Tensor:
    return torch.exp(-torch.cdist(a, b) ** 2 / (2 * bw * bw))


def mmd2(a: torch.Tensor, b: torch.Tensor, bw: float) -> torch.Tensor:
    """Biased (V-statistic) squared MMD with an RBF kernel."""
    return _rbf(a, a, bw).mean() + _rbf(b, b, bw).mean() - 2 * _rbf(a, b, bw).mean()


def reference_points(k: int, n: int = 64, seed: int = 1234) -> torch.Tensor:
    """A fixed, data-free reference set for the DP form of L_align (drawn from N(0, 0.5²) and clipped to the tanh box)."""
    g = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(n, k, generator=g)).clamp(-0.99, 0.99)


def l_align_batch(model: FedCausalDiff, Kc: torch.Tensor, batch: Batch) -> torch.Tensor:
    """L_align (batch form) = Σ_a w_a · MMD²({K^(c)_t : T_t = a}, {K^(c)_t : T_t ≠ a}), a scalar.

    Our reading of "MMD between factual and interventional representation distributions": the representation
    K^(c)_t, formed before the decision, should look the same in the steps that received action a and in those that
    did not (balancing, as CRN does adversarially), so that the shared transition and decoder extrapolate to
    interventions. w_a is a's share of the subsampled valid steps (``cfg.align_max_points`` of them). This term
    COUPLES SAMPLES and must not be used under DP-SGD.
    """
    T, M = batch.T, batch.M
    cfg = model.cfg
    idx = torch.nonzero(M.reshape(-1) > 0).squeeze(1)
    if idx.numel() < 4:
        return Kc.sum() * 0.0
    if idx.numel() > cfg.align_max_points:
        idx = idx[torch.randperm(idx.numel())[: cfg.align_max_points]]
    pts = Kc.reshape(-1, Kc.shape[-1])[idx]
    acts = T.reshape(-1)[idx]
    total = Kc.sum() * 0.0
    for a in torch.unique(acts).tolist():
        sel = acts == a
        n_a = int(sel.sum())
        if n_a < 2 or n_a > idx.numel() - 2:
            continue
        total = total + (n_a / idx.numel()) * mmd2(pts[sel], pts[~sel], cfg.align_bandwidth)
    return total


def l_align_reference(model: FedCausalDiff, Kc: torch.Tensor, batch: Batch) -> torch.Tensor:
    """L_align (DP form), per sample: E_t[k(K^(c)_t, K^(c)_t) − (2/|R|) Σ_r k(K^(c)_t, r)] against a fixed set R.

    The per-sample half of MMD²(P_Kc, R): every group (treated or not) is pulled toward the same data-free
    reference, an indirect alignment whose gradient for one record depends on that record only.
    """
    cfg = model.cfg
    R = reference_points(Kc.shape[-1])
    k_ref = torch.exp(-((Kc.unsqueeze(-2) - R) ** 2).sum(-1) / (2 * cfg.align_bandwidth**2)).mean(-1)
    return masked_mean(1.0 - 2.0 * k_ref, batch.M)


def l_dis(model: FedCausalDiff, Kc: torch.Tensor, Ks: torch.Tensor, batch: Batch) -> torch.Tensor:
    """L_dis = CE(D_c(GRL(K^(c)_t)), site) + CE(D_s(K^(s)_t), target), per sample.

    * D_c is the site discriminator in Θc behind the gradient-reversal layer: D_c learns to tell sites apart and
      the reversed gradient pushes K^(c) to hide the site. It MUST be shared: a site only ever sees
      its own label, so a site-local classifier would learn a constant and give K^(c) no signal; aggregated over
      sites by DSS it becomes a multi-site classifier.
    * D_s is the parallel head on K^(s) (Θs, no reversal), meant to make K^(s) carry the nuisance. By default it
      predicts the logged action T_t — the site's behaviour policy, which the hidden site-local confounder drives
      and which a site can learn alone (a site-label head in Θs would learn a constant for the same reason: locally it
      sees one label). ``dis_parallel_target='site'`` predicts the site label (the paper's wording). Measured on DKT-Synth
      default (3 seeds): 'action' gives better PEHE/ATE, although it drives K^(s) into tanh saturation (near-constant
      K^(s)); 'site' keeps K^(s) alive but its effects were worse.
    """
    T, M, site = batch.T, batch.M, batch.site
    cfg = model.cfg
    B, L = T.shape
    site_t = site.view(B, 1).expand(B, L)
    ce_c = F.cross_entropy(model.site_logits(Kc).transpose(1, 2), site_t, reduction="none")
    target = T if cfg.dis_parallel_target == "action" else site_t
    ce_s = F.cross_entropy(model.parallel_logits(Ks).transpose(1, 2), target, reduction="none")
    return masked_mean(ce_c + ce_s, M)


def l_cf(model: FedCausalDiff, K: torch.Tensor, batch: Batch, W: torch.Tensor | None = None) -> torch.Tensor:
    """L_cf = E_t (1/R) Σ_{r=1..R} −log P_φ(Y_{t+r} | K̂_{t+r}, A_{t+r}, T_{t+r}), K̂_t = K_t,
    K̂_{t+r} = transition(K̂_{t+r−1}, A_{t+r−1}, do(T_{t+r−1} = logged)).

    Our reading of the paper's L_cf as counterfactual consistency (Robins 1986; Hernán & Robins 2020, §3.4): when the simulated actions equal the logged ones, a
    multi-step rollout of the transition (not the encoder) must reproduce the logged outcomes — Y(a) = Y when
    a = the factual action. (The paper's literal wording is trivially zero for a left-to-right encoder.) The rollout
    uses the differentiable DDIM sampler with ``cfg.cf_sampler_steps`` steps, so gradients reach ε_c, ε_s and the
    decoder (and the encoder's starting K_t when ``cfg.cf_grad_to_encoder``). All start steps t run in parallel on the [B, L, k] grid.
    With ``cfg.transition_given_y`` each transition reads the logged Y (what do(logged T) yields, by consistency);
    the outcome at t+r carries step t+r's weight.
    """
    A, T, Y, M = batch.A, batch.T, batch.Y, batch.M
    cfg = model.cfg
    B, L, k = K.shape
    R = cfg.cf_horizon
    if L < 2:
        return K.sum((1, 2)) * 0.0
    Lp = L - 1  # start steps t = 0 .. L-2

    def pad(x: torch.Tensor) -> torch.Tensor:
        z = torch.zeros((B, R) + tuple(x.shape[2:]), dtype=x.dtype)
        return torch.cat([x, z], 1)

    Ap, Tp, Yp, Mp = pad(A), pad(T), pad(Y), pad(M)
    Ap1, Mp1 = _after(Ap), Mp * _after(Mp)  # the logged next contexts, where the decoder reads them
    Wp = None if W is None else pad(W)
    # by default the gradient also shapes the encoder's K_t so that the transition can carry it forward; the
    # detached variant only fits the transition and decoder to a fixed encoder (worse effects on DKT-Synth)
    Kh = K[:, :Lp] if cfg.cf_grad_to_encoder else K[:, :Lp].detach()
    total = torch.zeros(B)
    for r in range(1, R + 1):
        y_prev = Yp[:, r - 1 : r - 1 + Lp] if cfg.transition_given_y else None
        Kh = model.transition(Kh, Ap[:, r - 1 : r - 1 + Lp], Tp[:, r - 1 : r - 1 + Lp], sampler="ddim",
                              steps=cfg.cf_sampler_steps, y=y_prev)
        m = Mp[:, r : r + Lp] * M[:, :Lp]
        sl = slice(r, r + Lp)
        nxt = teacher_contexts(model, Kh, Ap[:, sl], Tp[:, sl], Ap1[:, sl], Mp1[:, sl])
        nll = outcome_nll(model, Kh, Ap[:, sl], Tp[:, sl], Yp[:, sl], nxt)
        total = total + masked_mean(_w(nll, None if Wp is None else Wp[:, r : r + Lp]), m)
    return total / R


def l_propensity(model: FedCausalDiff, h: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Cross-entropy of the site's behaviour model p̂(T_t | observed history) on the logged actions, per sample.

    Fitted on the detached trunk states, so it never shapes the representation; it only supplies the numerator of
    the stabilised weights of :func:`ipw_weights`.
    """
    ce = F.cross_entropy(model.propensity_logits(h).transpose(1, 2), batch.T, reduction="none")
    return masked_mean(ce, batch.M)


def weighs(cfg: ModelConfig, batch: Batch) -> bool:
    """Whether the likelihood terms of ``batch`` are inverse-propensity weighted: ``'step'``/``'cumulative'`` always
    (:func:`ipw_weights` refuses a batch without P), ``'auto'`` when the batch carries P, i.e. when
    :func:`~fcd_secure.model.training.training_view` kept the site's propensities."""
    if cfg.ipw == "off" or not batch.size:
        return False
    return cfg.ipw != "auto" or not bool(torch.isnan(batch.P).all())


@torch.no_grad()
def ipw_weights(model: FedCausalDiff, h: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Stabilised inverse-propensity weights ``[B, L]`` (no gradient), per sample.

    w_t = min(p̂(T_t | H_t) / P_t, c), with P_t the logged propensity of the taken action and p̂ the site's behaviour
    model on the observed history H_t. In the weighted population the action at t no longer depends on what the
    logging policy saw beyond H_t (a hidden confounder) but keeps its dependence on H_t; any function of H_t is a
    valid numerator (Robins, Hernán & Brumback 2000) and p̂ lowers the variance (``'step'`` and ``'auto'``).
    ``cfg.ipw = 'cumulative'`` takes the product over the last ``cfg.ipw_window`` steps (the whole past when 0),
    which also removes the evidence that PAST logged actions carry about the confounder — what a multi-step rollout
    under do(·) needs (Lim et al. 2018, RMSN); the product is truncated at c = ``cfg.ipw_clip`` as well.

    Raises:
        ValueError: a valid step has no logged propensity in (0, 1].
    """
    cfg = model.cfg
    T, M, P = batch.T, batch.M, batch.P
    valid = M > 0
    if bool(torch.isnan(P[valid]).any()) or bool((P[valid] <= 0).any()):
        raise ValueError("ipw needs a logged propensity in (0, 1] on every valid step (this data has none, or the "
                         "propensities were dropped before training)")
    p_hat = torch.softmax(model.propensity_logits(h), -1).gather(-1, T.unsqueeze(-1)).squeeze(-1)
    P = torch.where(valid, P, torch.ones_like(P))
    w = torch.where(valid, (p_hat / P).clamp(max=cfg.ipw_clip), torch.ones_like(P))
    if cfg.ipw != "cumulative":
        return w
    logw = torch.cumsum(torch.log(w), 1)
    k = cfg.ipw_window
    if 0 < k < logw.shape[1]:
        logw = logw - torch.cat([torch.zeros_like(logw[:, :k]), logw[:, :-k]], 1)
    return torch.exp(logw).clamp(max=cfg.ipw_clip)
