"""The API server's address: ``--master`` read as client-go reads a host, and whether an
address is one that only a proxy makes reachable.

A pod finds the API server through the ``kubernetes`` Service: the kubelet gives every pod its
ClusterIP (``KUBERNETES_SERVICE_HOST``, and ``KUBERNETES_PORT=tcp://IP:PORT``), and the
in-cluster configuration dials it. That ClusterIP answers only once a proxy has programmed it,
so a proxy that dials it on a cluster without one waits forever. kubeplex cannot list the
cluster's ServiceCIDRs before it reaches the API server, and the KubeProxyConfiguration names
no Service range: the kubelet's variables are what it knows of the Service at start.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from kubeplex.core.model.errors import KubeplexError

#: The ``kubernetes`` Service's names in the cluster DNS (itself reached through a Service).
_SERVICE_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc")


def master_url(master: str, *, tls: bool) -> str:
    """``--master`` as a URL: a URL, or a host:port pair given the scheme of the connection
    (https when it has TLS settings, else http), as client-go's ``DefaultServerURL``."""
    parts = urlsplit(master)
    if not parts.scheme or not parts.netloc:
        parts = urlsplit(("https://" if tls else "http://") + master)
    try:
        port = parts.port  # raises on a port that is not a number
    except ValueError:
        port = -1
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or port == -1
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise KubeplexError(f"--master {master!r}: must be a URL or a host:port pair")
    return f"{parts.scheme}://{parts.netloc}"


def kubernetes_service_hint(url: str, environ: Mapping[str, str] = os.environ) -> str:
    """What to do when ``url`` names the ``kubernetes`` Service (its ClusterIP as the kubelet
    gives it to the pod, or its DNS name), '' when it does not."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if not host:
        return ""
    if host in _SERVICE_NAMES or host.startswith("kubernetes.default.svc."):
        what = "is the `kubernetes` Service's DNS name"
    elif _same_address(host, _service_ip(environ)):
        what = "is the `kubernetes` Service's ClusterIP"
    else:
        return ""
    return (
        f"{host} {what}, which only a running proxy makes reachable: on a cluster without "
        "kube-proxy, give kubeplex the API server's own address (Helm chart: apiServer.host "
        "and apiServer.port; command line: --master https://HOST:PORT)"
    )


def _service_ip(environ: Mapping[str, str]) -> str:
    """The ``kubernetes`` Service's ClusterIP the kubelet gave this pod. KUBERNETES_PORT
    first: it still names the Service where KUBERNETES_SERVICE_HOST was overridden to point
    at the API server itself."""
    link = environ.get("KUBERNETES_PORT", "")
    if link:
        return urlsplit(link).hostname or ""
    return environ.get("KUBERNETES_SERVICE_HOST", "").strip("[]")


def _same_address(host: str, service_ip: str) -> bool:
    if not service_ip:
        return False
    try:
        return ipaddress.ip_address(host) == ipaddress.ip_address(service_ip)
    except ValueError:
        return host == service_ip.lower()
