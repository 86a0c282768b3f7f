"""One entry point from a dataset name to federated sites: ``load_federated`` (paper §IV-A and Table II).

The datasets are the sources of :mod:`fcd_secure.data.sources` (one module each). For data read from files the
pooled dataset is subsampled by preset, split into ``n_sites`` sites with the Dirichlet(α) rule drawn per entity, so
all chunks of one student/patient share a site (:func:`~fcd_secure.data.partition.site_assignment`), and cut into
train/test sets by :func:`~fcd_secure.data.federated.split_into_sites`. DKT-Synth generates its sites itself and
carries the ground truth (``FederatedData.oracle``). A user's own table goes through :func:`load_spec_federated`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fcd_secure.data.federated import FederatedData, split_into_sites
from fcd_secure.data.partition import site_assignment
from fcd_secure.data.inputs import dataset_from_input
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data import names
from fcd_secure.data.sources import SOURCES, DatasetSource, GeneratedSource
from fcd_secure.data.spec import DataError

__all__ = [
    "DATASETS",
    "PAPER_TABLE_I",
    "check_available",
    "check_world",
    "get_source",
    "load_federated",
    "load_pooled",
    "load_spec_federated",
]

_BY_NAME: dict[str, DatasetSource] = {s.name: s for s in SOURCES}
if len(_BY_NAME) != len(SOURCES):
    raise RuntimeError("two dataset sources share a name")  # a programming error, caught at import

#: Dataset names, in the order ``fcd data describe`` lists them.
DATASETS: tuple[str, ...] = tuple(_BY_NAME)
if DATASETS != names.DATASETS:  # the one list of names (data.names) and the loaders behind them agree
    raise ImportError(f"data.sources.SOURCES {DATASETS} differ from data.names.DATASETS {names.DATASETS}")

#: Paper Table I, "Datasets after preprocessing into the unified (X, A, T, Y)", for the datasets it lists.
PAPER_TABLE_I: Mapping[str, Mapping[str, int]] = {s.name: s.table_i for s in SOURCES if s.table_i is not None}
# data.names' two subsets are these filters of the sources: the generated worlds, the datasets with a Table I row
if names.GENERATED != tuple(s.name for s in SOURCES if isinstance(s, GeneratedSource)):
    raise ImportError(f"data.names.GENERATED {names.GENERATED} are not the generated sources")
if set(names.PAPER_DATASETS) != set(PAPER_TABLE_I):
    raise ImportError(f"data.names.PAPER_DATASETS {names.PAPER_DATASETS} are not the sources of Table I {tuple(PAPER_TABLE_I)}")
if names.DEFAULT not in DATASETS:
    raise ImportError(f"data.names.DEFAULT {names.DEFAULT!r} is not a dataset")


def get_source(name: str) -> DatasetSource:
    """The source of dataset ``name`` (case-insensitive).

    Raises:
        DataError: No such dataset; the message lists the names.
    """
    src = _BY_NAME.get(name.lower())
    if src is None:
        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}", field="dataset")
    return src


def check_available(name: str, data_dir: str | Path | None = None) -> Path | None:
    """Fail fast, before anything expensive starts, when dataset ``name`` cannot be read (nothing is loaded).

    Commands that load the data later, in other processes (``fcd run`` starts the sites in a Flower engine), call
    this first so that a missing folder is a usage error naming it, not a failed site.

    Args:
        name: One of :data:`DATASETS`.
        data_dir: The explicit data folder, or None (:func:`~fcd_secure.data.paths.default_data_dir`).

    Returns:
        The dataset's folder, or None for a generated dataset.

    Raises:
        DataError: Unknown dataset, or its folder (or the data folder) does not exist; the message names it.
    """
    return get_source(name).check(data_dir)


def check_world(
    name: str, world: Mapping[str, float] | None, *, n_sites: int = 10, alpha: float = 10.0, seed: int = 0,
    preset: str = "default", test_fraction: float = 0.2,
) -> None:
    """Fail fast when the generator options of a run (``DataSection.world_options``) cannot build dataset ``name``:
    an option of a dataset read from files, an option its generator does not take, or a value it cannot use (an
    effect horizon past the trajectories' end). Nothing is generated.

    Raises:
        DataError: The message and field name the option.
    """
    get_source(name).check_world(world, n_sites=n_sites, alpha=alpha, seed=seed, preset=preset,
                                 test_fraction=test_fraction)


def load_pooled(name: str, data_dir: str | Path | None = None) -> SiteDataset:
    """The pooled (unsplit, unscaled) dataset of a dataset read from files.

    Raises:
        DataError: Unknown or generated dataset (DKT-Synth has no pooled file), or missing files.
    """
    return get_source(name).pooled(data_dir)


def load_federated(
    name: str,
    n_sites: int = 10,
    alpha: float = 10.0,
    seed: int = 0,
    preset: str = "default",
    data_dir: str | Path | None = None,
    test_fraction: float = 0.2,
    standardize: bool = True,
    world: Mapping[str, float] | None = None,
) -> FederatedData:
    """Sites of dataset ``name`` (one of :data:`DATASETS`) as train/test pairs, anchors and a description.

    Every chunk of one student/patient (``meta['entity']``) lands on the same site and on the same side of that
    site's train/test split, so no test entity is seen in training anywhere. Continuous columns are z-scored with
    statistics pooled over all training sites' raw rows: fine in simulation; a deployment needs per-site or securely
    aggregated statistics (see :func:`~fcd_secure.data.federated.split_into_sites`).

    Args:
        name: One of :data:`DATASETS`.
        n_sites: Number of sites N (paper: 10).
        alpha: Dirichlet concentration of the split (paper: 10).
        seed: Seed of the subsample, the split and (DKT-Synth) the world; same arguments → same numbers.
        preset: Real data: "default"/"paper" keep everything, "small" a seeded subsample of 2,000 trajectories,
            "tiny" 300 (for tests). DKT-Synth: its preset ("tiny", "small", "default", "paper").
        data_dir: Folder of the real datasets; None: :func:`~fcd_secure.data.paths.default_data_dir`
            (``$FCD_DATA_DIR``, then ``../shared/data``). Not used by DKT-Synth.
        test_fraction: Share of each site's trajectories in its test set.
        standardize: ``False``: unscaled sites (statistics agreed under secure aggregation instead).
        world: Options of a generated world beyond its preset (the tumour world's ``gamma``); a dataset read from
            files, or an option its generator does not take, is a ``DataError``.

    Returns:
        The federated dataset.

    Raises:
        DataError: Unknown dataset or preset, missing files, or a split that cannot be made (the message says which).
    """
    return get_source(name).federated(n_sites, alpha, seed, preset, data_dir, test_fraction, standardize,
                                      world=world)


def load_spec_federated(
    spec_path: str | Path,
    table_path: str | Path,
    n_sites: int = 10,
    alpha: float = 10.0,
    seed: int = 0,
    test_fraction: float = 0.2,
    standardize: bool = True,
    secrets: list[bytes] | None = None,
) -> FederatedData:
    """A user's own long-format table as federated sites.

    Sites come from the spec's ``site`` column when it names one (``n_sites`` and ``alpha`` are then ignored; sites
    are in the order of ``spec.sites`` or sorted by name), else from the Dirichlet split.

    Args:
        spec_path: The ``DatasetSpec`` file (TOML/YAML).
        table_path: The long-format table (CSV, CSV.gz, Parquet).
        n_sites: Number of sites of the Dirichlet split.
        alpha: Dirichlet concentration.
        seed: Seed of the split.
        test_fraction: Share of each site's trajectories in its test set.
        standardize: ``False``: unscaled sites (statistics agreed under secure aggregation instead).
        secrets: Each site's split secret (a deployed site's own, :func:`~fcd_secure.data.cohorts.site_secret`);
            default: the simulated sites' (:mod:`fcd_secure.data.cohorts`).

    Returns:
        The federated dataset.

    Raises:
        DataError: Every error names the file and the column/row or spec field.
    """
    spec, pooled = dataset_from_input(spec_path, table_path)
    names: list[str] | None = None
    if spec.site:
        site_of = pooled.meta["site"]
        names = list(pooled.meta["site_names"])
        for i, s_name in enumerate(names):
            k = int((site_of == i).sum())
            if k < 2:
                raise DataError(
                    f"site '{s_name}' has {k} trajectory; a site needs at least 2 (train and test)",
                    file=table_path, column=spec.site,
                )
        n_sites = len(names)
    else:
        site_of = site_assignment(pooled, n_sites, alpha, seed)
    extra = {"alpha": None if spec.site else alpha, "seed": seed, "preset": "spec", "test_fraction": test_fraction}
    return split_into_sites(
        spec.name, pooled, site_of, n_sites, test_fraction, seed, extra, site_names=names, standardize=standardize,
        secrets=secrets,
    )
