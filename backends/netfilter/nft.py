"""nftables text handed to ``nft -f -`` in a node's network namespace: the way the modes that
write nftables (the nftables mode where its netlink encoder does not reach, the ebpf mode's
entry points for traffic from other hosts) commit a transaction and read tables back.

``nft -f`` commits a file as one transaction: all of it or, if the kernel refuses any part,
none of it (BackendError, with nft's message).
"""

from __future__ import annotations

from kubeplex.core.dataplane import execer

#: The nft executable.
NFT = "nft"


def transaction_timeout(text: str) -> float:
    """Seconds allowed for ``text``: the kernel binds each anonymous set by walking the whole
    transaction, so a big one costs more than its length (O(N^2) in its Services)."""
    return 60.0 + text.count("\n") / 1000


def run_transaction(text: str, netns: str | None, nft: str = NFT) -> None:
    """Commit ``text`` (nft -f syntax) as one transaction in ``netns`` (None: the host's)."""
    execer.run([nft, "-f", "-"], netns, input=text, timeout=transaction_timeout(text))


def run_listing(commands: str, netns: str | None, terse: bool = False, nft: str = NFT) -> str:
    """What ``nft [-t] -f -`` prints for ``commands`` (list commands only); BackendError if
    nft fails (a table that is not there, for one)."""
    argv = [nft, *(["-t"] if terse else []), "-f", "-"]
    return execer.run(argv, netns, input=commands).stdout


def tables(netns: str | None, nft: str = NFT) -> list[tuple[str, str]]:
    """The (family, name) of every table in ``netns``."""
    out = []
    for line in run_listing("list tables\n", netns, nft=nft).splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "table":
            out.append((words[1], words[2]))
    return out
