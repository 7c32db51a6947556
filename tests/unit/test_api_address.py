"""``--master`` read as client-go reads a host, and the ``kubernetes`` Service told from the API
server's own address."""

from __future__ import annotations

import pytest

from kubeplex.core.model.errors import KubeplexError
from kubeplex.core.sources.api_address import kubernetes_service_hint, master_url

#: What the kubelet gives every pod for the ``kubernetes`` Service.
POD_ENV = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "KUBERNETES_PORT": "tcp://10.96.0.1:443",
}


@pytest.mark.parametrize(
    ("master", "tls", "url"),
    [
        ("https://192.168.1.10:6443", False, "https://192.168.1.10:6443"),
        ("https://192.168.1.10:6443/", True, "https://192.168.1.10:6443"),
        ("http://127.0.0.1:8080", True, "http://127.0.0.1:8080"),
        ("192.168.1.10:6443", True, "https://192.168.1.10:6443"),
        ("192.168.1.10:6443", False, "http://192.168.1.10:6443"),
        ("cp.example.com:6443", True, "https://cp.example.com:6443"),
        ("cp.example.com", True, "https://cp.example.com"),
        ("https://[fd00::10]:6443", False, "https://[fd00::10]:6443"),
        ("[fd00::10]:6443", True, "https://[fd00::10]:6443"),
    ],
)
def test_master_is_a_url_or_a_host_port_pair(master: str, tls: bool, url: str) -> None:
    assert master_url(master, tls=tls) == url


@pytest.mark.parametrize(
    "master",
    ["", "https://", "https://cp/api", "https://cp:6443?x=1", "ftp://cp:21", "fd00::10", "cp:port"],
)
def test_anything_else_is_refused_naming_the_flag(master: str) -> None:
    with pytest.raises(KubeplexError, match=r"^--master .*: must be a URL or a host:port pair$"):
        master_url(master, tls=True)


@pytest.mark.parametrize(
    ("url", "env"),
    [
        ("https://10.96.0.1:443", POD_ENV),
        # KUBERNETES_SERVICE_HOST pointed at the API server by hand: KUBERNETES_PORT still
        # names the Service.
        ("https://10.96.0.1:443", {**POD_ENV, "KUBERNETES_SERVICE_HOST": "192.168.1.10"}),
        ("https://[fd00:10:96::1]:443", {"KUBERNETES_PORT": "tcp://[fd00:10:96:0::1]:443"}),
        ("https://10.96.0.1:443", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}),
        ("https://kubernetes.default.svc.cluster.local.", {}),
        ("https://kubernetes.default:443", {}),
    ],
)
def test_the_kubernetes_service_gets_a_hint_naming_what_to_set(
    url: str, env: dict[str, str]
) -> None:
    hint = kubernetes_service_hint(url, env)
    assert "`kubernetes` Service" in hint
    assert "apiServer.host" in hint and "--master" in hint


@pytest.mark.parametrize(
    ("url", "env"),
    [
        ("https://192.168.1.10:6443", POD_ENV),
        ("https://192.168.1.10:6443", {**POD_ENV, "KUBERNETES_SERVICE_HOST": "192.168.1.10"}),
        ("https://10.96.0.1:443", {}),  # not a pod: nothing says what the Service is
        ("https://kubernetes.example.com", POD_ENV),
    ],
)
def test_any_other_address_gets_none(url: str, env: dict[str, str]) -> None:
    assert kubernetes_service_hint(url, env) == ""
