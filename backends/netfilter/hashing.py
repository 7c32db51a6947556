"""Upstream kube-proxy's name hashing, byte for byte: operators grep for these names.

* iptables (and IPVS) chains: ``KUBE-SVC-`` etc. + ``hash16``: the first 16 characters of
  base32(sha256(text));
* nftables objects: ``service-`` etc. + ``hash_and_truncate``: 8 characters of the same
  hash, "-", then the text itself.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
# Two base32 digits per 10 bits: the first 16 digits are exactly the first 80 bits (10 bytes).
_PAIRS16 = [a + b for a in _B32 for b in _B32]


@lru_cache(maxsize=1 << 18)
def hash16(text: str) -> str:
    """First 16 characters of base32(sha256(text)); base64.b32encode is too slow at 100k names."""
    v = int.from_bytes(hashlib.sha256(text.encode()).digest()[:10], "big")
    return "".join([_PAIRS16[(v >> s) & 1023] for s in (70, 60, 50, 40, 30, 20, 10, 0)])


#: knftables.NameLengthMax (nft's NFT_NAME_MAXLEN - 1) minus the longest prefix (16).
NAME_LENGTH_MAX = 256
BASE_LENGTH_MAX = NAME_LENGTH_MAX - 16

#: Two base32 digits per 10 bits: the first 5 digest bytes are exactly 8 characters.
_B32_PAIRS = tuple(_B32[i >> 5] + _B32[i & 31] for i in range(1024))


def hash8(text: str) -> str:
    """The first 8 characters of base32(sha256(text)) (what base32 of the first 5 bytes is)."""
    n = int.from_bytes(hashlib.sha256(text.encode()).digest()[:5], "big")
    p = _B32_PAIRS
    return p[n >> 30] + p[(n >> 20) & 1023] + p[(n >> 10) & 1023] + p[n & 1023]


def hash_and_truncate(name: str) -> str:
    """Upstream's hashAndTruncate: ``HASH8-name``, cut to 240 characters ending in "..."."""
    out = hash8(name) + "-" + name
    if len(out) > BASE_LENGTH_MAX:
        out = out[: BASE_LENGTH_MAX - 3] + "..."
    return out


#: hash_and_truncate results by name text. Hashing is most of the cost of a first full sync
#: (one sha256 per endpoint); later syncs find their names here. Emptied when it grows past
#: the limit, so endpoint churn cannot grow it without bound.
_CACHE: dict[str, str] = {}
CACHE_LIMIT = 1 << 19


def cached_base(text: str) -> str:
    found = _CACHE.get(text)
    if found is None:
        if len(_CACHE) >= CACHE_LIMIT:
            _CACHE.clear()
        found = _CACHE[text] = hash_and_truncate(text)
    return found
