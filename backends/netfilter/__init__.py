"""A library for netfilter backends (not a mode): the iptables-save/-restore seam, its
all-or-nothing rollback, and upstream's name hashing. The iptables mode uses it, and IPVS will;
``nft`` (nftables transactions through ``nft -f`` in a netns) serves the nftables mode and the
ebpf mode's entry points for traffic from other hosts."""
