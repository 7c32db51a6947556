"""The in-memory kernels of kubeplex.testing.fakes hold to what iptables-restore/-save and nft do.

These tests pin the behaviour seen with iptables 1.8.9 (nf_tables) and nft 1.0.6 on a 6.x
kernel; tests/kernel/test_fakes_kernel.py runs the same inputs through the real tools in a
scratch namespace and the fake, and compares the outcome.
"""

from __future__ import annotations

import pytest
from kits.fakes_kit import SETUP, SETUP_LISTED, T

from kubeplex.backends.netfilter.iptables import SavedRuleset
from kubeplex.backends.nftables.listing import kube_proxy_tables, parse_listing, parse_table
from kubeplex.core.model.errors import BackendError
from kubeplex.core.model.types import IPFamily
from kubeplex.testing import fakes
from kubeplex.testing.fakes import FakeIptables, FakeNftables

V4, V6 = IPFamily.IPv4, IPFamily.IPv6


def restore(ipt: FakeIptables, *lines: str, family: IPFamily = V4) -> None:
    ipt.restore(family, "\n".join(lines) + "\n")


def refused(ipt: FakeIptables, *lines: str) -> str:
    with pytest.raises(BackendError) as err:
        restore(ipt, *lines)
    return str(err.value)


def rules(save: str) -> list[str]:
    return [line for line in save.splitlines() if not line.startswith(("#", "*", ":"))]


def test_for_mode() -> None:
    assert isinstance(fakes.for_mode("iptables"), FakeIptables)
    assert isinstance(fakes.for_mode("nftables"), FakeNftables)
    assert fakes.for_mode("kernelspace") is None
    assert fakes.for_mode("iptables") is not fakes.for_mode("iptables")


# --- iptables -----------------------------------------------------------------------------------


def test_noflush_flushes_declared_chains_and_keeps_the_others_with_their_counters() -> None:
    ipt = FakeIptables()
    restore(ipt, "*filter", ":KEEP - [0:0]", ":FL - [0:0]", "-A KEEP -j RETURN",
            "-A FL -j RETURN", "-A OUTPUT -j KEEP", "-A OUTPUT -j FL", "COMMIT")  # fmt: skip
    ipt.set_counters(V4, "filter", "-A KEEP -j RETURN", packets=6, bytes=270)
    ipt.set_counters(V4, "filter", "-A FL -j RETURN", packets=6, bytes=270)
    restore(ipt, "*filter", ":FL - [0:0]", "-A FL -p udp -j RETURN", "COMMIT")
    assert rules(ipt.save(V4, counters=True)) == [
        "[0:0] -A OUTPUT -j KEEP",
        "[0:0] -A OUTPUT -j FL",
        "[0:0] -A FL -p udp -j RETURN",
        "[6:270] -A KEEP -j RETURN",
        "COMMIT",
    ]


def test_a_builtin_chain_declared_is_not_flushed_and_takes_a_policy() -> None:
    ipt = FakeIptables()
    restore(ipt, "*filter", "-A OUTPUT -j ACCEPT", "COMMIT")
    restore(ipt, "*filter", ":OUTPUT ACCEPT [0:0]", ":FORWARD DROP [0:0]", "COMMIT")
    save = ipt.save(V4)
    assert "-A OUTPUT -j ACCEPT" in save and ":FORWARD DROP [0:0]" in save


def test_a_refused_table_leaves_the_tables_committed_before_it() -> None:
    ipt = FakeIptables()
    message = refused(ipt, "*filter", ":T1 - [0:0]", "-A T1 -j RETURN", "COMMIT",
                      "*nat", ":N1 - [0:0]", "-A N1 -j NOPE", "COMMIT",
                      "*mangle", ":M1 - [0:0]", "COMMIT")  # fmt: skip
    assert "iptables-restore" in message and "Chain 'NOPE' does not exist" in message
    assert "line: 7" in message
    assert ipt.chains(V4, "filter") >= {"T1"}
    assert ipt.chains(V4, "nat") == set() and ipt.chains(V4, "mangle") == set()
    assert [t for t in ("filter", "nat", "mangle") if f"*{t}" in ipt.save(V4)] == ["filter"]
    assert ipt.log[-1] == (V4, ipt.inputs()[-1], True)


