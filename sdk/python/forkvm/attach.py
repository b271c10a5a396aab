"""A background process on a WebSocket: ``GET /v1/sandboxes/{id}/processes/{pid}/attach``.

One connection carries the process's output out and its input in, as a terminal needs
it: :meth:`ProcessSocket.recv` yields :class:`~forkvm.processes.OutputChunk` records
until the process ends (then :attr:`ProcessSocket.process` says how), :meth:`send` types,
:meth:`resize`, :meth:`signal` and :meth:`close_stdin` are controls, and :meth:`close`
detaches (the process runs on; attach again from any offset). The socket is opened over
the daemon's Unix socket or TCP (TLS included) like every call, by the ``websockets``
library.
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, Iterator, Optional, Union

from .errors import ConnectionFailed, ForkvmError, ProtocolError, error_from_response
from .processes import OutputChunk
from .tcp import connect_socket
from .transport import Endpoint
from .types import ProcessInfo

__all__ = ["ProcessSocket"]

#: The first byte of an output message: its stream.
_STREAMS = {1: "stdout", 2: "stderr"}


class ProcessSocket:
    """An attachment to a background process over a WebSocket (see the module doc)."""

    def __init__(
        self,
        endpoint: Endpoint,
        target: str,
        token: Optional[str],
        *,
        timeout: float = 30.0,
        verify: Union[bool, str] = True,
    ) -> None:
        try:
            from websockets.exceptions import InvalidStatus
            from websockets.sync.client import connect
        except ImportError as e:  # pragma: no cover - a dependency of the package
            raise ForkvmError("attaching to a process needs the `websockets` package (pip install websockets)") from e
        try:
            sock, host = connect_socket(endpoint, timeout, verify)
        except OSError as e:
            raise ConnectionFailed(f"cannot talk to forkvmd at {endpoint}: {e}") from e
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._url = target
        try:
            # The socket is already connected (and TLS-wrapped): the URI only names the
            # Host and the path.
            opened = connect(
                f"ws://{host}{target}",
                sock=sock,
                additional_headers=headers,
                compression=None,
                open_timeout=timeout,
                max_size=None,
            )
            # A connection (websockets < 17) or what opens one when entered (17 and
            # later); entering either gives the connection, closed by `close()`.
            self._ws = opened.__enter__()
        except InvalidStatus as e:
            sock.close()
            status = e.response.status_code
            if status >= 300:
                raise error_from_response(status, bytes(e.response.body or b""), target) from None
            raise ProtocolError(f"{target}: expected 101 Switching Protocols, got {status}", url=target) from None
        except Exception as e:
            sock.close()
            raise ConnectionFailed(f"attaching to {target}: {type(e).__name__}: {e}", url=target) from e
        #: The offset of the next output byte.
        self.offset = 0
        #: Bytes asked for that had left the ring.
        self.skipped = 0
        #: How the process stood when it ended (``None`` while it runs).
        self.process: Optional[ProcessInfo] = None
        self._closed = False
        #: Output read past what :meth:`read_until` returned, handed out first.
        self._pending: Optional[OutputChunk] = None
        first = self._event(timeout)
        if first is None or first.get("type") != "from":
            self.close()
            raise ProtocolError(f"process socket: the first message is not `from`: {first!r}", url=target)
        self.offset = int(first.get("offset", 0))
        self.skipped = int(first.get("skipped", 0))

    def __enter__(self) -> "ProcessSocket":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[OutputChunk]:
        while True:
            chunk = self.recv()
            if chunk is None:
                return
            yield chunk

    def recv(self, timeout: Optional[float] = None) -> Optional[OutputChunk]:
        """The next output, waiting up to ``timeout`` seconds (:class:`TimeoutError`
        after); ``None`` once the process ended (:attr:`process` is then set)."""
        from websockets.exceptions import ConnectionClosed

        if self._pending is not None:
            chunk, self._pending = self._pending, None
            return chunk
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                msg = self._ws.recv(timeout=left)
            except ConnectionClosed as e:
                self._closed = True
                if self.process is not None:
                    return None
                raise ProtocolError(f"process socket: closed before the process ended ({e})", url=self._url) from e
            if isinstance(msg, bytes):
                if not msg or msg[0] not in _STREAMS:
                    raise ProtocolError(f"process socket: an output message of stream {msg[:1]!r}", url=self._url)
                chunk = OutputChunk(stream=_STREAMS[msg[0]], offset=self.offset, data=msg[1:])
                self.offset += len(chunk.data)
                return chunk
            self._take(json.loads(msg))
        return None

    def read_until(self, wanted: Union[bytes, str], timeout: float = 30.0) -> bytes:
        """Output up to and including the first ``wanted``, waiting up to ``timeout``
        seconds in all (:class:`TimeoutError` after, :class:`ProtocolError` if the
        process ended first). What came after it is kept for the next read."""
        want = wanted.encode() if isinstance(wanted, str) else bytes(wanted)
        deadline = time.monotonic() + timeout
        seen = b""
        while True:
            chunk = self.recv(max(0.0, deadline - time.monotonic()))
            if chunk is None:
                raise ProtocolError(f"the process ended before it wrote {want!r}: {seen[-200:]!r}", url=self._url)
            seen += chunk.data
            at = seen.find(want)
            if at >= 0:
                end = at + len(want)
                # What came after the match is in the last chunk: kept for the next read.
                rest = seen[end:]
                if rest:
                    offset = chunk.offset + len(chunk.data) - len(rest)
                    self._pending = OutputChunk(stream=chunk.stream, offset=offset, data=rest)
                return seen[:end]

    def send(self, data: Union[bytes, str]) -> None:
        """Bytes (str as UTF-8) to the process's stdin: keys, on a terminal."""
        self._ws.send(data.encode("utf-8") if isinstance(data, str) else bytes(data))

    def resize(self, rows: int, cols: int) -> None:
        """The terminal's new size."""
        self._control({"type": "resize", "rows": int(rows), "cols": int(cols)})

    def close_stdin(self) -> None:
        """Ends the process's input (on a terminal: end-of-file)."""
        self._control({"type": "close_stdin"})

    def signal(self, signal: int) -> None:
        """``signal`` to the process's group."""
        self._control({"type": "signal", "signal": int(signal)})

    def close(self) -> None:
        """Detaches: the process runs on."""
        self._closed = True
        self._ws.close()

    def _control(self, control: Dict[str, Any]) -> None:
        self._ws.send(json.dumps(control))

    def _event(self, timeout: float) -> Optional[Dict[str, Any]]:
        msg = self._ws.recv(timeout=timeout)
        return json.loads(msg) if isinstance(msg, str) else None

    def _take(self, event: Dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "from":
            # Fell behind the ring: the output resumes there.
            self.skipped += int(event.get("skipped", 0))
            self.offset = int(event.get("offset", self.offset))
        elif kind == "end":
            self.process = ProcessInfo.from_json(event.get("process"))
        elif kind == "error":
            self._closed = True
            message = event.get("error")
            raise ForkvmError(message if isinstance(message, str) else f"process socket: {event!r}", url=self._url)
        # keepalive, and kinds a newer daemon may add: skipped.
