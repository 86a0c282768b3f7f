"""The SuperLink's Fleet port before authentication (docs/threats.md P51, P53), against the real ``fcd server start``
entry point (``_flower.superlink_main``) with TLS and SuperNode authentication on 127.0.0.1.

The attacks, as run against a deployment: a peer without a node key sent one 300 MB body to a Fleet route and the
SuperLink read all of it before checking who sent it (144 MB -> 691 MB resident, a second body 1.06 GB, never
returned); ``/docs`` and ``/openapi.json`` answered anyone on the Fleet port with every route and Flower's version.
Here the requests are written on a raw TLS socket, so the test controls exactly what is sent: the head only, with a
``Content-Length`` announcing the body. A SuperLink that would read the body before refusing leaves such a request
unanswered; a guarded one answers from the head alone and closes the connection.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import socket
import ssl
from pathlib import Path

import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

#: what the attacker announced: 300 MB, the body of the finding
BIG = 300 * 10**6


def _signed_headers(key) -> dict[str, str]:
    """What a SuperNode adds to each Fleet request (flwr 1.42 ``NodeAuthHttpInterceptor``): its public key (PEM,
    SubjectPublicKeyInfo), a UTC ISO timestamp and its ECDSA-SHA256 signature over that timestamp."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    stamp = datetime.datetime.now(tz=datetime.UTC).isoformat()
    return {"flwr-public-key": base64.b64encode(pem).decode(), "flwr-timestamp": stamp,
            "flwr-signature": base64.b64encode(key.sign(stamp.encode("ascii"), ec.ECDSA(hashes.SHA256()))).decode()}


def _ask(port: int, ca: Path, method: str, path: str, headers: dict[str, str] | None = None,
         wait_s: float = 10.0) -> tuple[int | None, bytes]:
    """Send the head of one request (no body) on a fresh TLS connection; ``(status, response)`` of what the
    SuperLink answers within ``wait_s``, ``(None, b"")`` when it answers nothing (it waits for the body)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}",
            *(f"{k}: {v}" for k, v in (headers or {}).items()), "", ""]
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall("\r\n".join(head).encode("latin-1"))
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = tls.recv(65536)
                if not chunk:
                    break
                data += chunk
            if b"\r\n\r\n" in data:
                head_end = data.index(b"\r\n\r\n") + 4
                length = next((int(line.split(b":", 1)[1]) for line in data[:head_end].split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(data) < head_end + length:
                    chunk = tls.recv(65536)
                    if not chunk:
                        break
                    data += chunk
        except (TimeoutError, socket.timeout):
            pass
    if not data.startswith(b"HTTP/1.1 "):
        return None, data
    return int(data.split(b" ", 2)[1]), data


def _detail(response: bytes) -> str:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])["detail"]


PROTOBUF = {"Content-Type": "application/protobuf"}


@pytest.mark.deployment
def test_P54_a_peer_without_a_node_key_is_refused_before_its_body_is_read(superlink):
    """P51: a 300 MB body announced by a peer without a node key, or with a key the SuperLink never registered, is
    refused from the head alone (the body is never sent, and the answer still comes)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    port, ca, _key = superlink
    big = {**PROTOBUF, "Content-Length": str(BIG)}
    status, resp = _ask(port, ca, "POST", "/v1/fleet/push-object", big)
    assert status == 401, (status, resp[:300])
    assert "flwr-public-key" in _detail(resp) and b"connection: close" in resp.lower(), resp
    stranger = ec.generate_private_key(ec.SECP384R1())
    status, resp = _ask(port, ca, "POST", "/v1/fleet/push-object", {**big, **_signed_headers(stranger)})
    assert status == 401 and "not a registered SuperNode" in _detail(resp), (status, resp[:300])
    # the two routes Flower answers for an unknown key (it says why) take a key's own signature and a small body
    for route in ("/v1/fleet/register-node", "/v1/fleet/activate-node"):
        status, resp = _ask(port, ca, "POST", route, big)
        assert status == 401, (route, status, resp[:300])
        status, resp = _ask(port, ca, "POST", route, {**big, **_signed_headers(stranger)})
        assert status == 413 and "65536 bytes" in _detail(resp), (route, status, resp[:300])


@pytest.mark.deployment
def test_P54_a_registered_node_gets_a_bounded_body_and_a_length_first(superlink):
    """P51: even a registered SuperNode's body is bounded (413 before it is read) and must say its length first
    (411 for a chunked body); a small signed request still reaches Flower (which checks the node id in the body)."""
    port, ca, key = superlink
    status, resp = _ask(port, ca, "POST", "/v1/fleet/push-object", {**PROTOBUF, "Content-Length": str(BIG),
                                                                     **_signed_headers(key)})
    assert status == 413 and "over the SuperLink's limit" in _detail(resp), (status, resp[:300])
    status, resp = _ask(port, ca, "POST", "/v1/fleet/push-object", {**PROTOBUF, "Transfer-Encoding": "chunked",
                                                                     **_signed_headers(key)})
    assert status == 411, (status, resp[:300])
    status, resp = _ask(port, ca, "POST", "/v1/fleet/send-node-heartbeat", {**PROTOBUF, "Content-Length": "0",
                                                                            **_signed_headers(key)})
    assert status is not None and b"docs/threats.md P51" not in resp, (status, resp[:300])  # Flower's own answer


@pytest.mark.deployment
def test_P56_the_api_description_is_not_served(superlink):
    """P53: ``/docs``, ``/openapi.json`` and the OAuth2 redirect answer 404 without any authentication, with
    neither routes nor Flower's version; ``/health`` still answers."""
    import flwr

    port, ca, _key = superlink
    for path in ("/docs", "/openapi.json", "/docs/oauth2-redirect", "/redoc"):
        status, resp = _ask(port, ca, "GET", path)
        assert status == 404, (path, status, resp[:300])
        assert b"/v1/fleet" not in resp and flwr.__version__.encode() not in resp.split(b"\r\n\r\n", 1)[1], resp
    assert _ask(port, ca, "GET", "/health")[0] == 200
