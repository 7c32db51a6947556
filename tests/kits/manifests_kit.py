"""Manifest files for the manifests-folder tests: writing one so a poll sees it, a Service and
an EndpointSlice as YAML, and the Services a cluster ends up with."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from textwrap import dedent

from kubeplex.core.model.cluster import ClusterState
from kubeplex.core.model.types import IPFamily, ServicePortName

V4 = IPFamily.IPv4
NODE = "node-a"

_mtime = itertools.count(1_700_000_000)


def write(path: Path, text: str) -> Path:
    """Write a manifest with a fresh mtime, so poll() sees it even within one clock tick."""
    path.write_text(text)
    stamp = next(_mtime)
    os.utime(path, (stamp, stamp))
    return path


def spn(name: str, port: str = "http") -> ServicePortName:
    return ServicePortName("prod", name, port)


def service_yaml(name: str, ip: str, port: int = 80) -> str:
    return dedent(f"""\
        apiVersion: v1
        kind: Service
        metadata: {{name: {name}, namespace: prod}}
        spec:
          clusterIP: {ip}
          ports: [{{name: http, port: {port}}}]
        """)


def slice_yaml(name: str, service: str, ip: str) -> str:
    return dedent(f"""\
        apiVersion: discovery.k8s.io/v1
        kind: EndpointSlice
        metadata:
          name: {name}
          namespace: prod
          labels: {{kubernetes.io/service-name: {service}}}
        addressType: IPv4
        ports: [{{name: http, port: 8080}}]
        endpoints:
        - addresses: [{ip}]
          nodeName: {NODE}
        """)


def services(cluster: ClusterState) -> dict[ServicePortName, int]:
    """Each Service port the cluster's IPv4 graph holds, with its port number."""
    graph = cluster.checkout().graphs[V4]
    return {name: port.port for name, port in graph.services.items()}
