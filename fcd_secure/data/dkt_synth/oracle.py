"""The frozen DKT oracle behind DKT-Synth: network, checksummed loading, and the training-data recipe.

The paper (§IV-A, Table I) derives DKT-Synth from "a pre-trained LSTM-DKT oracle" over |T| = 50 items.
We train that oracle once on ASSISTments 2009 (DKVMN "assist2009_updated" files, restricted to the 50 most
frequent skill ids of the training file, remapped to 0..49) with ``scripts/train_dkt_oracle.py`` and ship the
weights in ``fcd_secure/data/oracle/`` with their SHA-256. The network is the pyKT-style DKT
(Piech et al. 2015): an embedding of the interaction ``item + K * correct``, an LSTM, and a per-item logit.

Indexing convention (shared by training and simulation): ``logits_t = head(h_t)`` predicts the answer at step
``t`` for every item, where ``h_t`` summarises the interactions *before* ``t``; ``h_0 = 0`` so ``logits_0`` is the
head's bias (the population prior of a fresh student).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fcd_secure._io import file_sha256
from fcd_secure.data.formats import read_three_line
from fcd_secure.data.paths import dataset_folder, need_file
from fcd_secure.errors import FcdError

#: Items the oracle knows (Table I: |T| = 50).
N_ITEMS = 50
ORACLE_DIR = Path(__file__).resolve().parent.parent / "oracle"
ORACLE_WEIGHTS = ORACLE_DIR / "dkt_oracle.pt"
ORACLE_CARD = ORACLE_DIR / "dkt_oracle.json"
ASSIST_SUBDIR = Path("assistments2009") / "dkvmn_assist2009_updated"
ASSIST_TRAIN = "assist2009_updated_train.csv.gz"
ASSIST_TEST = "assist2009_updated_test.csv.gz"


class OracleChecksumError(FcdError, RuntimeError):
    """The shipped oracle weights do not match their recorded SHA-256 (corrupted or tampered file)."""


class DKTOracle(nn.Module):
    """Embedding(item, correctness) -> LSTM -> per-item logit (pyKT ``dkt.py`` layout, re-implemented)."""

    def __init__(self, n_items: int = N_ITEMS, emb_dim: int = 32, hidden: int = 48) -> None:
        super().__init__()
        self.n_items = n_items
        self.emb_dim = emb_dim
        self.hidden = hidden
        self.emb = nn.Embedding(2 * n_items, emb_dim)
        self.cell = nn.LSTMCell(emb_dim, hidden)
        self.head = nn.Linear(hidden, n_items)

    # -- simulation API: one step at a time, batched over students x rollouts ----------------------------
    def init_state(self, batch: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.zeros(batch, self.hidden, dtype=dtype)
        return z, z.clone()

    def logits(self, state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Per-item success logits at the current step, shape [B, n_items]."""
        return self.head(state[0])

    def step(
        self, state: tuple[torch.Tensor, torch.Tensor], item: torch.Tensor, correct: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Absorb the interaction (item, correct) into the knowledge state: the "practice" pathway."""
        x = self.emb(item.long() + self.n_items * correct.long())
        return self.cell(x, state)

    # -- training API: whole padded sequences -----------------------------------------------------------
    def forward(self, items: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
        """Logits for every step of padded sequences ``[B, S]``: row ``t`` uses the interactions before ``t``."""
        B, S = items.shape
        state = self.init_state(B, dtype=self.head.weight.dtype)
        out = []
        for t in range(S):
            out.append(self.logits(state))
            state = self.step(state, items[:, t], correct[:, t])
        return torch.stack(out, dim=1)


def expected_sha256(weights: Path) -> str:
    """The SHA-256 recorded in ``<weights>.sha256`` (first word, as written by ``sha256sum``).

    Raises:
        OracleChecksumError: The checksum file is missing or malformed.
    """
    side = weights.with_name(weights.name + ".sha256")
    if not side.is_file():
        raise OracleChecksumError(f"{weights}: checksum file {side} is missing; refusing to load unverified weights")
    text = side.read_text(encoding="ascii").split()
    if not text or len(text[0]) != 64:
        raise OracleChecksumError(f"{side}: expected a 64-hex-digit SHA-256 on the first line")
    return text[0].lower()


def load_oracle(weights: str | Path | None = None) -> tuple[DKTOracle, dict]:
    """Load the frozen oracle after checking ``<weights>.sha256``.

    The ground truth of every DKT-Synth experiment depends on these exact weights, so a silently different oracle is
    not acceptable.

    Args:
        weights: The weights file (default: the shipped ``fcd_secure/data/oracle/dkt_oracle.pt``).

    Returns:
        ``(model in float64 eval mode with frozen parameters, card dict)``.

    Raises:
        FileNotFoundError: The weights file is missing.
        OracleChecksumError: The checksum file is missing or malformed, or the SHA-256 does not match (the message
            names the file and both hashes).
    """
    path = Path(weights) if weights is not None else ORACLE_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"DKT oracle weights not found: {path} (train them with scripts/train_dkt_oracle.py)")
    want = expected_sha256(path)
    got = file_sha256(path)
    if got != want:
        raise OracleChecksumError(f"{path}: SHA-256 mismatch: expected {want}, file has {got}")
    card_path = path.with_suffix(".json")
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    payload = torch.load(path, map_location="cpu", weights_only=True)
    arch = payload["arch"]
    model = DKTOracle(n_items=int(arch["n_items"]), emb_dim=int(arch["emb_dim"]), hidden=int(arch["hidden"]))
    model.load_state_dict(payload["state_dict"])
    model = model.double().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, card


# -- the data recipe (used by scripts/train_dkt_oracle.py; kept here so it is tested and documented) -------
def assist_paths(data_dir: str | Path | None = None) -> tuple[Path, Path]:
    """The DKVMN ``assist2009_updated`` train and test files under the data folder.

    Args:
        data_dir: The data folder; None: :func:`~fcd_secure.data.paths.default_data_dir`.

    Raises:
        DataError: The folder or a file is missing; the message names it.
    """
    base = dataset_folder(data_dir, ASSIST_SUBDIR)
    return need_file(base / ASSIST_TRAIN), need_file(base / ASSIST_TEST)


def top_items(seqs: list[tuple[np.ndarray, np.ndarray]], k: int = N_ITEMS) -> np.ndarray:
    """The ``k`` most frequent skill ids (ties broken by the smaller id, so the choice is deterministic)."""
    ids, counts = np.unique(np.concatenate([q for q, _ in seqs]), return_counts=True)
    order = np.lexsort((ids, -counts))
    return ids[order[:k]]


def restrict(
    seqs: list[tuple[np.ndarray, np.ndarray]], skills: np.ndarray, chunk: int, min_len: int = 2
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Drop steps on other skills, remap ``skills[j] -> j`` and cut sequences into chunks of at most ``chunk``."""
    remap = {int(s): j for j, s in enumerate(skills)}
    out = []
    for q, r in seqs:
        keep = np.isin(q, skills)
        q2 = np.array([remap[int(v)] for v in q[keep]], dtype=np.int64)
        r2 = r[keep].astype(np.int64)
        for s in range(0, len(q2), chunk):
            if len(q2[s : s + chunk]) >= min_len:
                out.append((q2[s : s + chunk], r2[s : s + chunk]))
    return out


def read_assist(path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per student ``(skill ids, correctness)`` of one DKVMN 3-line file."""
    return read_three_line(path)


def roc_auc(y: np.ndarray, score: np.ndarray) -> float:
    """Rank-based ROC AUC (Mann-Whitney U with mid-ranks for ties)."""
    y = np.asarray(y).astype(bool)
    score = np.asarray(score, dtype=np.float64)
    n1, n0 = int(y.sum()), int((~y).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    # mid-ranks: tied scores share the average of the ranks they span
    uniq, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    r = (first + (counts - 1) / 2.0 + 1.0)[inverse]
    return float((r[y].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def card_summary(card: dict) -> dict:
    """The headline entries of the oracle's card (AUCs, epochs, seed, sizes, data hash)."""
    keys = ("test_auc", "valid_auc", "epochs", "seed", "hidden", "emb_dim", "data_sha256")
    return {k: card[k] for k in keys if k in card}


if __name__ == "__main__":  # pragma: no cover - convenience
    m, c = load_oracle()
    print(json.dumps(card_summary(c), indent=2))
