"""Reading ``GET /v1/sandboxes/{id}/files/watch``: a directory's changes as they happen.

The daemon arms the watch in the guest (inotify) before it answers, then sends one JSON
line per change (``armed`` first, a ``keepalive`` after 5 s without a change, ``end``
or ``error`` last). :class:`FileWatch` reads the ``armed`` line when it is made, so
every change the caller makes after creating it is reported; iterating yields
:class:`FileChange` records; closing it (or leaving its ``with`` block) closes the
connection, which ends the watch in the guest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional

import httpx

from .errors import ForkvmError, ProtocolError
from .streaming import NdjsonStream

__all__ = ["FileChange", "FileWatch", "KEEPALIVE_SECS"]

#: The daemon sends a keepalive line after this long without a change.
KEEPALIVE_SECS = 5.0


@dataclass(frozen=True)
class FileChange:
    """One change below a watched directory."""

    #: ``create``, ``write``, ``remove``, ``rename`` or ``chmod``; ``overflow`` when the
    #: guest kernel's queue overflowed and changes were lost (``path`` is then empty).
    kind: str
    #: Relative to the watched directory.
    path: str


class FileWatch(NdjsonStream):
    """A running watch: iterate for :class:`FileChange` records; ``close()`` ends it."""

    def __init__(self, client: httpx.Client, path: str, params: Dict[str, str], endpoint: str) -> None:
        super().__init__(client, path, params, endpoint, KEEPALIVE_SECS)
        first = self._next_line()
        if first is None or first.get("type") != "armed":
            self.close()
            raise ProtocolError(f"watch: the first line is not `armed`: {first!r}", url=self._url)
        #: Directories the watch covers (1 unless recursive).
        self.directories: int = int(first.get("directories", 1))

    def __iter__(self) -> Iterator[FileChange]:
        while not self._closed:
            line = self._next_line()
            if line is None:
                raise ProtocolError("watch: the stream ended without an `end` line", url=self._url)
            kind = line.get("type")
            if kind == "change":
                yield FileChange(kind=str(line.get("kind")), path=str(line.get("path")))
            elif kind == "overflow":
                yield FileChange(kind="overflow", path="")
            elif kind == "end":
                self.close()
                return
            elif kind == "error":
                self.close()
                message = line.get("error")
                raise ForkvmError(message if isinstance(message, str) else f"watch error: {line!r}", url=self._url)
            # keepalive, and kinds a newer daemon may add: skipped.

    def __enter__(self) -> "FileWatch":
        return self
