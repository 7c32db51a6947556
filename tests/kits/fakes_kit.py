"""The nft texts the fake nftables is pinned with: its unit tests (tests/unit/test_fakes.py)
and its comparison with the real nft (tests/kernel/test_fakes_kernel.py) start from them."""

T = "ip kube-proxy"
SETUP = f"""\
add table {T} {{ comment "rules for kube-proxy" ; }}
add chain {T} nat-output {{ type nat hook output priority -100 ; }}
add chain {T} filter-pre {{ type filter hook prerouting priority -110 ; }}
add chain {T} services
add rule {T} nat-output jump services
add set {T} cluster-ips {{ type ipv4_addr ; comment "Active ClusterIPs" ; }}
add map {T} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment "ClusterIP traffic" ; }}
add chain {T} mark-for-masquerade
add chain {T} service-X
add rule {T} service-X ip daddr 10.0.0.1 tcp dport 80 jump mark-for-masquerade
add rule {T} services ip daddr . meta l4proto . th dport vmap @service-ips
add element {T} cluster-ips {{ 10.0.0.1 }}
add element {T} service-ips {{ 10.0.0.1 . tcp . 80 : goto service-X }}
add set {T} aff {{ type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }}
add map {T} noep {{ type inet_proto . inet_service : verdict ; comment "x" ; }}
add element {T} noep {{ tcp . 30000 comment "ns/svc:p" : drop }}
add chain {T} reject-chain {{ comment "helper" ; }}
add rule {T} reject-chain reject
add chain {T} ep
add rule {T} service-X numgen random mod 2 vmap {{ 0 : goto ep , 1 : goto reject-chain }}
add rule {T} ep ip saddr != {{ 1.2.3.0/24 , 5.6.7.8 }} drop
add rule {T} ep update @aff {{ ip saddr }}
"""  # noqa: E501

#: ``nft list table ip kube-proxy`` after SETUP, byte for byte as nft 1.0.6 prints it (SETUP's
#: rules are written in nft's own form: the fake lists rules as written).
SETUP_LISTED = """\
table ip kube-proxy {
\tcomment "rules for kube-proxy"
\tset cluster-ips {
\t\ttype ipv4_addr
\t\tcomment "Active ClusterIPs"
\t\telements = { 10.0.0.1 }
\t}

\tmap service-ips {
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\tcomment "ClusterIP traffic"
\t\telements = { 10.0.0.1 . tcp . 80 : goto service-X }
\t}

\tset aff {
\t\ttype ipv4_addr
\t\tsize 65535
\t\tflags dynamic,timeout
\t\ttimeout 3h
\t}

\tmap noep {
\t\ttype inet_proto . inet_service : verdict
\t\tcomment "x"
\t\telements = { tcp . 30000 comment "ns/svc:p" : drop }
\t}

\tchain nat-output {
\t\ttype nat hook output priority -100; policy accept;
\t\tjump services
\t}

\tchain filter-pre {
\t\ttype filter hook prerouting priority dstnat - 10; policy accept;
\t}

\tchain services {
\t\tip daddr . meta l4proto . th dport vmap @service-ips
\t}

\tchain mark-for-masquerade {
\t}

\tchain service-X {
\t\tip daddr 10.0.0.1 tcp dport 80 jump mark-for-masquerade
\t\tnumgen random mod 2 vmap { 0 : goto ep, 1 : goto reject-chain }
\t}

\tchain reject-chain {
\t\tcomment "helper"
\t\treject
\t}

\tchain ep {
\t\tip saddr != { 1.2.3.0/24, 5.6.7.8 } drop
\t\tupdate @aff { ip saddr }
\t}
}
"""
