"""The iptables mode's own metrics, as upstream's RegisterMetrics registers them for it."""

from __future__ import annotations

from kubeplex.backends.iptables.rules import NFACCT_INVALID_DROPPED, NFACCT_LOCALHOST_NODEPORTS
from kubeplex.core.dataplane.backend import MetricEvent, MetricFamily

IPTABLES_TOTAL = "kubeproxy_sync_proxy_rules_iptables_total"
IPTABLES_LAST = "kubeproxy_sync_proxy_rules_iptables_last"
#: The scraped counters, by the nfacct object they read.
NFACCT_FAMILIES = {
    NFACCT_INVALID_DROPPED: "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
    NFACCT_LOCALHOST_NODEPORTS: "kubeproxy_iptables_localhost_nodeports_accepted_packets_total",
}
#: Tables whose rule counts are exported.
TABLES = ("filter", "nat")

#: In upstream's order of registration (the exposition keeps it).
FAMILIES = (
    MetricFamily(
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        "Cumulative proxy iptables restore failures",
        "counter",
        on=MetricEvent.SYNC_FAILED,
    ),
    MetricFamily(
        NFACCT_FAMILIES[NFACCT_INVALID_DROPPED],
        "packets dropped by iptables to work around conntrack problems",
        "counter",
        labels=(),
        scraped=True,
    ),
    MetricFamily(
        NFACCT_FAMILIES[NFACCT_LOCALHOST_NODEPORTS],
        "Number of packets accepted on nodeports of loopback interface",
        "counter",
        labels=(),
        scraped=True,
    ),
    MetricFamily(
        "kubeproxy_sync_full_proxy_rules_duration_seconds",
        "SyncProxyRules latency in seconds for full resyncs",
        "histogram",
        on=MetricEvent.FULL_SYNC_SECONDS,
    ),
    MetricFamily(
        "kubeproxy_sync_partial_proxy_rules_duration_seconds",
        "SyncProxyRules latency in seconds for partial resyncs",
        "histogram",
        on=MetricEvent.PARTIAL_SYNC_SECONDS,
    ),
    MetricFamily(
        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
        "Cumulative proxy iptables partial restore failures",
        "counter",
        on=MetricEvent.PARTIAL_SYNC_FAILED,
    ),
    MetricFamily(
        IPTABLES_TOTAL,
        "Total number of iptables rules owned by kube-proxy",
        "gauge",
        labels=("ip_family", "table"),
    ),
    MetricFamily(
        IPTABLES_LAST,
        "Number of iptables rules written by kube-proxy in last sync",
        "gauge",
        labels=("ip_family", "table"),
    ),
)
