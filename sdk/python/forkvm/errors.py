"""Exceptions raised by the SDK, one class per kind of failure.

forkvmd answers every error with ``{"error": "...", "code": "...", "state"?: "..."}``
and a status code. Callers want to tell "no such sandbox" from "tag already taken"
from "daemon not running" without parsing text, so each status maps to a class here
and the server's own words stay available as ``.message`` (and in ``str(e)``).
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Type

__all__ = [
    "ForkvmError",
    "BadRequest",
    "Unauthorized",
    "NotFound",
    "Conflict",
    "Busy",
    "DiskFull",
    "BadGateway",
    "Forbidden",
    "ServerError",
    "ConnectionFailed",
    "ProtocolError",
    "EvalError",
    "ControllerError",
    "error_from_response",
]


class ForkvmError(Exception):
    """Base of every SDK error.

    Attributes:
        status: HTTP status code, or ``None`` when no response was received.
        code: the server's machine-readable code (``not_found``, ``conflict``, ...).
        message: the server's ``error`` text (or the SDK's own description).
        state: the object's current state, for conflicts (e.g. ``writing``).
        url: the request's URL (for a Unix socket, ``http://forkvmd/...``).
        body: the decoded error body (dict, or text when it was not JSON).
    """

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        state: Optional[str] = None,
        url: Optional[str] = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.state = state
        self.url = url
        self.body = body

    def __str__(self) -> str:
        parts = [self.message]
        detail = []
        if self.status is not None:
            detail.append(f"HTTP {self.status}")
        if self.code:
            detail.append(self.code)
        if self.state:
            detail.append(f"state={self.state}")
        if detail:
            parts.append(f"({', '.join(detail)})")
        if self.url:
            parts.append(f"[{self.url}]")
        return " ".join(parts)


class BadRequest(ForkvmError):
    """400: malformed request, unknown field, bad tag or id, bad value."""


class Unauthorized(ForkvmError):
    """401: missing or wrong bearer token (TCP listener only)."""


class Forbidden(ForkvmError):
    """403: refused by policy (a browser's origin; an exposed port's token that is
    another sandbox's or port's)."""


class NotFound(ForkvmError):
    """404: no such sandbox, snapshot or file."""


class Conflict(ForkvmError):
    """409: the object is in the wrong state (see ``.state``) or the tag exists."""


class Busy(ForkvmError):
    """503: a concurrency cap was reached (e.g. branches); retry later."""


class DiskFull(ForkvmError):
    """507: the snapshot store ran out of space."""


class BadGateway(ForkvmError):
    """502: a sandbox's guest did not answer on the port asked for (nothing listens)."""


class ServerError(ForkvmError):
    """Any other 5xx: the daemon failed internally."""


class ConnectionFailed(ForkvmError):
    """The daemon could not be reached or the connection broke (no HTTP status)."""


class ProtocolError(ForkvmError):
    """The daemon answered something this SDK cannot understand (bad JSON, missing field)."""


class EvalError(ForkvmError):
    """Code given to ``Sandbox.eval`` raised; ``.traceback`` is the guest's traceback text."""

    def __init__(self, message: str, *, traceback: str, stdout: str = "", stderr: str = "") -> None:
        super().__init__(message)
        self.traceback = traceback
        self.stdout = stdout
        self.stderr = stderr


#: forkd's SDK raised ``ControllerError`` for every non-2xx answer.
ControllerError = ForkvmError

_BY_STATUS: Dict[int, Type[ForkvmError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    503: Busy,
    507: DiskFull,
}


def _class_for(status: int) -> Type[ForkvmError]:
    cls = _BY_STATUS.get(status)
    if cls is not None:
        return cls
    if 500 <= status <= 599:
        return ServerError
    return ForkvmError


def error_from_response(status: int, body: bytes, url: Optional[str] = None) -> ForkvmError:
    """Builds the exception for a non-2xx answer from its status and raw body.

    A JSON error body gives ``message``, ``code`` and ``state``; anything else (a proxy's
    HTML page, an empty body) becomes the message as text, so nothing is lost.
    """
    parsed: Any = None
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text) if text.strip() else None
    except ValueError:
        parsed = None
    message: str
    code: Optional[str] = None
    state: Optional[str] = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        message = parsed["error"]
        if isinstance(parsed.get("code"), str) and parsed["code"]:
            code = parsed["code"]
        if isinstance(parsed.get("state"), str):
            state = parsed["state"]
    else:
        snippet = text.strip()
        if len(snippet) > 500:
            snippet = snippet[:500] + "..."
        message = snippet or f"HTTP {status} with an empty body"
    # A 502 is the daemon's own only with its code (a proxy in front answers 502 too).
    cls = BadGateway if status == 502 and code == "bad_gateway" else _class_for(status)
    return cls(
        message,
        status=status,
        code=code,
        state=state,
        url=url,
        body=parsed if parsed is not None else text,
    )