def test_a_refused_line_leaves_nothing_of_its_table() -> None:
    ipt = FakeIptables()
    restore(ipt, "*nat", ":A - [0:0]", "-A A -j RETURN", "COMMIT")
    refused(ipt, "*nat", ":A - [0:0]", ":B - [0:0]", "-A GHOST -j RETURN", "COMMIT")
    assert ipt.rules(V4, "nat", "A") == ["-A A -j RETURN"]
    assert "B" not in ipt.chains(V4, "nat")


def test_delete_chain_fails_while_referenced_or_not_empty() -> None:
    ipt = FakeIptables()
    restore(ipt, "*filter", ":T1 - [0:0]", ":REF - [0:0]", ":NE - [0:0]", "-A T1 -j REF",
            "-A NE -j RETURN", "COMMIT")  # fmt: skip
    assert "CHAIN_DEL failed (Device or resource busy): chain REF" in refused(
        ipt, "*filter", "-X REF", "COMMIT"
    )
    # Order matters: the flush of the referrer comes after the -X.
    refused(ipt, "*filter", "-X REF", ":T1 - [0:0]", "COMMIT")
    assert "chain NE" in refused(ipt, "*filter", "-X NE", "COMMIT")
    assert "No chain/target/match by that name." in refused(ipt, "*filter", "-X GHOST", "COMMIT")
    restore(ipt, "*filter", ":T1 - [0:0]", ":NE - [0:0]", "-X REF", "-X NE", "COMMIT")
    assert ipt.chains(V4, "filter") == {"INPUT", "FORWARD", "OUTPUT", "T1"}


def test_rule_order_and_insert_positions() -> None:
    ipt = FakeIptables()
    restore(ipt, "*filter", ":P - [0:0]", "-A P -s 1.1.1.1/32 -j RETURN",
            "-A P -s 2.2.2.2/32 -j RETURN", "-I P 1 -s 3.3.3.3/32 -j RETURN",
            "-I P 3 -s 4.4.4.4/32 -j RETURN", "-I P -s 5.5.5.5/32 -j RETURN",
            "-I P 6 -s 6.6.6.6/32 -j RETURN", "COMMIT")  # fmt: skip
    assert [r.split()[3] for r in ipt.rules(V4, "filter", "P")] == [
        "5.5.5.5/32", "3.3.3.3/32", "1.1.1.1/32", "4.4.4.4/32", "2.2.2.2/32", "6.6.6.6/32",
    ]  # fmt: skip
    message = refused(ipt, "*filter", "-I P 9 -s 7.7.7.7/32 -j RETURN", "COMMIT")
    assert message.endswith("iptables-restore: line 2 failed: Index of insertion too big.")


def test_delete_rule_by_spec_and_by_number() -> None:
    ipt = FakeIptables()
    restore(ipt, "*filter", ":P - [0:0]", "-A P -s 1.1.1.1/32 -j RETURN",
            "-A P -s 2.2.2.2 -j RETURN", "-A P -j ACCEPT", "COMMIT")  # fmt: skip
    restore(ipt, "*filter", "-D P -s 2.2.2.2/32 -j RETURN", "-D P 1", "COMMIT")
    assert ipt.rules(V4, "filter", "P") == ["-A P -j ACCEPT"]
    assert "Bad rule (does a matching rule exist in that chain?)." in refused(
        ipt, "*filter", "-D P -s 9.9.9.9/32 -j RETURN", "COMMIT"
    )
    assert "Index of deletion too big." in refused(ipt, "*filter", "-D P 5", "COMMIT")


