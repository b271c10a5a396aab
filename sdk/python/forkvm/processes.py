"""Background processes: ``/v1/sandboxes/{id}/processes*``.

A background process runs on after the call that started it; the sandbox's agent keeps
its output (the last ``ring_bytes``, 1 MiB by default) so that any later call reads it
from an offset, while it runs or after it ended. :class:`ProcessOutput` is such a read
(``GET .../output``, NDJSON lines): iterating yields :class:`OutputChunk` records as
they come, and once it is over :attr:`ProcessOutput.process` says how the process stands
(how it ended, when following). :class:`Process` is the handle ``sandbox.commands.run(
..., background=True)`` and ``sandbox.pty.create()`` return.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterator, Optional, Union

import httpx

from .errors import ForkvmError, ProtocolError
from .streaming import NdjsonStream
from .types import ProcessInfo

if TYPE_CHECKING:
    from .attach import ProcessSocket
    from .controller import Controller

__all__ = ["OutputChunk", "ProcessOutput", "Process"]

#: The daemon sends a keepalive line after this long without output.
KEEPALIVE_SECS = 5.0


@dataclass(frozen=True)
class OutputChunk:
    """Bytes a process wrote: ``stream`` is ``stdout`` or ``stderr`` (a terminal's are
    all ``stdout``); ``offset`` is that of the first byte."""

    stream: str
    offset: int
    data: bytes


class ProcessOutput(NdjsonStream):
    """A read of a process's output: iterate for :class:`OutputChunk` records; after
    the last, :attr:`process` is set. ``close()`` stops reading (the process runs on)."""

    def __init__(self, client: httpx.Client, path: str, params: Dict[str, str], endpoint: str) -> None:
        super().__init__(client, path, params, endpoint, KEEPALIVE_SECS)
        #: The process as it stood when the read ended (``None`` until then).
        self.process: Optional[ProcessInfo] = None
        first = self._next_line()
        if first is None or first.get("type") != "from":
            self.close()
            raise ProtocolError(f"process output: the first line is not `from`: {first!r}", url=self._url)
        #: Where the output starts.
        self.offset: int = int(first.get("offset", 0))
        #: Bytes asked for that had left the ring (the output starts after them).
        self.skipped: int = int(first.get("skipped", 0))

    def __iter__(self) -> Iterator[OutputChunk]:
        while not self._closed:
            line = self._next_line()
            if line is None:
                raise ProtocolError("process output: the stream ended without an `end` line", url=self._url)
            kind = line.get("type")
            if kind == "output":
                data = base64.b64decode(str(line.get("data", "")))
                yield OutputChunk(stream=str(line.get("stream")), offset=int(line.get("offset", 0)), data=data)
            elif kind == "from":
                # A follower that fell behind the ring: the output resumes there.
                self.skipped += int(line.get("skipped", 0))
            elif kind == "end":
                self.process = ProcessInfo.from_json(line.get("process"))
                self.close()
                return
            elif kind == "error":
                self.close()
                message = line.get("error")
                raise ForkvmError(message if isinstance(message, str) else f"process output: {line!r}", url=self._url)
            # keepalive, and kinds a newer daemon may add: skipped.

    def read_all(self) -> bytes:
        """Every byte to the end of the read (stdout and stderr as they came)."""
        return b"".join(c.data for c in self)

    def __enter__(self) -> "ProcessOutput":
        return self


class Process:
    """A background process of a sandbox, by pid."""

    def __init__(self, controller: "Controller", sandbox_id: str, info: ProcessInfo) -> None:
        self._c = controller
        self.sandbox_id = sandbox_id
        self.pid = info.pid
        #: What the process looked like when this handle was made or last refreshed.
        self.info = info

    def __repr__(self) -> str:
        return f"Process(sandbox={self.sandbox_id!r}, pid={self.pid}, argv={self.info.argv!r})"

    def refresh(self) -> ProcessInfo:
        """Its current state (:class:`NotFound` once the agent dropped it)."""
        for p in self._c.list_processes(self.sandbox_id):
            if p.pid == self.pid:
                self.info = p
                return p
        from .errors import NotFound

        raise NotFound(f"sandbox {self.sandbox_id} keeps no process {self.pid}")

    def output(self, offset: Optional[int] = None, *, follow: bool = False) -> ProcessOutput:
        """Its output from ``offset`` (the oldest kept by default); ``follow`` until
        it ends."""
        return self._c.process_output(self.sandbox_id, self.pid, offset=offset, follow=follow)

    def wait(self) -> ProcessInfo:
        """Waits until it ended (reading its output to the end); how it stands then."""
        with self.output(self.info.output_end, follow=True) as out:
            for _ in out:
                pass
        assert out.process is not None
        self.info = out.process
        return out.process

    def send_stdin(self, data: Union[bytes, str], *, close: bool = False) -> int:
        """Writes ``data`` (str as UTF-8) to its stdin; ``close`` ends its input after."""
        return self._c.process_input(self.sandbox_id, self.pid, data, close=close)

    def close_stdin(self) -> None:
        self._c.process_input(self.sandbox_id, self.pid, b"", close=True)

    def kill(self, signal: int = 9) -> None:
        """Sends ``signal`` (KILL by default) to its process group."""
        self._c.signal_process(self.sandbox_id, self.pid, signal)

    def resize(self, rows: int, cols: int) -> None:
        """Its terminal's new size."""
        self._c.resize_process(self.sandbox_id, self.pid, rows, cols)

    def attach(self, offset: Optional[int] = None) -> "ProcessSocket":
        """Its output from ``offset`` (the oldest kept by default) and its input on one
        WebSocket: what a terminal needs. Closing it detaches; the process runs on."""
        return self._c.attach_process(self.sandbox_id, self.pid, offset=offset)
