"""Everything a run needs, checked before any engine starts (``fcd run``): bad input is exit 2, naming the file,
column, row or field, and nothing is written (no run folder, no keys, no ledgers).

The checks reuse the layers' own validation, so a message is the same as the one ``fcd data validate`` prints for the
same table:

* the data: an unknown dataset name or a missing data folder (``fcd_secure.data.registry.check_available``), a
  generated world's options it cannot be built with (``registry.check_world``: an effect horizon past the end); a
  user's spec and table, read and split exactly as the sites will (``registry.load_spec_federated``), including the
  size check of ``max_len`` before anything is allocated;
* the sites: a table with a site column decides the number of sites (``--sites`` must agree); the sites per round
  default to half of them, never below the secure-aggregation minimum (``[secagg] min_sites``, P10);
* the evaluation: with the sites' test splits as the run will cut them (``federation.learner.load_federated``, cached
  for the run), enough sites hold at least the evaluation cohort floor of test rows to report a result (every site
  declines a smaller split; secure mode needs ``[secagg] min_sites`` of them) — else exit 2 naming the settings to
  change, before any training (:func:`check_evaluation`);
* the policies the final evaluation reads (``fcd_secure.data.policy.default_policies``);
* the aggregation flow's own refusals (``fcd_secure.federation.flows.check_flow``);
* the folders: ``--out`` and ``--state-dir`` must be folders that can be created or written, and a run never writes
  into another run's folder unless asked to continue it (``--resume``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from fcd_secure.cli.envelope import CliError
from fcd_secure.cli.resolve import RUN_CONFIG_FILE, RunOptions, default_clients_per_round
from fcd_secure.errors import first_invalid

if TYPE_CHECKING:  # pragma: no cover
    from fcd_secure.config import RunConfig
    from fcd_secure.data.policy import Policy

#: What marks a folder as holding a run (written by ``fcd run``).
RUN_MARKERS = (RUN_CONFIG_FILE, "summary.json", "rounds.csv", "state")


def _data_error(exc, hint: str) -> CliError:
    return CliError(str(exc), "BAD_INPUT", hint=hint, data=exc.to_dict())


def check_data(cfg: "RunConfig", opts: RunOptions) -> "RunConfig":
    """The data of the run can be read; for a user's table, the sites come from it. Returns the (updated) config.

    Raises:
        CliError: exit 2, naming the file and the column, row or field.
    """
    from fcd_secure.data import registry  # noqa: PLC0415
    from fcd_secure.data.inputs import load_dataset_spec  # noqa: PLC0415
    from fcd_secure.data.spec import DataError  # noqa: PLC0415

    d = cfg.data
    if d.dataset != "spec":
        try:
            registry.check_available(d.dataset, d.data_dir)
        except DataError as exc:
            raise _data_error(exc, "pass --data-dir DIR or set $FCD_DATA_DIR; `fcd data describe` lists the datasets")
        try:
            registry.check_world(d.dataset, d.world_options(), n_sites=d.n_sites, alpha=d.alpha, seed=cfg.seed,
                                 preset=d.preset, test_fraction=d.test_fraction)
        except DataError as exc:
            raise _data_error(exc, "`fcd config show` lists the [data] keys; data.gamma, data.effect_horizon "
                                   "and data.site_spread apply to the generated worlds") from None
        return cfg
    hint = f"`fcd data validate --spec {d.spec} --table {d.table}` checks the table alone"
    try:
        spec = load_dataset_spec(d.spec)
        fd = registry.load_spec_federated(
            d.spec, d.table, n_sites=d.n_sites, alpha=d.alpha, seed=cfg.seed, test_fraction=d.test_fraction
        )
    except DataError as exc:
        raise _data_error(exc, hint) from None
    if not spec.site:
        return cfg
    n = int(fd.n_sites)
    names = [str(ds.meta.get("site_name")) for ds in fd.train if ds.meta.get("site_name") is not None]
    listed = f" ({', '.join(map(str, names))})" if names else ""
    if opts.sites is not None and opts.sites != n:
        raise CliError(
            f"{d.table}: column '{spec.site}' names {n} sites{listed}, but --sites is {opts.sites}",
            hint="leave out --sites: a table with a site column decides the sites",
            data={"file": d.table, "column": spec.site, "sites": n},
        )
    sec = cfg.federation.secure_aggregation
    if sec and n < cfg.secagg.min_sites:
        raise CliError(
            f"{d.table}: column '{spec.site}' names {n} sites{listed}; secure aggregation needs at least "
            f"{cfg.secagg.min_sites} sites per round (P10: with fewer, one site's update follows by subtraction)",
            hint="add sites, or run with --no-secure-aggregation",
            data={"file": d.table, "column": spec.site, "sites": n},
        )
    k = cfg.federation.clients_per_round
    if opts.clients_per_round is not None and opts.clients_per_round > n:
        raise CliError(
            f"--clients-per-round {opts.clients_per_round} is more than the {n} sites of column '{spec.site}' "
            f"in {d.table}",
            hint=f"at most {n}",
            data={"file": d.table, "column": spec.site, "sites": n},
        )
    if opts.clients_per_round is None and (n != d.n_sites or k > n):
        k = default_clients_per_round(n, sec, cfg.secagg.min_sites)
    return cfg.model_copy(
        update={
            "data": d.model_copy(update={"n_sites": n}),
            "federation": cfg.federation.model_copy(update={"clients_per_round": k}),
        }
    )


def check_evaluation(cfg: "RunConfig") -> None:
    """Enough sites can evaluate for the run to report a result: a site declines a test split below the evaluation
    cohort floor (``federation.site_policy.MIN_COHORT_FLOOR``), and in secure mode the secure sum needs
    ``[secagg] min_sites`` sites that do not decline.

    Raises:
        CliError: exit 2, naming the small sites and the settings that change them.
    """
    from fcd_secure.data.spec import DataError  # noqa: PLC0415
    from fcd_secure.federation import learner  # noqa: PLC0415
    from fcd_secure.federation.site_policy import MIN_COHORT_FLOOR  # noqa: PLC0415

    try:
        sizes = [ds.n for ds in learner.load_federated(cfg).test]
    except DataError as exc:
        raise _data_error(exc, "`fcd data describe` shows the sites of a dataset") from None
    able = sum(n >= MIN_COHORT_FLOOR for n in sizes)
    need = cfg.secagg.min_sites if cfg.federation.secure_aggregation else 1
    if able >= need or able == len(sizes):  # enough; or too few sites at all, which check_flow names
        return
    small = ", ".join(f"site-{i:02d}: {n}" for i, n in enumerate(sizes) if n < MIN_COHORT_FLOOR)
    raise CliError(
        f"the run could not evaluate: {len(sizes) - able} of {len(sizes)} sites would hold fewer than "
        f"{MIN_COHORT_FLOOR} test rows ({small}), which a site declines to evaluate"
        + (f", and secure aggregation needs {need} sites that evaluate" if need > 1 else ""),
        hint=f"raise data.test_fraction (now {cfg.data.test_fraction:g}), run fewer sites (--sites, now "
             f"{cfg.data.n_sites}) or use more data",
        data={"test_rows": sizes, "floor": MIN_COHORT_FLOOR, "sites_needed": need},
    )


#: the hint of every refused policy file
POLICY_HINT = "policies/README.md shows the format of a policy file"


def check_policy_files(cfg: "RunConfig") -> "list[Policy]":
    """The target policies the final evaluation reads (``--policy``, ``[evaluation] policies``, else the paper's
    four) load and validate, and name a reference among them. Reads only the policy files (no data, no torch), so a
    typo in one is refused first.

    Raises:
        CliError: exit 2, naming the policy file and field.
    """
    from fcd_secure.data.spec import DataError  # noqa: PLC0415
    from fcd_secure.queries.request import request_from_config  # noqa: PLC0415

    try:
        return request_from_config(cfg).policies
    except DataError as exc:
        raise _data_error(exc, POLICY_HINT) from None


def check_policies(cfg: "RunConfig", policies: "list[Policy]") -> None:
    """The policies of :func:`check_policy_files` use only the data's action labels and context columns.

    Raises:
        CliError: exit 2, naming the policy file and field.
    """
    from fcd_secure.data.spec import DataError  # noqa: PLC0415
    from fcd_secure.queries.vocabulary import bind_policies  # noqa: PLC0415

    try:
        bind_policies(cfg, policies)
    except DataError as exc:
        raise _data_error(exc, POLICY_HINT) from None


def check_flow(cfg: "RunConfig") -> None:
    """The aggregation flow accepts the configuration (secure aggregation: Θc only, enough sites per round).

    Raises:
        CliError: exit 2.
    """
    from fcd_secure.federation.flows import check_flow as flow_check  # noqa: PLC0415
    from fcd_secure.federation.secure.setup import SecureAggregationConfigError  # noqa: PLC0415

    try:
        flow_check(cfg)
    except SecureAggregationConfigError as exc:
        raise CliError(str(exc), hint="`fcd config show` lists the [secagg] and [federation] keys") from None


def writable_folder(path: Path, option: str) -> None:
    """``path`` is a folder that exists and can be written, or can be created (nothing is created here).

    Raises:
        CliError: exit 2: a file where a folder should be, or a folder that cannot be written.
    """
    if path.exists():
        if not path.is_dir():
            raise CliError(f"{path}: {option} names a file, not a folder", hint=f"give {option} a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise CliError(f"{path}: {option} folder is not writable", hint=f"give {option} a folder you can write")
        return
    anc = path.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise CliError(f"{path}: {option} cannot be created: {anc} is a file", hint=f"give {option} a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise CliError(f"{path}: {option} cannot be created: {anc} is not writable",
                       hint=f"give {option} a folder you can write")


def holds_run(folder: Path) -> str | None:
    """The first :data:`RUN_MARKERS` entry in ``folder``, or ``None`` when it holds no run."""
    for name in RUN_MARKERS:
        if (folder / name).exists():
            return name
    return None


def check_folders(cfg: "RunConfig", opts: RunOptions) -> None:
    """``--out``, ``--state-dir`` and ``--dp-ledger-dir`` can be written; another run's folder is never reused.

    Raises:
        CliError: exit 2.
    """
    out = Path(str(cfg.out))
    writable_folder(out, "--out")
    marker = holds_run(out) if out.is_dir() else None
    # continuing a run in its folder is asked for by --resume, or by --state-dir naming that folder's state
    resuming = opts.resume is not None or (
        opts.state_dir is not None and opts.state_dir.resolve() == (out / "state").resolve()
    )
    if marker and not resuming:
        raise CliError(
            f"{out}: already holds a run ({marker}); a run never writes into another run's folder",
            hint=f"choose another --out, or continue that run with `fcd run --resume {out}`",
        )
    if cfg.state_dir:
        writable_folder(Path(cfg.state_dir), "--state-dir")
    if cfg.dp.ledger_dir:
        writable_folder(Path(cfg.dp.ledger_dir), "--dp-ledger-dir")


def check_run(cfg: "RunConfig", opts: RunOptions) -> "RunConfig":
    """Every check of the module docstring, in order; returns the config with the sites a table decides.

    Raises:
        CliError: exit 2, before anything is written.
    """
    from fcd_secure.config import RunConfig  # noqa: PLC0415
    from pydantic import ValidationError  # noqa: PLC0415

    check_folders(cfg, opts)  # the cheapest first: a wrong --out fails before any data is read
    policies = check_policy_files(cfg)  # a typo in a policy file is refused before the data (and torch) load
    cfg = check_data(cfg, opts)
    try:  # the sites a table decides must still agree with the rest of the config (federation.min_replies, ...)
        cfg = RunConfig.model_validate(cfg.model_dump())
    except ValidationError as exc:
        loc, msg = first_invalid(exc)
        raise CliError(f"field {loc}: {msg}") from None
    check_policies(cfg, policies)
    check_flow(cfg)  # too few sites for secure aggregation is its own error, named first
    check_evaluation(cfg)
    check_behaviour_model(cfg)
    return cfg


def check_behaviour_model(cfg: "RunConfig") -> None:
    """A shared behaviour model (``evaluation.behaviour_model = "shared"`` or ``"shared_slopes"``) fits the data: its
    coefficients are at most ``evaluation.propensity.MAX_SHARED_COEFS`` (the egress gate's cap on the Hessian's sums).

    Raises:
        CliError: exit 2, naming the setting and the count.
    """
    if not cfg.evaluation.shares_behaviour_model:
        return
    from fcd_secure.evaluation.propensity import SharedFitError, check_shared_size  # noqa: PLC0415
    from fcd_secure.federation import learner  # noqa: PLC0415

    ds = learner.load_federated(cfg).train[0]
    try:
        check_shared_size(ds.n_actions, ds.da, ds.dx)
    except SharedFitError as exc:
        raise CliError(f"evaluation.behaviour_model = {cfg.evaluation.behaviour_model!r}: {exc}",
                       hint="set evaluation.behaviour_model = 'site' (each site's own model)") from None
