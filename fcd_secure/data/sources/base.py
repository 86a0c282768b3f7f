"""What a dataset source declares, and how a pooled (real) dataset becomes federated sites.

A source is one module of :mod:`fcd_secure.data.sources` holding one ``SOURCE``:

- :class:`PooledSource`: a loader returns the whole dataset as one unscaled ``SiteDataset`` (real data, which carries
  no site id); the registry subsamples it by preset, draws a site per entity with the Dirichlet rule
  (:func:`~fcd_secure.data.partition.site_assignment`) and cuts it with
  :func:`~fcd_secure.data.federated.split_into_sites`;
- :class:`GeneratedSource`: a generator makes its own sites (DKT-Synth, whose site is a cause of the data).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np

from fcd_secure.data.federated import FederatedData, split_into_sites
from fcd_secure.data.partition import site_assignment
from fcd_secure.data.paths import dataset_folder
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.spec import DataError

__all__ = ["REAL_PRESETS", "WORLD_OPTIONS", "DatasetSource", "GeneratedSource", "PooledSource"]

#: The options of a generated world with ground truth (``DataSection.world_options``) → its config's field.
WORLD_OPTIONS: Mapping[str, str] = MappingProxyType({"gamma": "gamma", "effect_horizon": "horizon",
                                                     "site_spread": "site_spread"})

#: Trajectories kept (a seeded subsample of the pooled data) per preset of a real dataset; None keeps all.
REAL_PRESETS: Mapping[str, int | None] = MappingProxyType({"tiny": 300, "small": 2000, "default": None, "paper": None})

_SALT_SUBSAMPLE = 0x5EED_0003


def _check_preset(name: str, preset: str, presets: Mapping[str, object] | tuple[str, ...]) -> None:
    if preset not in presets:
        raise DataError(f"unknown preset {preset!r} for {name}; choose one of {sorted(presets)}", field="preset")


@dataclass(frozen=True)
class PooledSource:
    """A dataset read from files as one pooled ``SiteDataset`` and split into sites by the registry.

    Attributes:
        name: The name users pass (``--dataset``).
        load: ``load(data_dir) -> SiteDataset``: the pooled, unscaled dataset; ``data_dir`` None means
            :func:`~fcd_secure.data.paths.default_data_dir`.
        folder: The dataset's folder inside the data folder.
        presets: Trajectories kept per preset (None: all); the real datasets use :data:`REAL_PRESETS`.
        table_i: The dataset's row of paper Table I (sequences, Lmax, dx, da, n_actions); None if it has none.
        chunk_len: Lmax of the presets that cut the entities into shorter chunks than ``load``'s default (Table I's),
            before the subsample: ``load(data_dir, max_len=chunk_len[preset])``. A smaller preset keeps the
            per-site test splits above the evaluation's cohort floor with fewer steps in all.
    """

    name: str
    load: Callable[..., SiteDataset]
    folder: str
    presets: Mapping[str, int | None]
    table_i: Mapping[str, int] | None = None
    chunk_len: Mapping[str, int] = field(default_factory=dict)

    def check(self, data_dir: str | Path | None = None) -> Path | None:
        """The dataset's folder, after checking that it exists (cheap: nothing is read).

        Raises:
            DataError: The data folder or the dataset's folder is missing; the message names it.
        """
        return dataset_folder(data_dir, self.folder)

    def check_world(self, world: Mapping[str, float] | None, **_: object) -> None:
        """Data read from files has no generator: any ``world`` option is refused.

        Raises:
            DataError: ``world`` holds an option; the message names it.
        """
        if world:
            raise DataError(f"{self.name} is read from files: generator options {sorted(world)} do not apply",
                            field=sorted(world)[0])

    def pooled(self, data_dir: str | Path | None = None) -> SiteDataset:
        """The whole dataset, unsplit and unscaled."""
        return self.load(data_dir)

    def subsample(self, ds: SiteDataset, preset: str, seed: int) -> SiteDataset:
        """A seeded subsample of ``ds`` of the preset's size (``ds`` itself when the preset keeps everything)."""
        _check_preset(self.name, preset, self.presets)
        keep = self.presets[preset]
        if keep is None or ds.n <= keep:
            return ds
        rng = np.random.default_rng([_SALT_SUBSAMPLE, int(seed)])
        idx = np.sort(rng.choice(ds.n, size=keep, replace=False))
        out = ds.subset(idx)
        out.meta["subsample"] = {"preset": preset, "kept": keep, "of": ds.n}
        return out

    def federated(
        self, n_sites: int, alpha: float, seed: int, preset: str, data_dir: str | Path | None, test_fraction: float,
        standardize: bool = True, world: Mapping[str, float] | None = None,
    ) -> FederatedData:
        """Load, subsample by ``preset``, draw a site per entity (Dirichlet(``alpha``)) and split into sites
        (``standardize=False``: unscaled, see :func:`~fcd_secure.data.federated.split_into_sites`).

        Raises:
            DataError: ``world`` options are given (data read from files has no generator to pass them to).
        """
        self.check_world(world)
        _check_preset(self.name, preset, self.presets)
        loaded = self.load(data_dir, max_len=self.chunk_len[preset]) if preset in self.chunk_len else self.load(data_dir)
        pooled = self.subsample(loaded, preset, seed)
        # the rule of partition.dirichlet_partition (one site per entity, chunks follow their entity), applied as
        # indices so the big arrays are copied only once
        site_of = site_assignment(pooled, n_sites, alpha, seed)
        extra = {"alpha": alpha, "seed": seed, "preset": preset, "test_fraction": test_fraction}
        return split_into_sites(
            self.name, pooled, site_of, n_sites, test_fraction, seed, extra, table_i=self.table_i, standardize=standardize
        )