def test_errors_of_the_tool() -> None:
    ipt = FakeIptables()
    assert "COMMIT expected at line 3" in refused(ipt, "*filter", ":NOCOMMIT - [0:0]")
    assert "table name 'bogus' invalid" in refused(ipt, "*bogus", "COMMIT")
    assert "No chain/target/match by that name." in refused(
        ipt, "*filter", "-A NOSUCH -j RETURN", "COMMIT"
    )
    assert "Bad argument `hello'" in refused(ipt, "*filter", "hello", "COMMIT")
    assert "Bad argument `*nat'" in refused(ipt, "*filter", ":A - [0:0]", "*nat", "COMMIT")
    restore(ipt, "*filter", "-N NN", "COMMIT")
    assert "Chain already exists." in refused(ipt, "*filter", "-N NN", "COMMIT")
    assert ipt.chains(V4, "filter") == {"INPUT", "FORWARD", "OUTPUT", "NN"}
    assert ipt.restore_command(V6) == "ip6tables-restore"
    with pytest.raises(BackendError, match="ip6tables-restore --noflush failed"):
        ipt.restore(V6, "*nat\n-A X -j Y\nCOMMIT\n")


def test_save_order_format_and_counters() -> None:
    ipt = FakeIptables()
    assert ipt.save(V4) == "" and ipt.save(V6) == ""
    restore(ipt, "*nat", ":ZED - [0:0]", ":ALPHA - [0:0]", "-A ZED -j ACCEPT",
            "-A ALPHA -j RETURN", "-A OUTPUT -j ZED", "-A OUTPUT -j ALPHA", "COMMIT",
            "*filter", ":a_b - [0:0]", ":A-b - [0:0]", ":a - [0:0]", ":B - [0:0]",
            ":b1 - [0:0]", "COMMIT", "*raw", "COMMIT", "*mangle", ":CANARY - [0:0]", "COMMIT",
            "*raw", ":R - [0:0]", "COMMIT")  # fmt: skip
    save = ipt.save(V4)
    assert [line for line in save.splitlines() if line.startswith("*")] == [
        "*mangle", "*raw", "*filter", "*nat",
    ]  # fmt: skip
    filt = ipt.save(V4, "filter").splitlines()
    assert [line for line in filt if line.startswith(":")] == [
        ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]",
        ":A-b - [0:0]", ":B - [0:0]", ":a - [0:0]", ":a_b - [0:0]", ":b1 - [0:0]",
    ]  # fmt: skip
    assert rules(ipt.save(V4, "nat")) == [
        "-A OUTPUT -j ZED", "-A OUTPUT -j ALPHA", "-A ALPHA -j RETURN", "-A ZED -j ACCEPT",
        "COMMIT",
    ]  # fmt: skip
    ipt.set_counters(V4, "nat", "-A OUTPUT -j ALPHA", packets=3, bytes=180)
    counted = ipt.save(V4, "nat", counters=True)
    assert "[3:180] -A OUTPUT -j ALPHA" in counted and "[0:0] -A ZED -j ACCEPT" in counted
    parsed = SavedRuleset.parse(counted)
    assert parsed.counted("nat")[1] == ("-A OUTPUT -j ALPHA", (3, 180))
    assert parsed.chains["nat"] == {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING", "ZED", "ALPHA"}
    # A table nothing wrote to is printed when asked for, with its built-in chains.
    assert ipt.save(V4, "security").splitlines()[1:6] == [
        "*security", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]",
        "COMMIT",
    ]  # fmt: skip
    assert "*security" not in ipt.save(V4)
    with pytest.raises(BackendError, match="Table `nonexist' does not exist"):
        ipt.save(V4, "nonexist")
    with pytest.raises(KeyError):
        ipt.set_counters(V4, "nat", "-A OUTPUT -j NOTHERE", packets=1)


