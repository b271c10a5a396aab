"""Reading ``POST /v1/sandboxes/{id}/exec/stream``: NDJSON events as they arrive.

The daemon sends one JSON object per line (``stdout``/``stderr`` chunks, then one
``exit`` or ``error`` line), but the network cuts the body wherever it likes: in the
middle of a line, or of a multi-byte UTF-8 character. :class:`NdjsonDecoder` buffers
bytes until a newline so each event is parsed whole, and :func:`collect_exec_events`
turns the events into callbacks and one :class:`ExecResult`.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional

import httpx

from .errors import ConnectionFailed, ForkvmError, ProtocolError, error_from_response
from .types import ExecResult

__all__ = ["NdjsonDecoder", "NdjsonStream", "OutputCallback", "collect_exec_events"]

#: Called with each chunk of output text, in order.
OutputCallback = Callable[[str], None]

#: Longest line accepted (an output chunk is far smaller; this bounds memory).
MAX_LINE_BYTES = 64 * 1024 * 1024


class NdjsonDecoder:
    """Splits a byte stream into JSON objects, one per ``\\n``-terminated line."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> List[Dict[str, Any]]:
        """Adds ``chunk`` and returns the objects of every line it completed."""
        self._buf += chunk
        out: List[Dict[str, Any]] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                break
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            obj = self._parse(line)
            if obj is not None:
                out.append(obj)
        if len(self._buf) > MAX_LINE_BYTES:
            raise ProtocolError(f"exec stream: a line is longer than {MAX_LINE_BYTES} bytes")
        return out

    def close(self) -> List[Dict[str, Any]]:
        """Returns the last line's object if the stream ended without a newline."""
        line = bytes(self._buf)
        self._buf.clear()
        obj = self._parse(line)
        return [] if obj is None else [obj]

    @staticmethod
    def _parse(line: bytes) -> Optional[Dict[str, Any]]:
        if not line.strip():
            return None
        try:
            obj = json.loads(line.decode("utf-8"))
        except ValueError as e:
            raise ProtocolError(f"exec stream: bad NDJSON line {line[:200]!r}: {e}") from None
        if not isinstance(obj, dict):
            raise ProtocolError(f"exec stream: line is not a JSON object: {line[:200]!r}")
        return obj


class NdjsonStream:
    """A GET whose answer is NDJSON lines that keep coming (a watch, a process's
    output): opened when made (an error status raises then), read a line at a time with
    :meth:`_next_line`; closing it closes the connection, which ends the stream on the
    daemon's side. ``keepalive_secs``: the daemon's silence between keepalives; six of
    them without a byte is an error, not a hang."""

    def __init__(
        self, client: httpx.Client, path: str, params: Mapping[str, str], endpoint: str, keepalive_secs: float
    ) -> None:
        timeout = httpx.Timeout(30.0, read=keepalive_secs * 6)
        self._url = path
        try:
            self._cm = client.stream("GET", path, params=dict(params), timeout=timeout)
            self._resp = self._cm.__enter__()
        except httpx.TransportError as e:
            raise ConnectionFailed(f"cannot talk to forkvmd at {endpoint} (GET {path}): {type(e).__name__}: {e}") from e
        if self._resp.status_code >= 300:
            body = self._resp.read()
            self._cm.__exit__(None, None, None)
            raise error_from_response(self._resp.status_code, body, str(self._resp.request.url))
        self._decoder = NdjsonDecoder()
        self._chunks = self._resp.iter_raw()
        self._pending: List[Dict[str, Any]] = []
        self._closed = False

    def _next_line(self) -> Optional[Dict[str, Any]]:
        """The next line's object; ``None`` once the body ended."""
        while not self._pending:
            try:
                chunk = next(self._chunks)
            except StopIteration:
                self._pending.extend(self._decoder.close())
                if not self._pending:
                    return None
                break
            except httpx.HTTPError as e:
                raise ConnectionFailed(f"{self._url}: {type(e).__name__}: {e}") from e
            self._pending.extend(self._decoder.feed(chunk))
        return self._pending.pop(0)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._cm.__exit__(None, None, None)

    def __enter__(self) -> "NdjsonStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _events(chunks: Iterable[bytes]) -> Iterator[Dict[str, Any]]:
    dec = NdjsonDecoder()
    for chunk in chunks:
        yield from dec.feed(chunk)
    yield from dec.close()


def collect_exec_events(
    chunks: Iterable[bytes],
    on_stdout: Optional[OutputCallback] = None,
    on_stderr: Optional[OutputCallback] = None,
    url: Optional[str] = None,
) -> ExecResult:
    """Consumes a stream body: calls the callbacks per chunk, returns the result.

    An ``error`` line raises :class:`ForkvmError` with the daemon's text; a stream
    that ends without an ``exit`` line raises :class:`ProtocolError`. Lines of
    unknown ``type`` are skipped (a newer daemon may send more kinds).
    """
    stdout: List[str] = []
    stderr: List[str] = []
    for ev in _events(chunks):
        kind = ev.get("type")
        if kind in ("stdout", "stderr"):
            data = ev.get("data")
            if not isinstance(data, str):
                raise ProtocolError(f"exec stream: {kind} line without string data: {ev!r}", url=url)
            if kind == "stdout":
                stdout.append(data)
                if on_stdout is not None:
                    on_stdout(data)
            else:
                stderr.append(data)
                if on_stderr is not None:
                    on_stderr(data)
        elif kind == "exit":
            merged = dict(ev)
            merged.pop("type", None)
            merged["stdout"] = "".join(stdout)
            merged["stderr"] = "".join(stderr)
            return ExecResult.from_json(merged)
        elif kind == "error":
            message = ev.get("error")
            raise ForkvmError(
                message if isinstance(message, str) else f"exec stream error: {ev!r}",
                code=ev.get("code") if isinstance(ev.get("code"), str) else None,
                url=url,
                body=ev,
            )
    raise ProtocolError("exec stream ended without an exit line", url=url)
