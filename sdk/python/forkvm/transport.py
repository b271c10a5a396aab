"""Where the daemon is and how to reach it: endpoint resolution, auth, path quoting.

The rules match the daemon's own (``forkvm daemon`` listens on
``$FORKVM_RUN/forkvmd.sock`` by default, and the run root falls back exactly like the
sandbox registry's), so a client with no configuration finds a daemon started with
none. Kept apart from the Controller so the rules can be tested without HTTP.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Union
from urllib.parse import quote

import httpx

__all__ = [
    "Endpoint",
    "SOCKET_NAME",
    "UDS_BASE_URL",
    "default_run_root",
    "default_socket_path",
    "resolve_endpoint",
    "resolve_token",
    "quote_segment",
    "make_client",
]

#: File name of the daemon's socket inside the run root.
SOCKET_NAME = "forkvmd.sock"
#: Base URL used for requests over a Unix socket (the host part is never resolved).
UDS_BASE_URL = "http://forkvmd"


@dataclass(frozen=True)
class Endpoint:
    """A resolved daemon address.

    ``base_url`` is what httpx is given; ``uds`` is the socket path when the daemon
    is on a Unix socket (then ``base_url`` is :data:`UDS_BASE_URL`).
    """

    base_url: str
    uds: Optional[str] = None

    def __str__(self) -> str:
        return f"unix:{self.uds}" if self.uds is not None else self.base_url


def default_run_root(environ: Optional[Mapping[str, str]] = None, uid: Optional[int] = None) -> str:
    """The run root: ``$FORKVM_RUN``, ``$XDG_RUNTIME_DIR/forkvm``, ``/run/forkvm`` for
    root, else ``$TMPDIR/forkvm-<uid>`` (``/tmp`` without ``TMPDIR``), as the registry."""
    env = os.environ if environ is None else environ
    if env.get("FORKVM_RUN"):
        return env["FORKVM_RUN"]
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "forkvm")
    if uid is None:
        uid = os.getuid()
    if uid == 0:
        return "/run/forkvm"
    return os.path.join(env.get("TMPDIR") or "/tmp", f"forkvm-{uid}")


def default_socket_path(environ: Optional[Mapping[str, str]] = None, uid: Optional[int] = None) -> str:
    """The daemon's default socket: ``<run root>/forkvmd.sock``."""
    return os.path.join(default_run_root(environ, uid), SOCKET_NAME)


def _parse(spec: str, source: str) -> Endpoint:
    spec = spec.strip()
    if spec.startswith("unix:"):
        path = spec[len("unix:") :]
        if path.startswith("//"):  # unix:///path
            path = path[2:]
        if not path:
            raise ValueError(f"{source}: {spec!r} names no socket path")
        return Endpoint(base_url=UDS_BASE_URL, uds=path)
    if spec.startswith("/"):
        return Endpoint(base_url=UDS_BASE_URL, uds=spec)
    if spec.startswith("http://") or spec.startswith("https://"):
        rest = spec.split("://", 1)[1]
        if not rest or rest.startswith("/"):
            raise ValueError(f"{source}: {spec!r} names no host")
        return Endpoint(base_url=spec.rstrip("/"))
    raise ValueError(
        f"{source}: {spec!r} is not a daemon address "
        "(use unix:/path/to/forkvmd.sock, http://host:port or https://host:port)"
    )


def resolve_endpoint(
    base_url: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
    uid: Optional[int] = None,
) -> Endpoint:
    """The daemon address: ``base_url`` if given, else ``$FORKVM_DAEMON``, else the
    default Unix socket (:func:`default_socket_path`)."""
    env = os.environ if environ is None else environ
    if base_url:
        return _parse(base_url, "base_url")
    if env.get("FORKVM_DAEMON"):
        return _parse(env["FORKVM_DAEMON"], "FORKVM_DAEMON")
    return Endpoint(base_url=UDS_BASE_URL, uds=default_socket_path(env, uid))


def resolve_token(token: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The bearer token: ``token`` if given, else ``$FORKVM_TOKEN``, else none."""
    if token is not None:
        return token or None
    env = os.environ if environ is None else environ
    return env.get("FORKVM_TOKEN") or None


def quote_segment(value: str) -> str:
    """Quotes one path parameter so it stays one segment.

    ``/`` becomes ``%2F``, and a segment of only dots (``.``, ``..``), which
    ``quote`` leaves alone and URL normalisation would resolve, gets its dots
    encoded as ``%2E``, so an id can never walk to another route.
    """
    if not isinstance(value, str):
        raise TypeError(f"a path parameter must be a str, got {type(value).__name__}")
    if value == "":
        raise ValueError("a path parameter (sandbox id or tag) must not be empty")
    quoted = quote(value, safe="")
    if set(quoted) == {"."}:
        quoted = quoted.replace(".", "%2E")
    return quoted


def make_client(
    endpoint: Endpoint,
    token: Optional[str],
    timeout: float,
    verify: Union[bool, str] = True,
) -> httpx.Client:
    """An httpx client bound to ``endpoint``, sending ``token`` as a bearer token.

    ``verify`` is httpx's TLS setting (``False``, or a CA bundle path for a daemon
    with its own certificate). Proxy settings from the environment apply to TCP
    endpoints only: a Unix socket request must never be sent to an HTTP proxy.
    """
    headers: Dict[str, str] = {"User-Agent": "forkvm-python"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    transport = httpx.HTTPTransport(uds=endpoint.uds) if endpoint.uds is not None else None
    return httpx.Client(
        base_url=endpoint.base_url,
        headers=headers,
        timeout=httpx.Timeout(timeout),
        transport=transport,
        verify=verify,
        trust_env=endpoint.uds is None,
    )
