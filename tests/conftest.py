"""Shared, generic fixtures: small long-format tables and specs written to tmp_path, the real data folder and a
tiny DKT-Synth site."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

# one BLAS/OpenMP thread per test process, as the README's test command sets (scripts/bootstrap.sh), also when pytest
# is started directly: OpenBLAS and torch read these once, when they load, so before numpy's import here. The golden
# run and its question run in the test's process (test_golden.py), and two BLAS threads move its answers (9th digit)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

if TYPE_CHECKING:  # the fixtures import the package when they run, not at collection
    from fcd_secure.config import RunConfig
    from fcd_secure.apps.server_app import FederationResult

# every Flower engine the tests start (in process or as a child) inherits this: tests never send telemetry
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"



#: the xdist group of every test that starts real Flower SuperLink/SuperNode processes
FLOWER_PROCESSES = "flower-processes"
#: the xdist group of the tests that use the one shared SuperLink (:func:`superlink`) and start no SuperNode: light
#: enough to run beside a full deployment, so not in :data:`FLOWER_PROCESSES`
FLOWER_SUPERLINK = "flower-superlink"


def pytest_configure(config):
    """Under ``--dist loadgroup`` the controller hands out work units in the order the workers collected them
    (``pytest_collection_modifyitems`` below) rather than largest group first: the longest units then start first and
    the short ones fill the end, so two workers finish together (longest-processing-time-first scheduling, Graham
    1969, "Bounds on multiprocessing timing anomalies", SIAM J. Appl. Math. 17(2))."""
    # pytest-xdist registers this marker itself; a run with -p no:xdist (and --strict-markers) needs it registered too
    config.addinivalue_line("markers", "xdist_group(name): run on one xdist worker, one test after another")
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist is loaded
        config.option.loadscopereorder = False


def _schedule_rank(item) -> int:
    """0: the Flower-process group (the longest serial unit), 1: a module sharing one expensive run (its own
    ``xdist_group``) or the shared SuperLink, 2: another end-to-end test marked ``slow``, 3: the rest (seconds or
    less each)."""
    if item.get_closest_marker("deployment") is not None and "superlink" not in item.fixturenames:
        return 0
    if item.get_closest_marker("xdist_group") is not None:
        return 1
    return 2 if item.get_closest_marker("slow") is not None else 3


def _group_names(item) -> str:
    """The work unit an item belongs to under ``--dist loadgroup``, joined as pytest-xdist joins it."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names))


