"""A list response's items, decoded one at a time as the response arrives.

A list of a whole cluster is the largest thing kubeplex reads: its text is decoded item by item
(never a second copy of the whole list), the last page while the server is still writing it,
and each page's list metadata is read ahead of its items, so the next page can be asked for
before this one is decoded.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


def list_metadata(data: bytes) -> JSON | None:
    """The top-level ``metadata`` of a list response, read without decoding its items (the
    API server writes ``kind``, ``apiVersion`` and ``metadata`` before ``items``); None if the
    items come first or the text is not such an object (it is then decoded whole)."""
    try:
        text = data[:4096].decode("utf-8", errors="replace")
        pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
        if text[pos : pos + 1] != "{":
            return None
        pos += 1
        while True:
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            key, pos = _DECODER.raw_decode(text, pos)
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if key == "items" or text[pos : pos + 1] != ":":
                return None
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
            value, pos = _DECODER.raw_decode(text, pos)
            if key == "metadata":
                return value if isinstance(value, dict) else {}
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if text[pos : pos + 1] != ",":
                return None
            pos += 1
    except (ValueError, IndexError):
        return None


def list_items(body: Any) -> Iterator[JSON]:
    """The items of a list response, one at a time: decoded from its text item by item (so
    no second copy of the whole list is ever built), or taken from the decoded list."""
    if isinstance(body, StreamedPage):
        yield from _streamed_items(body)
        return
    if isinstance(body, dict):
        got = body.get("items") or []
        yield from (item for item in got if isinstance(item, dict)) if isinstance(got, list) else ()
        return
    text = body.decode("utf-8") if isinstance(body, bytes | bytearray) else str(body)
    start = _items_start(text)
    if start < 0:  # not laid out as the API server writes it: decode it whole
        yield from list_items(json.loads(text))
        return
    pos = _WS.match(text, start).end()  # type: ignore[union-attr]
    if text[pos : pos + 1] == "]":
        return
    while True:
        item, pos = _DECODER.raw_decode(text, pos)
        if isinstance(item, dict):
            yield item
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        sep = text[pos : pos + 1]
        if sep == "]":
            return
        if sep != ",":
            raise ValueError(f"list response: expected ',' or ']' at {pos}, got {sep!r}")
        pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]


def _items_start(text: str) -> int:
    """Where the array of a list response's top-level ``items`` opens (just after its "["),
    reading the members before it; -1 if the text is not such an object."""
    try:
        pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
        if text[pos : pos + 1] != "{":
            return -1
        pos += 1
        while True:
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            key, pos = _DECODER.raw_decode(text, pos)
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if not isinstance(key, str) or text[pos : pos + 1] != ":":
                return -1
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
            if key == "items":
                return pos + 1 if text[pos : pos + 1] == "[" else -1
            _value, pos = _DECODER.raw_decode(text, pos)
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if text[pos : pos + 1] != ",":
                return -1
            pos += 1
    except (ValueError, IndexError):
        return -1


#: How much of a list response is read at a time while its items are decoded.
_CHUNK = 1 << 16


@dataclass
class StreamedPage:
    """The last page of a list, still arriving: ``head`` (read to find its list metadata),
    then ``rest``; its items are decoded as they come in (an API server that streams lists,
    as kube-apiserver does since 1.33, is still writing the later ones). ``release(read)``
    gives the connection back: for reuse once the page is all read, closed if not."""

    head: bytes
    rest: Iterator[bytes]
    release: Callable[[bool], None]


def _streamed_items(page: StreamedPage) -> Iterator[JSON]:
    """The items of a streamed page, each decoded once it is complete: what is incomplete
    at the end of the text read so far is decoded again with more text (a failure counts
    only when the response has ended)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    text = decoder.decode(page.head)
    ended = read = False

    def more() -> bool:
        nonlocal text, ended
        for chunk in page.rest:
            if chunk:
                text += decoder.decode(chunk)
                return True
        if not ended:
            text += decoder.decode(b"", final=True)
            ended = True
        return False

    try:
        start = _items_start(text)
        while start < 0 and more():
            start = _items_start(text)
        if start < 0:  # not laid out as the API server writes it: decode it whole
            while more():
                pass
            read = True
            yield from list_items(text)
            return
        pos = start
        while True:
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if pos == len(text) and more():
                continue
            if text[pos : pos + 1] == "]":
                read = _drained(more)
                return
            try:
                item, end = _DECODER.raw_decode(text, pos)
            except ValueError:
                # Incomplete, or broken: twice as much text before the next try, so an item
                # longer than many chunks is decoded a few times, not once per chunk.
                before = len(text)
                want = pos + 2 * (before - pos)
                while len(text) < want and more():
                    pass
                if len(text) > before:
                    continue
                raise
            if isinstance(item, dict):
                yield item
            pos = _WS.match(text, end).end()  # type: ignore[union-attr]
            while pos == len(text) and more():
                pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            sep = text[pos : pos + 1]
            if sep == "]":
                read = _drained(more)
                return
            if sep != ",":
                raise ValueError(f"list response: expected ',' or ']' at {pos}, got {sep!r}")
            pos += 1
            if pos > _CHUNK:  # what is decoded goes: the text held stays about a chunk
                text, pos = text[pos:], 0
    finally:
        page.release(read)


def _drained(more: Callable[[], bool]) -> bool:
    """Read what follows the items (the closing brace) to the response's end: True, the
    connection can be reused."""
    while more():
        pass
    return True


def read_page(resp: Any) -> tuple[Any, JSON]:
    """A list response's page and its list metadata. The metadata comes before the items (as
    the API server writes them): the last page (no continue token) is handed on still
    arriving, a :class:`StreamedPage`; another is read whole, its connection free for the next
    request; a response laid out otherwise is decoded whole here."""
    chunks = _blocks(resp)
    head = b""
    try:
        meta = None
        for chunk in chunks:
            head += chunk
            meta = list_metadata(head)
            if meta is not None or len(head) >= 4096:
                break
        if meta is not None and not (meta.get("continue") or ""):
            return StreamedPage(head, chunks, lambda read: _release_connection(resp, read)), meta
        data = head + b"".join(chunks)
    except BaseException:
        _release_connection(resp, False)
        raise
    _release_connection(resp, True)
    if meta is None:  # no metadata before the items: decode it all here
        body = json.loads(data)
        return body, body.get("metadata") or {}
    return data, meta


def _blocks(resp: Any) -> Iterator[bytes]:
    """A response's body in blocks of ``_CHUNK`` bytes (the last one shorter), however the
    server cut it: Go's server sends a streamed list in chunks of about 2 KB, and each piece
    appended to the text and decoded again costs far more than its bytes."""
    while True:
        block = resp.read(_CHUNK, decode_content=True)
        if not block:
            return
        yield block


def _release_connection(resp: Any, read: bool) -> None:
    """Give a response's connection back to the pool: closed unless the response was read to
    its end (what is left of it must not be taken for the next response)."""
    if not read:
        resp.close()
    resp.release_conn()
