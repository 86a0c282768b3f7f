"""P58: what the egress gate catches, and the residual that site-code integrity must cover (issue 44 item 9).

The gate refuses a reply that carries a Θs tensor or the propensities *as they are*: whole, one row or column, in
float32, float64 or integer views, in any tensor, bytes field or list of numbers, the secure-aggregation bytes
included (``audit/scanner.py``, ``audit/rules.py``). It cannot refuse what a handler computes from them first: an
invertible transform (1 − P, Θs·2), a lower precision (float16), or compressed bytes inside a masked input of
exactly the layout's length (P29 pins the length and the header, not the words, which are random-looking by design).
No gate can: the Θc update and the masked words are the site's own numbers by construction, and an honest update is
indistinguishable from one that encodes private values. These tests pin both sides, so that a change to either is
seen; docs/threats.md P58 states the residual and what covers it (the site runs only code it pins).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord
from test_audit_support import POLICY, Site, instruction
from test_secagg_reply_pins import _send, site  # noqa: F401 - the real site runtime and gate of P29

from fcd_secure.aggregation.secagg.messages import Ciphertexts, MaskedInput, MsgType
from fcd_secure.audit import GatePolicy
from fcd_secure.federation.secure.setup import vector_layout

REFUSED = "egress refused by the site gate: "


def _reply(site_: Site, plant) -> object:
    """The gate's answer to a training reply whose content ``plant`` changed."""
    return site_.send(instruction("train", 1), site_.train_handler(plant))


def _into(name: str, shape: tuple[int, ...], values: np.ndarray):
    """A plant that writes ``values`` (as float32 bit patterns where they are not float32) into Θc tensor ``name``."""
    def plant(content):
        w = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
        raw = np.frombuffer(np.ascontiguousarray(values).tobytes(), dtype=np.uint8)
        w.view(np.uint8).reshape(-1)[: raw.size] = raw
        content["update"][name] = Array(w)
    return plant


def test_P62_exact_private_values_are_refused_in_a_theta_c_tensor_and_a_metric_list(tmp_path):
    s = Site(tmp_path)
    theta_s, P = s.theta_s["eps_s.weight"], s.P
    assert _reply(s, _into("trunk.weight", (6, 4), theta_s)).error.reason == REFUSED + "theta_s_bytes"
    assert _reply(s, _into("decoder.weight", (3, 6), P[3])).error.reason == REFUSED + "propensity"
    assert _reply(s, _into("trunk.weight", (6, 4), P[:, 2])).error.reason == REFUSED + "propensity"  # a column
    lists = Site(tmp_path / "lists", policy=GatePolicy(allowed_metrics=POLICY.allowed_metrics,
                                                        allowed_metric_lists={"metrics/curve": 16}))

    def in_list(values):
        def plant(content):
            content["metrics"] = MetricRecord({"loss": 0.25, "curve": [float(v) for v in values]})
        return plant

    assert _reply(lists, in_list(lists.P[5])).error.reason == REFUSED + "propensity"
    assert not _reply(lists, in_list(np.linspace(0, 1, 8))).has_error()  # an honest list passes


@pytest.mark.parametrize("transform", ["one_minus", "float16", "times_two"])
def test_P62_a_transformed_private_value_passes_the_gate_the_residual(tmp_path, transform):
    """The residual, pinned: each of these carries a Θs tensor or a propensity row out, invertibly, under a Θc
    name and shape; the gate lets it pass. What keeps it from happening is that the site runs only the app and the
    package versions it pins (docs/threats.md P58), not the gate."""
    s = Site(tmp_path)
    theta_s, P = s.theta_s["eps_s.weight"], s.P
    values = {"one_minus": (1.0 - P[3]).astype(np.float32),
              "float16": P[:3].astype(np.float16).reshape(-1),  # 24 values in 48 bytes
              "times_two": (theta_s * 2).astype(np.float32)}[transform]
    name, shape = ("trunk.weight", (6, 4)) if transform == "times_two" else ("decoder.weight", (3, 6))
    out = _reply(s, _into(name, shape, values))
    assert out.has_content() and not out.has_error()
    sent = np.asarray(out.content["update"][name].numpy())
    back = {"one_minus": lambda: 1.0 - sent.reshape(-1)[:8],
            "float16": lambda: sent.view(np.float16).reshape(-1)[:24].astype(np.float32).reshape(3, 8),
            "times_two": lambda: sent / 2}[transform]()
    want = {"one_minus": P[3], "float16": P[:3], "times_two": theta_s}[transform]
    assert np.allclose(back, want, atol=1e-3), "the value left the site and is read back"


def test_P62_compressed_private_values_in_an_exact_length_masked_input_pass_raw_ones_do_not(site):  # noqa: F811
    """Secure mode: the masked input is exactly the layout's words behind a header answering its request (P29). Raw
    float32 propensity rows inside those words are found by the scan and refused; the same rows and a Θs tensor
    compressed into words of exactly that length pass (the residual: masked words are opaque)."""
    rt, _roster, ctx, gate = site
    layout = vector_layout(rt.manifest)
    session = b"S" * 16
    request = Ciphertexts(MsgType.SHARES_RELAY, session, 3, rt.site_id, ()).to_bytes()
    P = np.asarray(rt.dataset_train.P, np.float32)
    theta_s = np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in rt.model.get_params("theta_s").values()])

    def words(blob: bytes) -> np.ndarray:
        blob = blob[: 4 * layout.length]
        w = np.frombuffer(blob + b"\0" * (-len(blob) % 4), dtype="<u4")
        return np.concatenate([w, np.zeros(layout.length - len(w), "<u4")])

    raw = MaskedInput(session, 3, rt.site_id, words(P[:8].tobytes())).to_bytes()
    assert _send(gate, ctx, "train_masked", request, raw).error.reason == REFUSED + "propensity"
    packed = zlib.compress(P.tobytes(), 9) + zlib.compress(theta_s.tobytes(), 9)
    assert len(packed) <= 4 * layout.length, "both fit in one masked input"
    covert = MaskedInput(session, 3, rt.site_id, words(packed)).to_bytes()
    out = _send(gate, ctx, "train_masked", request, covert)
    assert not out.has_error(), "the residual: compressed private values in exact-length masked words pass"
