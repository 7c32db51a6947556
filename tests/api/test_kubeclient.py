"""The connection to the API without the client's ``ApiClient``: requests prepared as its
``param_serialize`` prepares them, credentials refreshed per request, HTTPS, and a start from a
pod's service account that imports neither pydantic nor the kubeconfig loader."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
from apiserver import TLS_CERT, FakeApiServer
from hypothesis import given, settings
from hypothesis import strategies as st
from kits.cli_kit import wait_until
from kits.kubeapi_kit import api_source

from kubeplex.core.model.types import IPFamily
from kubeplex.core.sources.kubeapi import KubeApiSource
from kubeplex.core.sources.kubeclient import USER_AGENT, ApiConnection, api_request

NODE = "kind-worker"


class _Sent:
    """A REST client that keeps what it was asked to send."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any], Any, Any]] = []

    def request(
        self,
        method: str,
        url: str,
        headers: dict[str, Any] | None = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        self.calls.append((method, url, dict(headers or {}), body, _request_timeout))
        return _Ok()

    def close(self) -> None:
        pass


class _Ok:
    status = 200
    response = "raw"


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_value = st.one_of(_text, st.integers(-5, 10**6), st.booleans())


@settings(max_examples=200, deadline=None)
@given(
    method=st.sampled_from(["GET", "POST", "PATCH"]),
    name=_text,
    query=st.lists(st.tuples(st.sampled_from(["limit", "watch", "labelSelector", "x"]), _value)),
    token=st.one_of(st.none(), _text.filter(bool)),
    prefix=st.one_of(st.none(), st.just("Bearer")),
    content_type=st.one_of(st.none(), st.just("application/strategic-merge-patch+json")),
    body=st.one_of(st.none(), st.dictionaries(_text, _text, max_size=3)),
)
def test_a_request_is_the_one_the_api_client_prepares(
    method: str,
    name: str,
    query: list[tuple[str, Any]],
    token: str | None,
    prefix: str | None,
    content_type: str | None,
    body: dict[str, str] | None,
) -> None:
    conf = k8s.Configuration(host="https://10.0.0.1:6443")
    if token is not None:
        conf.api_key = {"BearerToken": token}
        if prefix:
            conf.api_key_prefix = {"BearerToken": prefix}
    path = "/api/v1/namespaces/{namespace}/events/{name}"
    params = {"namespace": "default", "name": name}
    headers: dict[str, Any] = {"Accept": "application/json"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    client = k8s.ApiClient(conf)
    want = client.param_serialize(
        method=method,
        resource_path=path,
        path_params=dict(params),
        query_params=list(query),
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    conn = ApiConnection(conf)
    sent = _Sent()
    conn.rest_client = sent
    assert (
        api_request(
            conn,
            method,
            path,
            path_params=params,
            query=query,
            body=body,
            content_type=content_type,
        )
        == "raw"
    )
    [(m, url, sent_headers, sent_body, _)] = sent.calls
    assert (m, url, sent_headers, sent_body) == (want[0], want[1], want[2], want[3])
    assert sent_headers["User-Agent"] == USER_AGENT == client.user_agent


def test_credentials_are_read_at_each_request() -> None:
    # The loaders refresh tokens through this hook (a service account's every minute, an exec
    # plugin's when it expires): every request must call it, as ApiClient does.
    conf = k8s.Configuration(host="http://127.0.0.1:1")
    conf.api_key = {"BearerToken": "bearer zero"}
    tokens = iter(["bearer one", "bearer two"])

    def refresh(c: Any) -> None:
        c.api_key["BearerToken"] = next(tokens)

    conf.refresh_api_key_hook = refresh
    conn = ApiConnection(conf)
    conn.rest_client = sent = _Sent()
    api_request(conn, "GET", "/api/v1/services")
    api_request(conn, "GET", "/api/v1/services")
    assert [c[2]["authorization"] for c in sent.calls] == ["bearer one", "bearer two"]


def test_a_source_lists_and_watches_over_https(tmp_path: Path) -> None:
    with FakeApiServer(tls=True, token="s3cret", bookmark_interval=0.2) as srv:
        assert srv.url.startswith("https://")
        srv.create(
            "Service",
            {
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
            },
        )
        source = api_source(srv, tmp_path, NODE).start()
        try:
            assert source.wait_for_initial_sync(10)
            assert _services(source) == {"default/web"}
            srv.create(
                "Service",
                {
                    "metadata": {"name": "api", "namespace": "default"},
                    "spec": {"selector": {"app": "api"}, "ports": [{"port": 81}]},
                },
            )
            wait_until(lambda: _services(source) == {"default/web", "default/api"}, "the watch")
        finally:
            source.stop()
        assert {r.status for r in srv.find_requests("list", "services")} == {200}
        assert srv.find_requests("watch", "services")


def _services(source: KubeApiSource) -> set[str]:
    return {sp.name.namespaced_name for sp in source.cluster.checkout().graphs[IPFamily.IPv4]}


IN_CLUSTER = """
import sys
import kubeplex.core.sources.kubeapi
from kubeplex.core.sources.kubeclient import ApiConnection, api_request
import kubernetes.client as k8s
from kubernetes.config.incluster_config import InClusterConfigLoader
conf = k8s.Configuration()
token, ca, port = sys.argv[1:]
env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
InClusterConfigLoader(token_filename=token, cert_filename=ca, environ=env).load_and_set(conf)
with ApiConnection(conf) as conn:
    print(api_request(conn, "GET", "/api/v1/services").status)
heavy = ("pydantic", "kubernetes.client.api_client", "kubernetes.config.kube_config",
         "requests", "oauthlib", "dateutil.parser", "multiprocessing.pool")
print(sorted(m for m in heavy if m in sys.modules))
"""


def test_a_pod_s_service_account_needs_no_api_client_nor_kubeconfig_loader(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    with FakeApiServer(tls=True, token="s3cret") as srv:
        out = subprocess.run(
            [sys.executable, "-c", IN_CLUSTER, str(token), str(TLS_CERT), str(srv.port)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        assert out == ["200", "[]"]
        [listed] = srv.find_requests("list", "services")
        assert listed.status == 200


@pytest.mark.parametrize("tls", [False, True])
def test_a_wrong_token_is_refused_either_way(tls: bool) -> None:
    with FakeApiServer(tls=tls, token="s3cret") as srv:
        conf = k8s.Configuration(host=srv.url)
        conf.ssl_ca_cert = str(TLS_CERT)
        conf.api_key = {"BearerToken": "Bearer wrong"}
        with ApiConnection(conf) as conn, pytest.raises(k8s.ApiException) as err:
            api_request(conn, "GET", "/api/v1/services")
        assert err.value.status == 401


def test_a_client_that_never_shakes_hands_holds_up_no_other() -> None:
    with FakeApiServer(tls=True) as srv:
        silent = socket.create_connection((srv.host, srv.port))
        try:
            conf = k8s.Configuration(host=srv.url)
            conf.ssl_ca_cert = str(TLS_CERT)
            with ApiConnection(conf) as conn:
                assert api_request(conn, "GET", "/api/v1/services", timeout=5).status == 200
        finally:
            silent.close()