def test_rules_are_saved_as_the_tool_prints_addresses_and_comments() -> None:
    ipt = FakeIptables()
    restore(ipt, "*filter", ":C - [0:0]", '-A C -m comment --comment "ns/svc:p" -j RETURN',
            '-A C -m comment --comment "word" -j RETURN',
            "-A C -m comment --comment plain-1 -j RETURN",
            '-A C -m comment --comment "has space" -j RETURN', "-A C -s 10.0.0.1 -j RETURN",
            "-A C ! -d 10.0.0.0/8 -j RETURN", "-A C -c 5 50 -j RETURN",
            "[7:700] -A C -j ACCEPT", "COMMIT")  # fmt: skip
    restore(ipt, "*filter", ":V6 - [0:0]", "-A V6 -s fd00::1 -j RETURN", "COMMIT", family=V6)
    assert ipt.rules(V4, "filter", "C") == [
        '-A C -m comment --comment "ns/svc:p" -j RETURN',
        "-A C -m comment --comment word -j RETURN",
        "-A C -m comment --comment plain-1 -j RETURN",
        '-A C -m comment --comment "has space" -j RETURN',
        "-A C -s 10.0.0.1/32 -j RETURN",
        "-A C ! -d 10.0.0.0/8 -j RETURN",
        "-A C -j RETURN",
        "-A C -j ACCEPT",
    ]
    # Inline -c counters are taken; [p:b] prefixes only by `restore -c`, which is not used.
    assert "[5:50] -A C -j RETURN" in ipt.save(V4, counters=True)
    assert "[0:0] -A C -j ACCEPT" in ipt.save(V4, counters=True)
    assert ipt.rules(V6, "filter", "V6") == ["-A V6 -s fd00::1/128 -j RETURN"]
    assert ipt.chains(V6, "nat") == set() and "V6" not in ipt.chains(V4, "filter")


def test_node_reads_and_writes() -> None:
    ipt = FakeIptables(addresses=("10.0.0.1", "::1"))
    assert ipt.interface_addresses() == ("10.0.0.1", "::1")
    ipt.sysctl("net.ipv4.conf.all.route_localnet", "1")
    assert ipt.sysctls == {"net.ipv4.conf.all.route_localnet": "1"}
    assert ipt.ensure_nfacct(("a", "b")) == {"a", "b"}
    ipt.nfacct["a"] = 7
    assert ipt.read_nfacct("a") == 7 and ipt.read_nfacct("c") is None
    assert FakeIptables(nfacct=False).ensure_nfacct(("a",)) == frozenset()
    assert FakeIptables.writes == ("restore",)


# --- nftables -----------------------------------------------------------------------------------


def nft_with_setup() -> FakeNftables:
    nft = FakeNftables()
    nft.run(SETUP)
    return nft


def nft_refused(nft: FakeNftables, text: str) -> str:
    before = nft.list("list ruleset")
    with pytest.raises(BackendError) as err:
        nft.run(text)
    assert nft.list("list ruleset") == before, "a refused transaction changed something"
    return str(err.value)


def test_nft_listing_as_nft_prints_it() -> None:
    nft = nft_with_setup()
    assert nft.list(f"list table {T}") == SETUP_LISTED
    assert nft.list("list tables") == "table ip kube-proxy\n"
    assert nft.list("list tables ip6") == "" and nft.list("list sets ip6") == ""
    assert nft.list(f"list chain {T} reject-chain") == (
        'table ip kube-proxy {\n\tchain reject-chain {\n\t\tcomment "helper"\n\t\treject\n\t}\n}\n'
    )
    assert nft.list(f"list set {T} aff", terse=True) == (
        "table ip kube-proxy {\n\tset aff {\n\t\ttype ipv4_addr\n\t\tsize 65535\n"
        "\t\tflags dynamic,timeout\n"
        "\t\ttimeout 3h\n\t}\n}\n"
    )
    chains = nft.list("list chains ip")
    assert (
        "\tchain nat-output {\n\t\ttype nat hook output priority -100; policy accept;\n\t}\n"
        in (chains)
    )
    assert "jump services" not in chains and "\n\n" not in chains
    assert "elements" not in nft.list("list maps ip", terse=True)
    assert "elements = { 10.0.0.1 }" in nft.list("list sets ip")


