"""The kubeconfig loader imported with what only its OIDC refresh calls deferred: a start from
a kubeconfig imports neither pydantic nor requests, an OIDC refresh still
works through the client's own code, and nothing else sees the stand-ins."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from apiserver import TLS_CERT, TLS_KEY, FakeApiServer

from kubeplex.core.startup.deferred import Deferred, deferring

HEAVY = (
    "pydantic",
    "kubernetes.client.api_client",
    "requests",
    "requests_oauthlib",
    "oauthlib.oauth2.rfc6749",
    "dateutil.parser",
)

LOAD = """
import json, sys
from kubeplex.core.config.kubeproxy import ClientConnectionConfiguration
from kubeplex.core.sources.kubeclient import api_request, make_api_client
heavy = sys.argv[2:]
with make_api_client(ClientConnectionConfiguration(kubeconfig=sys.argv[1])) as conn:
    print(conn.configuration.api_key["BearerToken"])
    print(json.dumps(sorted(m for m in heavy if m in sys.modules)))
    print(api_request(conn, "GET", "/api/v1/services").status)
import requests_oauthlib
from kubernetes.client import ApiClient
from kubernetes.config import kube_config
print(isinstance(requests_oauthlib.OAuth2Session, type), isinstance(ApiClient, type),
      type(kube_config.OAuth2Session).__name__, type(kube_config.ApiClient).__name__)
from kubernetes.client import Configuration
print(Configuration().connection_pool_maxsize == conn.configuration.connection_pool_maxsize)
"""


def _load(kubeconfig: Path) -> list[str]:
    return subprocess.run(
        [sys.executable, "-c", LOAD, str(kubeconfig), *HEAVY],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()


def test_a_kubeconfig_start_imports_neither_pydantic_nor_requests(tmp_path: Path) -> None:
    with FakeApiServer(tls=True, token="s3cret") as srv:
        kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
        out = _load(kubeconfig)
    assert out == ["Bearer s3cret", "[]", "200", "True True Deferred Deferred", "True"]


def _jwt(claims: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}.c2ln"


class _Issuer(BaseHTTPRequestHandler):
    """An OIDC issuer: its discovery document and a token endpoint that trades the refresh
    token for a fresh ID token."""

    fresh = _jwt({"exp": 4102444800, "sub": "kubeplex"})
    refreshed: list[dict[str, str]] = []

    def do_GET(self) -> None:
        if self.path != "/.well-known/openid-configuration":
            self._send(404, {})
            return
        host, port = self.server.server_address[:2]
        self._send(200, {"token_endpoint": f"https://{host}:{port}/token"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        form = dict(p.split("=", 1) for p in self.rfile.read(length).decode().split("&"))
        self.refreshed.append(form)
        self._send(
            200,
            {
                "access_token": "a",
                "token_type": "Bearer",
                "expires_in": 3600,
                "id_token": self.fresh,
                "refresh_token": "r2",
            },
        )

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def issuer() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Issuer)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(TLS_CERT, TLS_KEY)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_an_expired_oidc_token_is_refreshed_by_the_client_s_own_code(
    tmp_path: Path, issuer: str
) -> None:
    _Issuer.refreshed.clear()
    expired = _jwt({"exp": int(time.time()) - 3600, "sub": "kubeplex"})
    provider = {
        "name": "oidc",
        "config": {
            "client-id": "kubeplex",
            "client-secret": "shh",
            "id-token": expired,
            "refresh-token": "r1",
            "idp-issuer-url": issuer,
            "idp-certificate-authority": str(TLS_CERT),
        },
    }
    with FakeApiServer(tls=True, token=_Issuer.fresh) as srv:
        kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig", user={"auth-provider": provider})
        out = _load(kubeconfig)
    assert out[0] == f"Bearer {_Issuer.fresh}"
    assert out[2] == "200"
    [form] = _Issuer.refreshed
    assert form["grant_type"] == "refresh_token" and form["refresh_token"] == "r1"
    # The refresh imported what it called, the real classes.
    assert {"requests_oauthlib", "kubernetes.client.api_client"} <= set(json.loads(out[1]))


def test_the_stand_ins_are_in_place_only_within_the_block() -> None:
    package = types.ModuleType("kubeplex_lazy_exports")
    package.kept = "kept"
    sys.modules["kubeplex_lazy_exports"] = package
    try:
        with deferring(
            {
                "kubeplex_not_imported": "Thing",
                "kubeplex_lazy_exports": "Lazy",
                "json": "loads",
            }
        ):
            from kubeplex_lazy_exports import Lazy  # type: ignore[import-not-found]
            from kubeplex_not_imported import Thing  # type: ignore[import-not-found]

            assert isinstance(Thing, Deferred) and isinstance(Lazy, Deferred)
            assert json.__dict__["loads"] is json.loads  # present already: not deferred
        assert "kubeplex_not_imported" not in sys.modules
        assert "Lazy" not in package.__dict__ and package.kept == "kept"
        assert repr(Thing) == "<deferred kubeplex_not_imported.Thing>"
        with pytest.raises(ModuleNotFoundError):
            Thing()
    finally:
        del sys.modules["kubeplex_lazy_exports"]


def test_a_deferred_name_calls_the_real_one_with_its_arguments() -> None:
    loads = Deferred("json", "loads")
    assert loads('{"a": [1]}', parse_int=str) == {"a": ["1"]}
    assert loads.resolve() is json.loads


def test_a_loader_imported_already_is_used_without_stand_ins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kubernetes.config import kube_config

    from kubeplex.core.sources import kubeclient
    from kubeplex.core.startup import deferred

    def refuse(names: object) -> None:
        raise AssertionError("stand-ins put in place for a module imported already")

    monkeypatch.setattr(deferred, "deferring", refuse)
    assert kubeclient._kubeconfig_loader() is kube_config.load_kube_config
