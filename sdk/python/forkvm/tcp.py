"""Raw TCP to a sandbox's guest port through the daemon: ``GET /v1/sandboxes/{id}/tcp/{port}``
upgraded to ``tcp`` (what ``forkvm port-forward`` rides on). httpx does not hand over a
connection after a 101, so this speaks the one request itself, over the daemon's Unix
socket or TCP (TLS included), and returns the socket once the guest's port accepted.
"""

from __future__ import annotations

import socket
import ssl
from typing import Optional, Tuple, Union
from urllib.parse import urlsplit

from .errors import ConnectionFailed, ProtocolError, error_from_response
from .transport import Endpoint

__all__ = ["open_tcp", "connect_socket"]

#: Largest answer head read before the stream starts.
MAX_HEAD = 16 << 10


def connect_socket(endpoint: Endpoint, timeout: float, verify: Union[bool, str]) -> Tuple[socket.socket, str]:
    """A connection to the daemon (TLS-wrapped for https) and the Host it answers as."""
    if endpoint.uds is not None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(endpoint.uds)
        return s, "forkvmd"
    url = urlsplit(endpoint.base_url)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if url.scheme == "https":
        ctx = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
        if verify is False:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        s = ctx.wrap_socket(s, server_hostname=host)
    return s, url.netloc


def _read_head(s: socket.socket) -> bytes:
    """The answer's head, read a byte at a time so no byte of the stream is taken."""
    head = bytearray()
    while not head.endswith(b"\r\n\r\n"):
        b = s.recv(1)
        if not b:
            raise ProtocolError(f"the daemon closed the connection before answering ({bytes(head[:200])!r})")
        head += b
        if len(head) > MAX_HEAD:
            raise ProtocolError("the daemon's answer head is too large")
    return bytes(head)


def open_tcp(
    endpoint: Endpoint,
    target: str,
    token: Optional[str],
    *,
    timeout: float = 30.0,
    verify: Union[bool, str] = True,
) -> socket.socket:
    """A socket carrying bytes to and from the guest port ``target`` names, in blocking
    mode. The daemon's errors (no such sandbox, nothing listening: :class:`BadGateway`)
    raise as for any call."""
    try:
        s, host = connect_socket(endpoint, timeout, verify)
    except OSError as e:
        raise ConnectionFailed(f"cannot talk to forkvmd at {endpoint}: {e}") from e
    try:
        lines = [f"GET {target} HTTP/1.1", f"Host: {host}", "Connection: Upgrade", "Upgrade: tcp"]
        if token:
            lines.append(f"Authorization: Bearer {token}")
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = _read_head(s)
        status_line, _, rest = head.decode("latin-1").partition("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise ProtocolError(f"the daemon's answer starts {status_line!r}")
        status = int(parts[1])
        if status != 101:
            length = 0
            for line in rest.split("\r\n"):
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length" and value.strip().isdigit():
                    length = min(int(value.strip()), 1 << 20)
            body = b""
            while len(body) < length:
                chunk = s.recv(length - len(body))
                if not chunk:
                    break
                body += chunk
            if status >= 300:
                raise error_from_response(status, body, target)
            raise ProtocolError(f"{target}: expected 101 Switching Protocols, got {status}")
        s.settimeout(None)
        return s
    except BaseException:
        s.close()
        raise
