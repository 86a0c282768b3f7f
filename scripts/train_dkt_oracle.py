#!/usr/bin/env python
"""Train the DKT-Synth oracle once on ASSISTments 2009 and write it into fcd_secure/data/oracle/.

Recipe (documented in fcd_secure/data/dkt_synth/oracle.py):
- DKVMN ``assist2009_updated`` train file; keep the 50 most frequent skill ids (|T| = 50, paper Table I),
  remap them to 0..49, drop every other step, cut sequences into chunks of at most 100 steps.
- 10 % of the training students are held out for early stopping (best validation AUC wins).
- Report the AUC on the DKVMN *test* file, restricted the same way.
- Writes ``dkt_oracle.pt`` (state dict + architecture), ``dkt_oracle.pt.sha256`` and ``dkt_oracle.json`` (card).

Deterministic for a seed on one thread:  .venv/bin/python scripts/train_dkt_oracle.py --seed 0
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fcd_secure._io import atomic_write_bytes, atomic_write_text, file_sha256
from fcd_secure.data.dkt_synth.oracle import (
    N_ITEMS,
    ORACLE_DIR,
    DKTOracle,
    assist_paths,
    read_assist,
    restrict,
    roc_auc,
    top_items,
)


def pad(batch: list[tuple[np.ndarray, np.ndarray]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    S = max(len(q) for q, _ in batch)
    q = np.zeros((len(batch), S), dtype=np.int64)
    r = np.zeros((len(batch), S), dtype=np.int64)
    m = np.zeros((len(batch), S), dtype=np.float32)
    for i, (qi, ri) in enumerate(batch):
        q[i, : len(qi)], r[i, : len(ri)], m[i, : len(qi)] = qi, ri, 1.0
    return torch.from_numpy(q), torch.from_numpy(r), torch.from_numpy(m)


def predict(model: DKTOracle, seqs, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    ys, ps = [], []
    model.eval()
    with torch.no_grad():
        for s in range(0, len(seqs), batch_size):
            q, r, m = pad(seqs[s : s + batch_size])
            logit = model(q, r).gather(2, q.unsqueeze(-1)).squeeze(-1)
            keep = m > 0
            ys.append(r[keep].numpy())
            ps.append(torch.sigmoid(logit)[keep].numpy())
    return np.concatenate(ys), np.concatenate(ps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=None, help="folder holding assistments2009/ (default: $FCD_DATA_DIR, then ../shared/data)")
    ap.add_argument("--out-dir", default=str(ORACLE_DIR), help="where the weights, .sha256 and card go")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=48)
    ap.add_argument("--emb-dim", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=100)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    t_start = time.time()

    train_path, test_path = assist_paths(args.data_dir)
    raw_train, raw_test = read_assist(train_path), read_assist(test_path)
    skills = top_items(raw_train, N_ITEMS)
    perm = rng.permutation(len(raw_train))
    n_valid = len(raw_train) // 10
    valid_students = [raw_train[i] for i in perm[:n_valid]]
    fit_students = [raw_train[i] for i in perm[n_valid:]]
    fit = restrict(fit_students, skills, args.chunk)
    valid = restrict(valid_students, skills, args.chunk)
    test = restrict(raw_test, skills, args.chunk)
    print(f"chunks: fit {len(fit)}, valid {len(valid)}, test {len(test)}; answers fit {sum(len(q) for q, _ in fit)}")

    model = DKTOracle(N_ITEMS, emb_dim=args.emb_dim, hidden=args.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    bce = nn.BCEWithLogitsLoss(reduction="none")
    best = (-1.0, None, 0)
    # sort-by-length buckets keep padding (and time) low; the bucket order is shuffled each epoch
    fit_sorted = sorted(fit, key=lambda s: len(s[0]))
    buckets = [fit_sorted[s : s + args.batch_size] for s in range(0, len(fit_sorted), args.batch_size)]
    for epoch in range(1, args.epochs + 1):
        model.train()
        total, count = 0.0, 0.0
        for b in rng.permutation(len(buckets)):
            q, r, m = pad(buckets[b])
            logit = model(q, r).gather(2, q.unsqueeze(-1)).squeeze(-1)
            loss = (bce(logit, r.float()) * m).sum() / m.sum()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            total += float(loss.detach()) * float(m.sum())
            count += float(m.sum())
        auc_v = roc_auc(*predict(model, valid))
        print(f"epoch {epoch:2d}  train bce {total / count:.4f}  valid auc {auc_v:.4f}  ({time.time() - t_start:.0f}s)")
        if auc_v > best[0]:
            best = (auc_v, {k: v.clone() for k, v in model.state_dict().items()}, epoch)
    valid_auc, state, best_epoch = best
    model.load_state_dict(state)
    y_test, p_test = predict(model, test)
    test_auc = roc_auc(y_test, p_test)
    print(f"best epoch {best_epoch}: valid auc {valid_auc:.4f}, test auc {test_auc:.4f}")

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = out / "dkt_oracle.pt"
    payload = {
        "arch": {"n_items": N_ITEMS, "emb_dim": args.emb_dim, "hidden": args.hidden},
        "state_dict": {k: v.contiguous() for k, v in state.items()},
    }
    # torch names the archive inside the file after the file it writes, so save under the final name first (the
    # bytes, hence the recorded SHA-256, match a direct torch.save), then publish atomically
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / weights.name
        torch.save(payload, staged)
        atomic_write_bytes(weights, staged.read_bytes())
    digest = file_sha256(weights)
    atomic_write_text(out / "dkt_oracle.pt.sha256", f"{digest}  dkt_oracle.pt\n")
    card = {
        "name": "DKT-Synth oracle",
        "data": "ASSISTments 2009 skill builder, DKVMN assist2009_updated (../shared/data/assistments2009)",
        "train_file": str(train_path.name),
        "test_file": str(test_path.name),
        "data_sha256": file_sha256(train_path),
        "test_data_sha256": file_sha256(test_path),
        "skill_ids": [int(s) for s in skills],
        "n_items": N_ITEMS,
        "emb_dim": args.emb_dim,
        "hidden": args.hidden,
        "chunk": args.chunk,
        "epochs": args.epochs,
        "best_epoch": best_epoch,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "valid_auc": round(valid_auc, 5),
        "test_auc": round(test_auc, 5),
        "test_answers": int(len(y_test)),
        "weights_sha256": digest,
        "train_seconds": round(time.time() - t_start, 1),
        "torch": torch.__version__,
    }
    atomic_write_text(out / "dkt_oracle.json", json.dumps(card, indent=2) + "\n")
    print(json.dumps({k: card[k] for k in ("test_auc", "valid_auc", "best_epoch", "weights_sha256")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