def _tag_with_group(item, group: str) -> None:
    """Append ``@group`` to the item's node id, the suffix pytest-xdist's controller reads to keep a group on one
    worker. pytest-xdist 3.8 writes it to ``item._nodeid``, which pytest 9 no longer reads (the node id is the
    structured ``item._id``), so without this every test of a group is handed out on its own."""
    tagged = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):  # pytest >= 9
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(tagged)
    else:
        item._nodeid = tagged


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Tests that start real Flower SuperLink/SuperNode processes run one after another on one xdist worker: two at
    once on two cores starve each other's start-up deadlines. A module whose tests share one expensive module-scoped
    run marks those tests ``xdist_group``, so that run happens once, on one worker, not once per worker.

    On an xdist worker under ``--dist loadgroup`` each grouped item's node id carries its group
    (:func:`_tag_with_group`), and the items are ordered by :func:`_schedule_rank` (stable: each module keeps its
    order), the order the controller hands them out in (``pytest_configure``). A serial run keeps the file order.

    A ``deployment`` test whose only Flower process is the session's shared SuperLink (it asks for the
    :func:`superlink` fixture) goes to :data:`FLOWER_SUPERLINK` instead: one SuperLink and a few ``flwr`` commands
    beside a full deployment starve nobody, and the fixture is made once, on one worker."""
    for item in items:
        if item.get_closest_marker("deployment") is not None:
            shared_link = "superlink" in item.fixturenames
            item.add_marker(pytest.mark.xdist_group(FLOWER_SUPERLINK if shared_link else FLOWER_PROCESSES))
    if not hasattr(config, "workerinput"):
        return
    if config.getvalue("loadgroup"):
        for item in items:
            group = _group_names(item)
            if group and not item.nodeid.endswith(f"@{group}"):
                _tag_with_group(item, group)
    items.sort(key=_schedule_rank)


@pytest.fixture(scope="session")
def superlink(tmp_path_factory):
    """``fcd server start``'s SuperLink entry point (``_flower.superlink_main``) with TLS and
    ``--enable-supernode-auth`` on 127.0.0.1, launching nothing (``--isolation process``), one SuperNode key
    registered with Flower's own ``flwr supernode register``; yields ``(port, ca_cert, node_key)``. One per session:
    the tests that use it (P35, P51, P53, a port in use) only send it requests, none changes it."""
    import signal
    import socket
    import subprocess
    import sys
    import time

    from cryptography.hazmat.primitives import serialization
    from test_coordinator_host import _cli_home, _flwr

    from fcd_secure.engines.deployment import FLWR_IN_MEMORY, flower_env, free_port
    from fcd_secure.engines.pki import make_node_key, make_tls_dir

    tmp = tmp_path_factory.mktemp("superlink")
    pki = make_tls_dir(tmp / "pki", ("127.0.0.1", "localhost"))
    port = free_port()
    with open(tmp / "superlink.log", "wb") as log:
        p = subprocess.Popen(
            [sys.executable, "-m", "fcd_secure._flower.superlink_main", "--ssl-ca-certfile", str(pki / "ca.crt"),
             "--ssl-certfile", str(pki / "server.pem"), "--ssl-keyfile", str(pki / "server.key"), "--host", "127.0.0.1",
             "--port", str(port), "--database", FLWR_IN_MEMORY, "--isolation", "process", "--enable-supernode-auth"],
            stdout=log, stderr=subprocess.STDOUT, env=flower_env(tmp / "link-home"), start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert p.poll() is None, (tmp / "superlink.log").read_text()
                assert time.monotonic() < deadline, "the SuperLink did not open its port"
                time.sleep(0.2)
        make_node_key(tmp / "node.key", tmp / "node.pub")
        code, out = _flwr(_cli_home(tmp / "cli", port, pki / "ca.crt"), "supernode", "register", str(tmp / "node.pub"), "c")
        assert code == 0, out
        key = serialization.load_ssh_private_key((tmp / "node.key").read_bytes(), password=None)
        yield port, pki / "ca.crt", key
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # its own session: the SuperLink and anything it started
        p.wait()


#: small DKT-Synth (1,500 students) on 4 even sites, 2 rounds, every round scored (every site has ≥ 20 validation
#: and test students), secure aggregation (the default): the config of :func:`small_scored_run`. Its readers check
#: the round scores, the selection, the DR-learner and ``fcd select`` (none reads a policy's value), so the run's
#: closing what-if asks one policy, not the paper's four: each policy is a simulation and an oracle rollout per site
SMALL_SCORED = {"seed": 0, "data": {"preset": "small", "n_sites": 4, "alpha": 1000.0},
                "federation": {"clients_per_round": 4, "rounds": 2, "eval_every": 1},
                "evaluation": {"policies": ["never"]}}
#: the xdist group of every test that reads :func:`small_scored_run`: the run is made once, on one worker
SMALL_SCORED_RUN = "small-scored-run"
#: a run's closing evaluation where no assertion reads a policy's value (the tests compare Θc, the run folder, the
#: evidence, the printed lines): two policies (a reference and one contrast), one rollout each, at most 32 test rows
#: a site (above the sites' cohort floor of 20). The closing evaluation of the tiny preset's four policies × two
#: rollouts was 42 of a 3-round run's 65 s of federation (cProfile, tests/test_cli_run.py's run A, loaded machine)
CHEAP_EVALUATION = {"policies": ["never", "always"], "n_samples": 1, "max_rows": 32}


class ScoredRun(NamedTuple):
    cfg: RunConfig
    result: FederationResult
    state: Path
    out: Path


@pytest.fixture(scope="session")
def small_scored_run(tmp_path_factory) -> ScoredRun:
    """One in-process run of :data:`SMALL_SCORED` (Fed-CausalDiff's diffusion transition, the default), shared by the
    tests that read a scored secure run without changing it (``fcd select``'s diffusion variant, the DR-learner's
    secure fit, the selection's secure run in ``test_selection.py``): ``(cfg, result, state_dir, run_dir)``."""
    from fcd_secure.config import build_config
    from fcd_secure.engines.inprocess import run_inprocess

    root = tmp_path_factory.mktemp("small-scored")
    cfg = build_config("tiny", {**SMALL_SCORED, "state_dir": str(root / "state"), "out": str(root / "run")})
    return ScoredRun(cfg, run_inprocess(cfg), root / "state", root / "run")


def real_data() -> Path:
    """The data folder the loaders read (``fcd_secure.data.paths.default_data_dir``: ``$FCD_DATA_DIR``, else
    ``../shared/data`` of the checkout), or a skip that names why there is none. Every test that reads a real dataset
    goes through here, so on a machine without the data folder they skip with the reason instead of erroring;
    ``FCD_DATA_DIR=/nonexistent`` hides the folder to check it."""
    from fcd_secure.data.paths import default_data_dir
    from fcd_secure.data.spec import DataError

    try:
        return default_data_dir()
    except DataError as exc:
        pytest.skip(f"real datasets not present: {exc}")


GOOD_SPEC = """\
name = "toy"
entity = "pid"
time = "visit"
action = "drug"
actions = ["none", "insulin", "metformin"]
outcome = "y"
propensity = "p"
site = "hospital"
max_len = 4

[[static]]
name = "age"
kind = "continuous"

[[static]]
name = "female"
kind = "binary"

[[context]]
name = "lab"
kind = "continuous"
missing = "indicator"

[[context]]
name = "ward"
kind = "categorical"
"""


def make_long_table(n_entities: int = 12, seed: int = 0) -> pd.DataFrame:
    """A valid long-format table: entities with 1..6 steps over 3 hospitals, one missing lab value."""
    rng = np.random.default_rng(seed)
    rows = []
    for e in range(n_entities):
        steps = 1 + (e % 6)
        for t in range(steps):
            rows.append(
                {
                    "pid": f"p{e:03d}",
                    "visit": 10 * t + 1,
                    "age": 40.0 + e,
                    "female": e % 2,
                    "lab": float(rng.normal(5, 2)),
                    "ward": ["a", "b", "c"][(e + t) % 3],
                    "drug": ["none", "insulin", "metformin"][(e * t) % 3],
                    "y": int(rng.random() < 0.4),
                    "p": float(rng.uniform(0.2, 1.0)),
                    "hospital": f"h{e % 3}",
                }
            )
    df = pd.DataFrame(rows)
    df.loc[3, "lab"] = np.nan
    return df


@pytest.fixture
def long_case(tmp_path):
    """Factory: ``long_case(df=None, spec=None, suffix='.csv') -> (spec_path, table_path)`` in tmp_path."""

    def write(df: pd.DataFrame | None = None, spec: str | None = None, suffix: str = ".csv"):
        df = make_long_table() if df is None else df
        table = tmp_path / f"table{suffix}"
        if suffix == ".parquet":
            df.to_parquet(table, index=False)
        else:
            df.to_csv(table, index=False)
        spec_path = tmp_path / "spec.toml"
        spec_path.write_text(GOOD_SPEC if spec is None else spec)
        return spec_path, table

    return write


@pytest.fixture
def shared_data() -> Path:
    """The real data folder (:func:`real_data`), or a skip naming why there is none."""
    return real_data()


@pytest.fixture
def one_torch_thread():
    """One torch thread for tiny-model tests: they gain nothing from two, and CI has two cores to share."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_dkt_site():
    """Site 0 of a two-site tiny DKT-Synth world and an untrained tiny model for it: ``(cfg, data, model)``."""
    from fcd_secure.config import build_config
    from fcd_secure.federation import learner

    cfg = build_config("tiny", {"seed": 0, "data": {"n_sites": 2, "alpha": 1000.0},
                                "federation": {"clients_per_round": 2}})
    data = learner.load_site_data(cfg, 0)
    return cfg, data, learner.build_model(cfg, learner.dims_of(data.train, 2))


def ask_policies(model, sub, data, cfg, question, seed: int = 3) -> dict:
    """The what-if query alone (``queries.registry.POLICY_VALUES``) on the test rows ``sub`` of ``data``'s site, one
    simulated future per entity, as a site computes it."""
    from dataclasses import replace

    from fcd_secure.queries.evaluation import site_metrics
    from fcd_secure.queries.registry import POLICY_VALUES
    from fcd_secure.queries.request import EvaluationRequest

    return site_metrics(model, replace(data, test=sub), cfg, EvaluationRequest(n_samples=1, whatif=question),
                        seed=seed, queries=[POLICY_VALUES])


def merge_policies(parts: list[dict], question) -> dict:
    """The server's merge of the what-if query alone over the sites' replies ``parts``."""
    from fcd_secure.queries.evaluation import merge_site_metrics
    from fcd_secure.queries.registry import POLICY_VALUES

    return merge_site_metrics(parts, question, queries=[POLICY_VALUES])


@pytest.fixture(scope="module", autouse=True)
def _module_site_registry(tmp_path_factory):
    """Each test module its own registry too, set before any module-scoped fixture runs (a module's consortium of
    site homes is made before the per-test registry below exists; with the host's own registry, an earlier run's
    homes left in pytest's temp folders held the same tables and ``fcd site init`` rightly refused them)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FCD_SITE_REGISTRY", str(tmp_path_factory.mktemp("module_registry") / "site_tables.json"))
        yield


@pytest.fixture(autouse=True)
def _site_registry(tmp_path_factory, monkeypatch):
    """Each test its own registry of this host's site homes (``provisioning.site_install.tables``): tests init sites
    on tables of equal content, which one host would rightly refuse as one table held by two homes."""
    monkeypatch.setenv("FCD_SITE_REGISTRY", str(tmp_path_factory.mktemp("registry") / "site_tables.json"))


@pytest.fixture(scope="session")
def hospitals(tmp_path_factory):
    """The session's hospital consortium (``tests/_hospital.py``: a coordinator and four hospitals with real Flower
    processes), shared by the deployment tests that run a consortium's commands, started on first use; a test that
    changes it closes it, and the next one gets a fresh one. Stopped at the end of the session."""
    from _hospital import Hospitals

    hospitals = Hospitals(tmp_path_factory)
    yield hospitals
    hospitals.close()