def test_nft_listing_is_what_the_backend_parses() -> None:
    nft = nft_with_setup()
    nft.run("add table ip6 kube-proxy\nadd chain ip6 kube-proxy c6\nadd table ip other\n")
    text = nft.list("list chains ip\nlist sets ip\nlist maps ip\nlist chains ip6\n", terse=True)
    found = parse_listing(text)
    assert set(found) == {"ip", "ip6"}
    assert found["ip"].chains == {
        "nat-output", "filter-pre", "services", "mark-for-masquerade", "service-X",
        "reject-chain", "ep",
    }  # fmt: skip
    assert found["ip"].sets == {"cluster-ips", "aff"}
    assert found["ip"].maps == {"service-ips", "noep"}
    assert found["ip6"].chains == {"c6"}
    assert kube_proxy_tables(nft.list("list tables")) == ["ip", "ip6"]
    table = parse_table(nft.list(f"list table {T}"))
    assert table.chains["service-X"][1].startswith("numgen random mod 2 vmap")
    assert table.sets["service-ips"].elements == ["10.0.0.1 . tcp . 80 : goto service-X"]
    assert table.sets["noep"].elements == ['tcp . 30000 comment "ns/svc:p" : drop']
    assert table.sets["aff"].timeout == 10800


def test_nft_dump_is_the_add_commands_that_make_the_table_again() -> None:
    nft = FakeNftables()
    nft.run(SETUP)
    dump = nft.dump("ip", "kube-proxy")
    # One line per object, rule and element, as written (the set rules add to gets no size).
    assert sorted(dump.splitlines()) == sorted(line for line in SETUP.splitlines() if line)
    again = FakeNftables()
    again.run(dump)
    assert again.list(f"list table {T}") == SETUP_LISTED
    assert nft.dump("ip6", "kube-proxy") == ""


def test_nft_dump_keeps_a_declared_size_and_a_base_chain_policy() -> None:
    nft = FakeNftables()
    nft.run(
        f"add table {T}\nadd set {T} s {{ type ipv4_addr ; size 100 ; }}\n"
        f"add chain {T} in {{ type filter hook input priority filter + 5 ; policy drop ; }}\n"
    )
    assert nft.dump("ip", "kube-proxy").splitlines()[1:] == [
        f"add chain {T} in {{ type filter hook input priority 5 ; policy drop ; }}",
        f"add set {T} s {{ type ipv4_addr ; size 100 ; }}",
    ]


def test_nft_applied_leaves_out_refused_transactions() -> None:
    nft = FakeNftables()
    nft.run(SETUP)
    nft_refused(nft, f"flush chain {T} ghost\n")
    nft.run(f"add chain {T} more\n")
    assert nft.applied() == [SETUP, f"add chain {T} more\n"]
    assert len(nft.inputs()) == 3


def test_nft_a_transaction_with_one_bad_line_applies_nothing() -> None:
    nft = FakeNftables()
    message = nft_refused(
        nft, f"add table {T}\nadd chain {T} t1\nflush chain {T} ghost\nadd chain {T} t2\n"
    )
    assert message == (
        "nft -f failed (exit 1): /dev/stdin:3:27-31: Error: Could not process rule: "
        "No such file or directory\nflush chain ip kube-proxy ghost\n"
        "                          ^^^^^"
    )
    assert nft.list("list tables") == ""
    assert nft.log == [(nft.inputs()[0], True)]
    nft.run(SETUP)
    assert "syntax error" in nft_refused(nft, f"add chain {T} t1\nhello world\n")


