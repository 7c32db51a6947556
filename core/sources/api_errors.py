"""What a failed request to the API server means to a reflector, and how a log line tells it."""

from __future__ import annotations

import contextlib
import json

from kubeplex.core.model.errors import clip
from kubeplex.core.sources.kubeclient import ApiException

#: Characters of a log line's text quoting a user or the server.
LOG_TEXT_LIMIT = 4096


def resource_version_unavailable(err: ApiException) -> bool:
    """A list's resourceVersion is gone or not there yet: 410 Expired/Gone, or the 504
    Timeout whose cause is ResourceVersionTooLarge (client-go's isExpiredError and
    isTooLargeResourceVersionError, the older servers' message included)."""
    if err.status == 410:
        return True
    if err.status != 504:
        return False
    try:
        status = json.loads(err.body or "{}")
    except (ValueError, TypeError):
        return False
    if not isinstance(status, dict):
        return False
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    for cause in causes if isinstance(causes, list) else []:
        if isinstance(cause, dict) and (
            cause.get("reason") == "ResourceVersionTooLarge"
            or cause.get("message") == "Too large resource version"
        ):
            return True
    return "Too large resource version" in str(status.get("message", ""))


def connection_refused(err: BaseException) -> bool:
    """ECONNREFUSED anywhere in the chain (urllib3 wraps it twice), as Go's
    ``utilnet.IsConnectionRefused`` finds it: the server is down, the watch can wait for it."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ConnectionRefusedError):
            return True
        seen.add(id(cause))
        reason = getattr(cause, "reason", None)
        cause = (
            reason if isinstance(reason, BaseException) else cause.__cause__ or cause.__context__
        )
    return False


def describe_failure(err: BaseException) -> str:
    if isinstance(err, ApiException):
        message = ""
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = json.loads(err.body or "{}").get("message", "")
        text = f"HTTP {err.status} {err.reason}" + (f": {message}" if message else "")
    else:
        text = f"{type(err).__name__}: {err}"
    # A server's message may quote an object's values: bounded, like anything quoting them.
    return clip(text, LOG_TEXT_LIMIT)
