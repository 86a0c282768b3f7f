"""Command-line options → one validated ``RunConfig`` (``fcd run``, ``fcd train``, ``fcd ablate``, ``fcd config show``).

Layers, later ones winning (:func:`fcd_secure.config.build_config`):

1. the defaults of ``RunConfig``;
2. a config file (``--config FILE``, or the run folder's ``config.toml`` with ``--resume RUN_DIR``);
3. the preset (``--preset``; without a config file its default is ``default``; with one, only when given);
4. ``--set KEY=VALUE`` (any key, dotted as ``fcd config show`` prints it: ``--set model.hidden=32``), in the order
   given (a key set twice keeps its last value);
5. the named options given on the command line (``--rounds``, ``--dp-epsilon``...), and only those: an option left
   out never overrides the file or a ``--set``, and one given wins over a ``--set`` of the same key.

Every layer is validated once, as one ``RunConfig`` (:func:`fcd_secure.config.build_config`): an unknown ``--set``
key or a bad value is exit 2, naming the key, before any work starts.

A config file re-runs its run exactly, in a new run folder: its ``out`` and ``state_dir`` belong to the old run and
are dropped, so nothing is written into the old run's folder. Only ``--resume RUN_DIR`` (or ``--state-dir``
pointing at a state folder) continues a run in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fcd_secure.cli.envelope import CliError

if TYPE_CHECKING:  # pragma: no cover - fcd_secure.config imports pydantic and the model's config
    from fcd_secure.config import RunConfig

PRESET_HELP = "tiny (4 sites, about 45 s) | default (README run, ≤ 5 min on 2 cores) | paper (Table II length)"
SET_HELP = ("KEY=VALUE: set any config key, dotted as `fcd config show` prints it (e.g. model.hidden=32, "
            "federation.eval_every=2); repeatable. VALUE is JSON or TOML (null unsets), else a plain string. Applied "
            "after the preset and the config file, before the other options.")
#: the file of a run folder that re-runs (``--config``) or continues (``--resume``) the run
RUN_CONFIG_FILE = "config.toml"


@dataclass
class RunOptions:
    """What the command line said about a run; ``None`` means "not given" (the lower layers decide)."""

    preset: str | None = None
    config_file: Path | None = None
    resume: Path | None = None
    rounds: int | None = None
    sites: int | None = None
    clients_per_round: int | None = None
    seed: int | None = None
    dataset: str | None = None
    spec: tuple[Path, Path | str] | None = None  # (spec, table file or database URL)
    data_dir: Path | None = None
    gamma: float | None = None
    site_spread: float | None = None
    secure: bool | None = None
    sync: str | None = None
    eval_every: int | None = None
    state_dir: Path | None = None
    out: Path | None = None
    dp_epsilon: float | None = None
    dp_delta: float | None = None
    dp_clip: float | None = None
    dp_ledger_dir: Path | None = None
    policies: list[str] | None = None
    reference: str | None = None
    #: ``--set KEY=VALUE`` assignments, in command-line order (:func:`fcd_secure.config.settings_overrides`)
    settings: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def default_clients_per_round(n_sites: int, secure: bool, min_secure_sites: int) -> int:
    """Half the sites per round (paper Table II: 5 of 10), but never below the secure-aggregation minimum."""
    k = max(1, n_sites // 2)
    if secure:
        k = max(k, min(min_secure_sites, n_sites))
    return k


def _base(opts: RunOptions) -> "RunConfig | None":
    from fcd_secure.config import ConfigError, RunConfig  # noqa: PLC0415

    if opts.resume is not None and opts.config_file is not None:
        raise CliError("--resume and --config both name a config; give one", "USAGE")
    path = opts.config_file
    if opts.resume is not None:
        if not opts.resume.is_dir():
            raise CliError(f"{opts.resume}: no such run folder", hint="--resume takes the folder of an earlier run")
        path = opts.resume / RUN_CONFIG_FILE
        if not path.is_file():
            raise CliError(
                f"{opts.resume}: not a run folder (no {RUN_CONFIG_FILE})",
                hint="--resume takes the folder an earlier `fcd run` wrote (its --out)",
            )
    if path is None:
        return None
    try:
        base = RunConfig.load(path)
    except ConfigError as exc:
        raise CliError(str(exc), hint="`fcd config show` lists every key") from None
    if opts.resume is None:
        # the file's folders belong to the run that wrote it: a re-run gets its own
        base = base.model_copy(update={"out": None, "state_dir": None})
    return base


def _same(v: Any) -> Any:
    return v


#: option of :class:`RunOptions` -> (config section or None for the top level, key, conversion)
_NAMED: dict[str, tuple[str | None, str, Any]] = {
    "rounds": ("federation", "rounds", _same),
    "sites": ("data", "n_sites", _same),
    "clients_per_round": ("federation", "clients_per_round", _same),
    "seed": (None, "seed", _same),
    "dataset": ("data", "dataset", _same),
    "data_dir": ("data", "data_dir", str),
    "gamma": ("data", "gamma", _same),
    "site_spread": ("data", "site_spread", _same),
    "secure": ("federation", "secure_aggregation", bool),
    "sync": ("federation", "sync", _same),
    "eval_every": ("federation", "eval_every", _same),
    "state_dir": (None, "state_dir", str),
}


def resolve_config(opts: RunOptions) -> "RunConfig":
    """The run's config from :class:`RunOptions` (module docstring for the layers).

    Raises:
        CliError: an unreadable config file, a value that does not validate (named), or conflicting options.
    """
    from fcd_secure.config import ConfigError, build_config, settings_overrides  # noqa: PLC0415

    base = _base(opts)
    try:
        over = settings_overrides(opts.settings)
    except ConfigError as exc:
        raise CliError(str(exc), hint="`fcd config show` lists every key with its description") from None
    for section in ("data", "federation", "evaluation", "model"):
        over.setdefault(section, {})
    for section, values in opts.extra.items():
        over.setdefault(section, {}).update(values)
    fed, data = over["federation"], over["data"]
    for name, (section, key, convert) in _NAMED.items():  # each option given overrides exactly its key
        value = getattr(opts, name)
        if value is not None:
            (over if section is None else over[section])[key] = convert(value)
    if opts.spec is not None:
        data.update(dataset="spec", spec=str(opts.spec[0]), table=str(opts.spec[1]))
    dp: dict[str, Any] = {}
    if opts.dp_epsilon is not None:  # DP-SGD on every site with this lifetime cap
        dp.update(enabled=True, epsilon=opts.dp_epsilon)
    if opts.dp_delta is not None:
        dp["delta"] = opts.dp_delta
    if opts.dp_clip is not None:
        dp["clip"] = opts.dp_clip
    if opts.dp_ledger_dir is not None:
        dp["ledger_dir"] = str(opts.dp_ledger_dir)
    if dp:
        over.setdefault("dp", {}).update(dp)
    if opts.policies:
        over["evaluation"]["policies"] = [str(p) for p in opts.policies]
    if opts.reference is not None:
        over["evaluation"]["reference"] = opts.reference
    preset = opts.preset if (opts.preset is not None or base is not None) else "default"
    try:
        if "n_sites" in data and "clients_per_round" not in fed:
            # the number of sites changed: the sites per round follow it unless given (validated below)
            probe = build_config(preset, {**over, "federation": {**fed, "clients_per_round": 1}}, base=base)
            fed["clients_per_round"] = default_clients_per_round(
                probe.data.n_sites, probe.federation.secure_aggregation, probe.secagg.min_sites
            )
        cfg = build_config(preset, over, base=base)
    except ConfigError as exc:
        raise CliError(str(exc), hint="`fcd config show` lists every key with its description") from None
    out = opts.out if opts.out is not None else (Path(str(over["out"])) if over.get("out") else None)  # --set out=
    if opts.resume is not None:
        if out is not None and out.resolve() != opts.resume.resolve():
            raise CliError("--resume continues a run in its own folder; leave out --out", "USAGE")
        out = opts.resume
        # the fault injection of tests (federation.crash_after_round) is spent once the run is resumed
        cfg = cfg.model_copy(update={"federation": cfg.federation.model_copy(update={"crash_after_round": None})})
        if cfg.state_dir is None:
            cfg = cfg.model_copy(update={"state_dir": str(opts.resume / "state")})
    if out is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        out = Path("runs") / f"{stamp}-{cfg.data.dataset}-seed{cfg.seed}"
    return cfg.model_copy(update={"out": str(out)})