def test_nft_flush_and_delete_of_a_missing_object_fail_destroy_does_not() -> None:
    nft = nft_with_setup()
    for line in (
        f"flush chain {T} ghost",
        f"delete chain {T} ghost",
        f"flush set {T} ghost",
        f"delete set {T} ghost",
        f"delete map {T} ghost",
        f"flush map {T} ghost",
        f"delete map {T} cluster-ips",  # a set, not a map
        "delete table ip ghost",
        "flush table ip ghost",
        f"delete element {T} cluster-ips {{ 10.9.9.9 }}",
        f"delete rule {T} services handle 999",
        f"add rule {T} ghost accept",
        f"add element {T} ghost {{ 1.1.1.1 }}",
    ):
        assert "No such file or directory" in nft_refused(nft, line + "\n"), line
    nft.run(
        f"destroy chain {T} ghost\ndestroy set {T} ghost\ndestroy map {T} ghost\n"
        f"destroy element {T} cluster-ips {{ 10.9.9.9 }}\ndestroy table ip ghost\n"
        f"destroy rule {T} services handle 999\n"
    )
    # destroy still refuses to remove what is in use.
    assert "Device or resource busy" in nft_refused(nft, f"destroy chain {T} ep\n")


def test_nft_add_of_an_existing_object_is_fine_create_fails() -> None:
    nft = nft_with_setup()
    nft.run(
        f"add table {T}\nadd chain {T} ep\nadd chain {T} nat-output\n"
        f"add chain {T} nat-output {{ type nat hook output priority -100 ; }}\n"
        f'add set {T} cluster-ips {{ type ipv4_addr ; comment "Active ClusterIPs" ; }}\n'
        f"add element {T} cluster-ips {{ 10.0.0.1 }}\n"
        f"add element {T} service-ips {{ 10.0.0.1 . tcp . 80 : goto service-X }}\n"
    )
    assert parse_table(nft.list(f"list table {T}")).sets["cluster-ips"].elements == ["10.0.0.1"]
    for line, culprit in (
        (f"create chain {T} ep", "File exists"),
        (f"create table {T}", "File exists"),
        (f"create set {T} aff {{ type ipv4_addr ; }}", "File exists"),
        (f"add set {T} cluster-ips {{ type ipv6_addr ; }}", "File exists"),
        (f"add map {T} cluster-ips {{ type ipv4_addr : verdict ; }}", "File exists"),
        (f"create element {T} cluster-ips {{ 10.0.0.1 }}", "File exists"),
        (f"add element {T} service-ips {{ 10.0.0.1 . tcp . 80 : jump service-X }}", "exists"),
        (
            f"add chain {T} nat-output {{ type nat hook output priority -90 ; }}",
            "Operation not supported",
        ),
    ):
        assert culprit in nft_refused(nft, line + "\n"), line


def test_nft_set_and_map_elements() -> None:
    nft = nft_with_setup()
    nft.run(
        f"add element {T} cluster-ips {{ 10.0.0.9, 10.0.0.10 , 10.0.0.11 }}\n"
        f"delete element {T} cluster-ips {{ 10.0.0.9 }}\n"
        f"add map {T} m6 {{ type inet_proto . inet_service : verdict ; }}\n"
        f"add element {T} m6 {{ udp . 53 : jump ep , tcp . 443 : accept }}\n"
        f'add element {T} noep {{ tcp . 30001 comment "ns/b:p" : goto reject-chain }}\n'
    )
    table = parse_table(nft.list(f"list table {T}"))
    assert table.sets["cluster-ips"].elements == ["10.0.0.1", "10.0.0.10", "10.0.0.11"]
    assert table.sets["m6"].elements == ["udp . 53 : jump ep", "tcp . 443 : accept"]
    assert table.sets["noep"].elements[1] == 'tcp . 30001 comment "ns/b:p" : goto reject-chain'
    nft.run(f"flush set {T} cluster-ips\nflush map {T} m6\n")
    table = parse_table(nft.list(f"list table {T}"))
    assert table.sets["cluster-ips"].elements == [] and table.sets["m6"].elements == []
    for line, culprit in (
        (f"add element {T} service-ips {{ 10.0.0.2 : goto ep }}", "invalid data type"),
        (f"add element {T} cluster-ips {{ fd00::1 }}", "Address family"),
        (f"add element {T} cluster-ips {{ 10.0.0.0/8 }}", "interval"),
        (f"add element {T} noep {{ tcp . 1 : goto ghost }}", "No such file"),
        (f"add element {T} noep {{ tcp . 1 }}", "needs a value"),
        (f"add element {T} cluster-ips {{ 10.0.0.3 : drop }}", "syntax error"),
    ):
        assert culprit in nft_refused(nft, line + "\n"), line
    # A set written with its elements.
    nft.run(f"add set {T} s2 {{ type ipv4_addr ; elements = {{ 1.1.1.1 , 2.2.2.2 }} ; }}\n")
    assert parse_table(nft.list(f"list set {T} s2")).sets["s2"].elements == [
        "1.1.1.1",
        "2.2.2.2",
    ]


