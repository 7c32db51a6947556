"""A kernel-held counter exported as a metric: an nfacct counter in the node's network
namespace, read by the iptables backend's scrape (tests/unit/test_metrics.py covers the rest)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kubeplex.core.config.kubeproxy import default_config
from kubeplex.core.daemon.metrics import ProxyMetrics
from kubeplex.core.dataplane import plugins
from kubeplex.core.dataplane.backend import BackendContext
from kubeplex.testing.netlab import unique_prefix

NODE = "node-a"
#: Upstream's nfacct counter name (the iptables rules count into it).
NFACCT_LOCALHOST_NODEPORTS_ACCEPTED = "localhost_nps_accepted_pkts"


@pytest.mark.kernel
def test_nfacct_counter_is_read_in_the_nodes_namespace() -> None:
    ns = f"{unique_prefix()}-nfacct"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:

        def run(*argv: str) -> None:
            subprocess.run(["ip", "netns", "exec", ns, *argv], check=True, capture_output=True)

        run("ip", "link", "set", "lo", "up")
        if subprocess.run(
            ["ip", "netns", "exec", ns, "nfacct", "add", NFACCT_LOCALHOST_NODEPORTS_ACCEPTED],
            capture_output=True,
        ).returncode:
            pytest.skip("nfacct not available")
        cfg = default_config()
        backend = plugins.load_backend("iptables", BackendContext(cfg, NODE, netns=ns))
        m = ProxyMetrics(backend, process_collectors=False)
        name = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"
        assert m.value(name) == 0
        assert m.value("kubeproxy_iptables_ct_state_invalid_dropped_packets_total") is None
        run(
            "iptables", "-A", "OUTPUT", "-o", "lo", "-p", "udp", "--dport", "9",
            "-m", "nfacct", "--nfacct-name", NFACCT_LOCALHOST_NODEPORTS_ACCEPTED,
        )  # fmt: skip
        script = (
            "import socket\nfor _ in range(3): socket.socket(2, 2).sendto(b'x', ('127.0.0.1', 9))"
        )
        run(sys.executable, "-c", script)
        assert m.value(name) == 3
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
