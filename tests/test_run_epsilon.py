"""One run spends a share of each site's lifetime ε, never more than the site has left (issue 45 item 5).

Measured on the hospital deployment: ``fcd server run`` had no way to ask for less than each site's whole lifetime
cap, so the first run spent it all. ``dp.run_epsilon`` (``fcd server run --dp-epsilon``) is the ε the run may add
to each site's spend: the site plans σ for its spend so far plus that share, within its cap, and refuses a share
above what it has left (the site decides; the server may ask for less, never more). Here on a site's real DP-SGD
rounds (Opacus) and the real ledger; the deployed run is ``tests/test_hospital_deployment.py``.
"""

from __future__ import annotations

import pytest
from torch import nn
import torch

from fcd_secure.config import build_config
from fcd_secure.privacy.ledger import BudgetExceeded
from tests.test_privacy_ledger import cfg, new_site, one_round

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_run_spends_its_share_and_a_site_refuses_more_than_it_has_left(tmp_path):
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first = new_site(tmp_path, cfg(epsilon=3.0, run_epsilon=1.0), rounds=2)
    for r in (1, 2):
        one_round(first, model, opt, seed=r, round_id=r)
    spent_1 = first.spent()[0]
    assert 0.9 <= spent_1 <= 1.0  # the share, not the lifetime cap of 3
    # the next run asks for another share: σ is planned for spent + share, so the spend grows by at most it
    second = new_site(tmp_path, cfg(epsilon=3.0, run_epsilon=1.5), rounds=2)
    assert second.refusal is None
    for r in (1, 2):
        one_round(second, model, opt, seed=10 + r, round_id=r)
    spent_2 = second.spent()[0]
    assert spent_1 < spent_2 <= spent_1 + 1.5 + 1e-9
    # a share above what is left (3 - spent_2 < 1): the site refuses before any data is read, and says why
    third = new_site(tmp_path, cfg(epsilon=3.0, run_epsilon=1.0), rounds=2)
    assert third.refusal is not None and "the site refuses" in third.refusal and "left of its cap 3" in third.refusal
    with pytest.raises(BudgetExceeded, match="ask for at most what is left"):
        third.reserve_round(round_id=1)
    assert third.spent()[0] == pytest.approx(spent_2)


def test_the_run_share_is_in_the_training_hash_only_when_set():
    base = build_config("tiny", {"dp": {"enabled": True}})
    assert "run_epsilon" not in base.model_dump()["dp"] or base.dp.run_epsilon is None
    shared = build_config("tiny", {"dp": {"enabled": True, "run_epsilon": 1.0}})
    assert shared.training_hash() != base.training_hash()
    assert build_config("tiny", {"dp": {"enabled": True, "run_epsilon": 1.0}}).training_hash() == shared.training_hash()