def test_nft_deleting_what_is_still_used_is_refused() -> None:
    nft = nft_with_setup()
    for line in (
        f"delete chain {T} mark-for-masquerade",  # a rule jumps to it
        f"delete chain {T} service-X",  # a map element goes to it
        f"delete chain {T} ep",  # an anonymous vmap goes to it
        f"delete set {T} aff",  # a rule updates it
        f"delete map {T} service-ips",  # a rule looks it up
        f"add chain {T} e1\nadd rule {T} services jump e1\ndelete chain {T} e1",
    ):
        message = nft_refused(nft, line + "\n")
        assert "Could not process rule: Device or resource busy" in message, line
    # Dropping the references first, in the same transaction, lets them go; a chain's own
    # rules go with it.
    nft.run(
        f"flush chain {T} service-X\ndelete element {T} service-ips {{ 10.0.0.1 . tcp . 80 }}\n"
        f"delete chain {T} service-X\nflush chain {T} ep\ndelete chain {T} ep\n"
        f"delete set {T} aff\ndelete chain {T} mark-for-masquerade\ndelete chain {T} nat-output\n"
    )
    found = parse_listing(nft.list("list chains ip\nlist sets ip", terse=True))["ip"]
    assert found.chains == {"filter-pre", "services", "reject-chain"}
    assert found.sets == {"cluster-ips"}


def test_nft_rules_need_what_they_name() -> None:
    nft = nft_with_setup()
    assert "/dev/stdin:1:38-42:" in nft_refused(nft, f"add rule {T} services jump ghost\n")
    assert "@ghost" in nft_refused(nft, f"add rule {T} services ip saddr @ghost accept\n")
    assert "No such file" in nft_refused(
        nft, f"add rule {T} services numgen random mod 1 vmap {{ 0 : goto ghost }}\n"
    )
    nft.run(f'add rule {T} services ip saddr 1.1.1.1 accept comment "goto ghost @nothing"\n')
    nft.run(f"insert rule {T} services counter\n")
    assert parse_table(nft.list(f"list chain {T} services")).chains["services"][0] == "counter"


def test_nft_run_stages_stops_at_the_first_refused_stage() -> None:
    nft = FakeNftables()
    stages = [f"add table {T}\n", f"flush chain {T} ghost\n", f"add chain {T} c\n"]
    with pytest.raises(BackendError):
        nft.run_stages(stages)
    assert nft.inputs() == stages[:2]
    assert [refused for _, refused in nft.log] == [False, True]
    assert nft.list("list tables") == "table ip kube-proxy\n"
    assert FakeNftables.writes == ("run", "run_stages")


def test_nft_list_of_a_missing_object_fails() -> None:
    nft = FakeNftables()
    with pytest.raises(BackendError, match="No such file or directory"):
        nft.list(f"list table {T}")
    nft.run(f"add table {T}\n")
    assert nft.list(f"list table {T}") == "table ip kube-proxy {\n}\n"
    with pytest.raises(BackendError, match="No such file or directory"):
        nft.list(f"list chain {T} ghost")
    assert nft.listings == [f"list table {T}"] * 2 + [f"list chain {T} ghost"]