@dataclass(frozen=True)
class GeneratedSource:
    """A dataset generated with its sites (and ground truth), so it has no pooled file.

    Attributes:
        name: The name users pass (``--dataset``).
        configure: The generator config's constructor, ``configure(preset, n_sites=, dirichlet_alpha=, seed=,
            test_fraction=, **world)``; it raises ``ValueError`` for an impossible value.
        build: ``build(config) -> FederatedData``: generate the world of ``config`` and describe its sites.
        table_i: The dataset's row of paper Table I.
        presets: The preset names ``configure`` accepts.
        options: The generator options a run may set beyond its preset (``DataSection.world_options``), each
            mapped to the generator config's field it sets (``effect_horizon`` → ``horizon``).
        unrecorded_confounding: The world's hidden confounder in words, where its logging policy reads something
            its logs do not record (a run with γ = 0 removes it: the logging policy then ignores it).
    """

    name: str
    configure: Callable[..., object]
    build: Callable[..., FederatedData]
    table_i: Mapping[str, int] | None = None
    presets: tuple[str, ...] = ()
    options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    unrecorded_confounding: str | None = None

    def check(self, data_dir: str | Path | None = None) -> Path | None:
        """Nothing to check: a generated dataset reads no data folder (None)."""
        return None

    def pooled(self, data_dir: str | Path | None = None) -> SiteDataset:
        """Always raises: a generated dataset has no pooled file.

        Raises:
            DataError: Always.
        """
        raise DataError(f"{self.name} has no pooled file: it is generated per site (use load_federated)",
                        field="dataset")

    def federated(
        self, n_sites: int, alpha: float, seed: int, preset: str, data_dir: str | Path | None, test_fraction: float,
        standardize: bool = True, world: Mapping[str, float] | None = None,
    ) -> FederatedData:
        """Generate the sites (``data_dir`` is not used; the generator's features are on their own scale, so
        ``standardize`` changes nothing); ``world`` holds generator options beyond the preset.

        Raises:
            DataError: An option this generator does not take (the message names it), or a bad preset.
        """
        config = self.check_world(world, n_sites=n_sites, alpha=alpha, seed=seed, preset=preset,
                                  test_fraction=test_fraction)
        return self.build(config)

    def check_world(
        self, world: Mapping[str, float] | None, *, n_sites: int = 10, alpha: float = 10.0, seed: int = 0,
        preset: str = "default", test_fraction: float = 0.2,
    ) -> object:
        """The generator config of these sites and ``world`` options, checked before anything is generated (cheap:
        ``fcd run`` calls it before any site starts).

        Raises:
            DataError: A bad preset, an option this generator does not take, or a value it cannot use (the field is
                the option the config's message names, else ``preset``).
        """
        _check_preset(self.name, preset, self.presets)
        world = dict(world or {})
        unknown = sorted(set(world) - set(self.options))
        if unknown:
            raise DataError(f"{self.name}: no generator option {unknown[0]!r} (it takes {sorted(self.options) or 'none'})",
                            field=unknown[0])
        try:
            return self.configure(preset, n_sites=n_sites, dirichlet_alpha=alpha, seed=seed,
                                  test_fraction=test_fraction, **{self.options[k]: v for k, v in world.items()})
        except ValueError as exc:
            errors = getattr(exc, "errors", None)  # pydantic's ValidationError: its first error, not the dump
            first = errors()[0] if callable(errors) and errors() else {"msg": str(exc), "loc": ()}
            msg = str(first["msg"]).removeprefix("Value error, ")
            by_field = {f: k for k, f in self.options.items()}
            loc = [str(x) for x in first.get("loc", ())]
            # a field's own check names the field in ``loc``; a check across fields (anchor step + horizon past the
            # trajectories' end) has none, and its message names the fields it compares
            bad = next((by_field[x] for x in loc if x in by_field and by_field[x] in world), None)
            if bad is None and not loc:
                bad = next((k for k in world if re.search(rf"\b{self.options[k]}\b", msg)), None)
            where = f"{bad} = {world[bad]!r}: " if bad is not None else ""
            raise DataError(f"{self.name} ({preset}): {where}{msg}", field=bad or "preset") from None


DatasetSource = PooledSource | GeneratedSource
