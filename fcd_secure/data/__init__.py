"""fcd_secure.data: the data layer (paper §IV-A). Import names from their modules:

- :mod:`.schema`: ``SiteDataset``, the one contract every layer stands on;
- :mod:`.spec` / :mod:`.preprocess`: ``DatasetSpec`` for a user's long-format table, the preprocessing pipeline,
  ``DataError``;
- :mod:`.paths`: ``default_data_dir``, the one rule for where the real datasets are read from;
- :mod:`.names`: the one registry of dataset names (what ``--dataset`` accepts, which carry ground truth);
- :mod:`.sources`: one module per dataset (Statics2011, ASSISTments 2009, Diabetes-130, Open Bandit, DKT-Synth),
  each declaring its name, its row of paper Table I, its loader and its presets;
- :mod:`.partition`: the Dirichlet non-IID split and the per-site train/test split;
- :mod:`.federated`: ``FederatedData`` and the one path from a pooled dataset to sites;
- :mod:`.registry`: ``load_federated(name, ...)``, the one entry point from a dataset name to sites;
- :mod:`.policy`: ``PolicyLike``, the declarative policies of ``policies/`` and the anchor actions;
- :mod:`.npz`: a built dataset on disk (``save_npz`` / ``load_npz``);
- :mod:`.dkt_synth`: the DKT-Synth oracle world with ground truth;
- :mod:`.tumour`: the tumour-growth oracle world (Geng et al. 2017) with ground truth;
- :mod:`.carryover`: the carry-over oracle world (treatment that helps at first and harms when held) with ground truth;
- :mod:`.worlds`: what the generated worlds share (config, common random numbers, sites, ground truth);
- :mod:`.cohorts`: which entities a site trains, validates and answers on, fixed by a site secret;
- :mod:`.moments`: standardisation statistics from additive sums (the secure round 0);
- :mod:`.formats`: readers for on-disk formats several loaders share;
- :mod:`.long_tables`: a federated dataset written back as one long-format table per site, with its spec
  (``fcd data export``).

Nothing is re-exported here, so that ``import fcd_secure.data.schema`` stays light (no torch, no loaders).
"""
