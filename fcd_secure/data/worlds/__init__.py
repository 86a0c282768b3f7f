"""What the two generated oracle worlds share: DKT-Synth (:mod:`fcd_secure.data.dkt_synth`) and the tumour world
(:mod:`fcd_secure.data.tumour`).

Both are built the same way: a known structural model, a logging policy with time-varying confounding of strength γ
and a propensity floor ε, sites that are a *cause* of the data (drawn before any entity exists), lengths drawn
independently of treatment, and common random numbers so that every counterfactual arm of an entity shares the
entity's noise. What each world writes is only its own mechanism (the DKT oracle and its tutor; the PK-PD model and
its clinic); everything else is written once here:

- :mod:`.config`: ``WorldConfig``, the fields, checks and presets every world's config has;
- :mod:`.noise`: the common-random-number plumbing (per-entity streams, counter-based fresh numbers, the
  rollout-major layout of rollout noise);
- :mod:`.generation`: sites by the project's Dirichlet rule, lengths, the padding mask, and the per-site train/test
  datasets and anchors by the project's rules;
- :mod:`.world`: ``OracleWorld``, the ground-truth interface the rest of the code uses (``true_effects``,
  ``true_policy_value``, ``replay_logged``, ``logging_propensities``, ``anchor_contrasts``, ``describe``), with the
  validation, batching and bookkeeping of those queries; a world supplies the kernels;
- :mod:`.horizons`: ``HorizonSums``, a policy rollout's value at several horizons from one pass (the kernels').
"""
