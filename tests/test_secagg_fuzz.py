"""Fuzzing every protocol message parser, and the two state machines behind them: malformed, truncated,
oversized or wrongly typed input gives a ProtocolError (or, deeper in, another SecAggError), never a crash
of another kind and never a hang."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fcd_secure.aggregation.secagg import SecAggError
from fcd_secure.aggregation.secagg.errors import ProtocolError
from fcd_secure.aggregation.secagg.messages import (
    Advertise,
    Ciphertexts,
    KeyList,
    MaskedInput,
    MsgType,
    RoundParams,
    Signed,
    SiteList,
    Unmask,
    UnmaskRequest,
    parse_share_plaintext,
    peek_header,
    share_plaintext,
)
from secagg_harness import STAGES, RoundLog, run_round, toy_round

PARSERS = {
    MsgType.ROUND_PARAMS: RoundParams.parse,
    MsgType.ADVERTISE: Advertise.parse,
    MsgType.KEY_LIST: KeyList.parse,
    MsgType.SHARE_KEYS: lambda d: Ciphertexts.parse(d, MsgType.SHARE_KEYS),
    MsgType.SHARES_RELAY: lambda d: Ciphertexts.parse(d, MsgType.SHARES_RELAY),
    MsgType.MASKED_INPUT: MaskedInput.parse,
    MsgType.CONSISTENCY_REQUEST: SiteList.parse,
    MsgType.CONSISTENCY: Signed.parse,
    MsgType.UNMASK_REQUEST: UnmaskRequest.parse,
    MsgType.UNMASK: Unmask.parse,
}


def _samples() -> dict[MsgType, bytes]:
    t = toy_round(n_sites=4, d=6, seed=0)
    log = RoundLog()
    run_round(t.server, t.clients, log=log)
    out: dict[MsgType, bytes] = {}
    for msgs in list(log.downlink.values()) + list(log.uplink.values()):
        for m in msgs:
            out.setdefault(peek_header(m).type, m)
    assert set(out) == set(PARSERS)
    return out


SAMPLES = _samples()
ALL = sorted(SAMPLES.items())


def _parse_ok_or_protocol_error(parser, data) -> None:
    try:
        parser(data)
    except ProtocolError:
        pass


@pytest.mark.parametrize("mtype,sample", ALL, ids=[m.name for m, _ in ALL])
def test_valid_samples_round_trip(mtype, sample):
    msg = PARSERS[mtype](sample)
    assert msg.to_bytes() == sample


@pytest.mark.parametrize("mtype,sample", ALL, ids=[m.name for m, _ in ALL])
def test_every_truncation_and_any_trailing_byte_is_a_protocol_error(mtype, sample):
    parser = PARSERS[mtype]
    step = max(1, len(sample) // 300)
    for cut in list(range(0, len(sample), step)) + [len(sample) - 1]:
        with pytest.raises(ProtocolError):
            parser(sample[:cut])
    with pytest.raises(ProtocolError, match="trailing"):
        parser(sample + b"\x00")


@pytest.mark.parametrize("mtype", list(PARSERS), ids=[m.name for m in PARSERS])
@pytest.mark.parametrize("bad", [None, 7, 3.5, "FSA", ["FSA"], {"a": 1}, object()])
def test_wrong_python_types_are_protocol_errors(mtype, bad):
    with pytest.raises(ProtocolError):
        PARSERS[mtype](bad)


@pytest.mark.parametrize("mtype,sample", ALL, ids=[m.name for m, _ in ALL])
def test_wrong_message_type_version_and_magic(mtype, sample):
    other = MsgType(mtype % len(MsgType) + 1)
    swapped = sample[:4] + bytes([int(other)]) + sample[5:]
    with pytest.raises(ProtocolError, match="expected"):
        PARSERS[mtype](swapped)
    with pytest.raises(ProtocolError, match="version"):
        PARSERS[mtype](sample[:3] + b"\x63" + sample[4:])
    with pytest.raises(ProtocolError, match="magic"):
        PARSERS[mtype](b"XXX" + sample[3:])
    with pytest.raises(ProtocolError, match="unknown message type"):
        PARSERS[mtype](sample[:4] + b"\xee" + sample[5:])


@pytest.mark.parametrize("mtype,sample", ALL, ids=[m.name for m, _ in ALL])
def test_oversized_length_fields_are_refused_without_allocating(mtype, sample):
    parser = PARSERS[mtype]
    # overwrite every aligned 4- and 8-byte window after the header with huge values: whichever is a length
    # or count field must be refused by its limit or by truncation, quickly
    header = 29
    for pos in range(header, len(sample) - 3, 1 if len(sample) < 400 else 7):
        for width, huge in ((4, 0xFFFFFFFF), (8, 0xFFFFFFFFFFFFFFFF), (4, 0x7FFFFFFF)):
            if pos + width > len(sample):
                continue
            fmt = ">I" if width == 4 else ">Q"
            _parse_ok_or_protocol_error(parser, sample[:pos] + struct.pack(fmt, huge) + sample[pos + width :])


@pytest.mark.parametrize("mtype,sample", ALL, ids=[m.name for m, _ in ALL])
@given(data=st.data())
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_mutations_give_an_object_or_a_protocol_error(mtype, sample, data):
    buf = bytearray(sample)
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "set"]))
        pos = data.draw(st.integers(0, max(0, len(buf) - 1)))
        if op == "flip" and buf:
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "insert":
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and buf:
            del buf[pos : pos + data.draw(st.integers(1, 8))]
        elif buf:
            buf[pos] = data.draw(st.integers(0, 255))
    _parse_ok_or_protocol_error(PARSERS[mtype], bytes(buf))


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_arbitrary_bytes_are_a_protocol_error_for_every_parser(blob):
    for parser in PARSERS.values():
        _parse_ok_or_protocol_error(parser, blob)
    _parse_ok_or_protocol_error(parse_share_plaintext, blob)
    # with a valid header in front, the body parsers are reached
    for mtype, parser in PARSERS.items():
        _parse_ok_or_protocol_error(parser, SAMPLES[mtype][:29] + blob)


def test_share_plaintext_parser():
    pt = share_plaintext("a", "b", b"s" * 32, b"b" * 32)
    assert parse_share_plaintext(pt) == ("a", "b", b"s" * 32, b"b" * 32)
    for cut in range(len(pt)):
        with pytest.raises(ProtocolError):
            parse_share_plaintext(pt[:cut])
    with pytest.raises(ProtocolError):
        parse_share_plaintext("not bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize("stage_index", range(len(STAGES)))
@given(data=st.data())
@settings(max_examples=25, deadline=None)
def test_state_machines_only_raise_secagg_errors_on_fuzzed_messages(stage_index, data):
    """Drive a real round to ``stage_index``, then hand one fuzzed request to a site and one fuzzed reply to
    the server: both refuse with a SecAggError subclass (or accept a harmless mutation)."""
    t = toy_round(n_sites=4, d=4, seed=1)
    reqs = t.server.start()
    for _ in range(stage_index):
        for s, r in reqs.items():
            t.server.collect(s, t.clients[s].handle(r))
        reqs = t.server.advance()
    site = "site00"
    req = bytearray(reqs[site])
    reply = bytearray(t.clients["site01"].handle(reqs["site01"]))
    for buf in (req, reply):
        for _ in range(data.draw(st.integers(1, 4))):
            pos = data.draw(st.integers(0, len(buf) - 1))
            buf[pos] = data.draw(st.integers(0, 255))
    try:
        t.clients[site].handle(bytes(req))
    except SecAggError:
        pass
    try:
        t.server.collect("site01", bytes(reply))
    except SecAggError:
        pass
