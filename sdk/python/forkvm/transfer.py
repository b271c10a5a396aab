"""Large transfers, streamed and checked: what ``Controller.upload_file``,
``download_file``, ``upload_tar`` and ``download_tar`` share. An upload names its
body's SHA-256 (``?sha256=``), which the daemon checks before the agent commits it; a
download goes to ``<dest>.partial`` while it is hashed, is compared with the digest the
guest computes (``GET .../files/sha256``) and only then renamed into place. Nothing is
held in memory whole.
"""

from __future__ import annotations

import hashlib
import os
from typing import IO, Callable, Mapping, Optional, Tuple, Union

import httpx

from .errors import ConnectionFailed, error_from_response

__all__ = ["sha256_of_file", "sha256_of_body", "stream_to_file"]

#: Bytes read at a time from a local file.
CHUNK = 1 << 20

PathLike = Union[str, "os.PathLike[str]"]


def sha256_of_file(path: PathLike) -> str:
    """The file's SHA-256 (lowercase hex), read in pieces."""
    h = hashlib.sha256()
    with open(os.fspath(path), "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_of_body(body: Union[bytes, IO[bytes]]) -> str:
    """The SHA-256 of a request body: bytes, or a seekable file read and rewound."""
    if isinstance(body, bytes):
        return hashlib.sha256(body).hexdigest()
    start = body.tell()
    h = hashlib.sha256()
    for chunk in iter(lambda: body.read(CHUNK), b""):
        h.update(chunk)
    body.seek(start)
    return h.hexdigest()


def stream_to_file(
    client: httpx.Client,
    target: str,
    params: Mapping[str, str],
    dest: PathLike,
    *,
    timeout: Optional[float],
    endpoint: str,
    check: Optional[Callable[[int, str], None]] = None,
) -> Tuple[int, str]:
    """``GET target`` into ``dest`` through ``<dest>.partial``; its size and SHA-256.
    ``check(size, sha256)`` may raise to refuse it: then nothing is left at ``dest``."""
    final = os.fspath(dest)
    partial = final + ".partial"
    h = hashlib.sha256()
    total = 0
    try:
        with client.stream(
            "GET", target, params=params, timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout
        ) as resp:
            if resp.status_code >= 300:
                raise error_from_response(resp.status_code, resp.read(), str(resp.request.url))
            with open(partial, "wb") as f:
                for chunk in resp.iter_bytes():
                    f.write(chunk)
                    h.update(chunk)
                    total += len(chunk)
        if check is not None:
            check(total, h.hexdigest())
        os.replace(partial, final)
    except httpx.TransportError as e:
        raise ConnectionFailed(f"cannot talk to forkvmd at {endpoint} (GET {target}): {type(e).__name__}: {e}") from e
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return total, h.hexdigest()
