"""``Controller``: one method per forkvmd REST v1 route, typed answers, typed errors.

This is the low-level client: it knows the routes and the JSON shapes and nothing
else, so it maps one-to-one onto ``crates/forkvm-api/src/routes.rs``. Method names
follow forkd's Python SDK (``spawn_sandboxes``, ``exec_command``, ...) so code
written for forkd ports by changing the import. :mod:`forkvm.sandbox` builds the
friendlier object API on top.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import os
import socket
import tarfile
import tempfile
from typing import IO, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import httpx

from .errors import ConnectionFailed, ProtocolError, error_from_response
from .streaming import OutputCallback, collect_exec_events
from .tcp import open_tcp
from .transfer import sha256_of_body, sha256_of_file, stream_to_file
from .attach import ProcessSocket
from .checkpoints import CheckpointInfo, CheckpointList, CheckpointPolicy, RewindReport
from .templates import TemplateBuild, TemplateImport, template_build_from_lines, template_import_from_lines
from .watch import FileWatch
from .processes import ProcessOutput
from .transport import Endpoint, make_client, quote_segment, resolve_endpoint, resolve_token
from .types import (
    ArchiveReport,
    DiskSnapshotInfo,
    DiskSnapshotReport,
    EvalResult,
    ExecResult,
    ExposedPort,
    FileChecksum,
    FileEntry,
    FileWritten,
    Lineage,
    NetworkPolicy,
    Pong,
    ProcessInfo,
    PruneBuildsReport,
    SandboxInfo,
    SandboxUsage,
    SnapshotInfo,
    SnapshotInfoDetail,
    UnpackResult,
    VersionInfo,
    VolumeInfo,
    RemoteInfo,
    PushReport,
    PullReport,
    GcReport,
    LockInfo,
    WorkspaceInfo,
    parse_list,
)

__all__ = ["Controller"]

#: The header an exposed port's token is sent in.
PORT_TOKEN_HEADER = "X-Forkvm-Port-Token"
#: The header on an exposed port's answers that the daemon gave, not the guest.
PROXY_ERROR_HEADER = "X-Forkvm-Error"

#: What a ``network`` argument may be: a :class:`NetworkPolicy`, or a dict of its fields.
NetworkPolicyLike = Union[NetworkPolicy, Mapping[str, Any]]

#: Seconds added to a command's own timeout before the HTTP request gives up.
EXEC_GRACE_SECS = 30.0

#: A local file path.
PathLike = Union[str, "os.PathLike[str]"]


def _sb(sandbox_id: str, *rest: str) -> str:
    return "/".join(["/v1/sandboxes", quote_segment(sandbox_id), *rest])


def _guest_port(port: int) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be an int from 1 to 65535, got {port!r}")
    return port


def _snap(tag: str, *rest: str) -> str:
    return "/".join(["/v1/snapshots", quote_segment(tag), *rest])


def _ws(name: str, *rest: str) -> str:
    return "/".join(["/v1/workspaces", quote_segment(name), *rest])


def _vol(name: str, *rest: str) -> str:
    return "/".join(["/v1/volumes", quote_segment(name), *rest])


VolumeLike = Union[str, Mapping[str, Any]]


def volume_body(v: VolumeLike) -> Dict[str, Any]:
    """One entry of a spawn's ``volumes``: ``{"name", "mount", "mode"}``, or the CLI's
    ``"NAME:/mount/point[:rw|ro|cow]"``."""
    if isinstance(v, str):
        parts = v.split(":", 2)
        if len(parts) < 2:
            raise ValueError(f"volume {v!r}: expected NAME:/mount/point[:rw|ro|cow]")
        body: Dict[str, Any] = {"name": parts[0], "mount": parts[1]}
        if len(parts) == 3:
            body["mode"] = parts[2]
        return body
    return dict(v)


class Controller:
    """Client for forkvmd.

    Args:
        base_url: ``unix:/path/forkvmd.sock``, ``http://host:port`` or
            ``https://host:port``; default ``$FORKVM_DAEMON``, else the daemon's
            default socket (see :mod:`forkvm.transport`).
        token: bearer token for a TCP listener; default ``$FORKVM_TOKEN``.
        timeout: seconds a request may take (commands get at least their own timeout
            plus a grace period).
        verify: TLS verification for ``https`` (``False`` or a CA bundle path).
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: float = 600.0,
        *,
        verify: Union[bool, str] = True,
    ) -> None:
        self.endpoint: Endpoint = resolve_endpoint(base_url)
        self.timeout = timeout
        self._token = resolve_token(token)
        self._verify = verify
        self._client = make_client(self.endpoint, self._token, timeout, verify)

    def clone(self) -> "Controller":
        """A new Controller for the same daemon, token and settings (own connections)."""
        return Controller(str(self.endpoint), self._token or "", self.timeout, verify=self._verify)

    def close(self) -> None:
        """Closes the connection pool; the Controller cannot be used afterwards."""
        self._client.close()

    def __enter__(self) -> "Controller":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Controller({str(self.endpoint)!r})"

    # --- plumbing --------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Optional[Mapping[str, Union[str, int]]] = None,
        content: Union[bytes, IO[bytes], None] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> httpx.Response:
        try:
            resp = self._client.request(
                method,
                path,
                json=json,
                params=params,
                content=content,
                headers=headers,
                timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
            )
        except httpx.TransportError as e:
            raise ConnectionFailed(
                f"cannot talk to forkvmd at {self.endpoint} ({method} {path}): "
                f"{type(e).__name__}: {e}. Is `forkvm daemon` running there?",
                url=str(self._client.base_url) + path.lstrip("/"),
            ) from e
        if resp.status_code >= 300:
            raise error_from_response(resp.status_code, resp.content, str(resp.request.url))
        return resp

    @staticmethod
    def _json(resp: httpx.Response) -> Any:
        try:
            return resp.json()
        except ValueError as e:
            raise ProtocolError(
                f"expected JSON, got {resp.text[:200]!r}", status=resp.status_code, url=str(resp.request.url)
            ) from e

    @staticmethod
    def _exec_body(
        args: Optional[Sequence[str]],
        cmd: Optional[str],
        timeout_secs: float,
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        stdin: Optional[str],
    ) -> Dict[str, Any]:
        if (args is None) == (cmd is None):
            raise ValueError("give exactly one of args (argv list) and cmd (a shell command)")
        if isinstance(args, str):
            raise TypeError("args is an argv list; pass a shell command string as cmd=")
        body: Dict[str, Any] = {"timeout_secs": int(math.ceil(timeout_secs))}
        if args is not None:
            body["args"] = list(args)
        if cmd is not None:
            body["cmd"] = cmd
        if env:
            body["env"] = dict(env)
        if cwd is not None:
            body["cwd"] = cwd
        if stdin is not None:
            body["stdin"] = stdin
        return body

    def _exec_timeout(self, timeout_secs: float) -> float:
        return max(self.timeout, timeout_secs + EXEC_GRACE_SECS)

    # --- daemon ----------------------------------------------------------

    def health(self) -> bool:
        """``GET /healthz``: whether the daemon says it is ok."""
        return bool(self._json(self._request("GET", "/healthz")).get("ok"))

    def version(self) -> VersionInfo:
        """``GET /version``."""
        return VersionInfo.from_json(self._json(self._request("GET", "/version")))

    def metrics(self) -> str:
        """``GET /metrics``: Prometheus text."""
        return self._request("GET", "/metrics").text

    # --- snapshots -------------------------------------------------------

    def list_snapshots(self) -> List[SnapshotInfo]:
        """``GET /v1/snapshots``."""
        return parse_list(SnapshotInfo, self._json(self._request("GET", "/v1/snapshots")), "snapshots")

    def create_snapshot(
        self,
        tag: str,
        template: str,
        *,
        timeout: Optional[float] = None,
        memory_limit_mib: Optional[int] = None,
        cpu_limit_millis: Optional[int] = None,
        pids_limit: Optional[int] = None,
        io_limits: Optional[Dict[str, int]] = None,
        network: Optional[NetworkPolicyLike] = None,
        vcpus: Optional[int] = None,
    ) -> SnapshotInfo:
        """``POST /v1/snapshots``: a snapshot of ``template`` (``tiny``, ``python``) as
        ``tag``. The first build of a template can take minutes; it is cached after.
        The limits and the network policy given become the tag's defaults for the
        sandboxes spawned from it (a spawn asking for a policy of its own gets that one).
        ``vcpus`` (1 to 16) is the machine's: the template boots on that many once, and
        every sandbox of the tag has them."""
        body: Dict[str, Any] = {"tag": tag, "template": template}
        if vcpus is not None:
            body["vcpus"] = vcpus
        limits: Dict[str, Any] = {}
        if memory_limit_mib is not None:
            limits["memory_limit_mib"] = memory_limit_mib
        _put_limits(limits, cpu_limit_millis, pids_limit, io_limits)
        if limits:
            body["default_limits"] = limits
        if network is not None:
            body["default_network"] = network_body(network)
        return SnapshotInfo.from_json(self._json(self._request("POST", "/v1/snapshots", json=body, timeout=timeout)))

    def delete_snapshot(self, tag: str, cascade: bool = False, force: bool = False) -> None:
        """``DELETE /v1/snapshots/{tag}``.

        A snapshot others are built on (a diff chain's parent) is refused with
        :class:`Conflict` (``state == "has_dependents"``, the message names them) unless
        ``cascade`` (delete them too, at any depth) or ``force`` (delete it alone and
        leave them unbootable); not both.
        """
        params: Dict[str, Union[str, int]] = {}
        if cascade:
            params["cascade"] = "true"
        if force:
            params["force"] = "true"
        self._request("DELETE", _snap(tag), params=params or None)

    def snapshot_info(self, tag: str) -> SnapshotInfoDetail:
        """``GET /v1/snapshots/{tag}/info``: sizes, lineage (ancestors, dependents,
        descendants) and whether it is bootable, with the reason when it is not."""
        return SnapshotInfoDetail.from_json(self._json(self._request("GET", _snap(tag, "info"))))

    def compact_snapshot(self, tag: str, to: str, *, timeout: Optional[float] = None) -> SnapshotInfo:
        """``POST /v1/snapshots/{tag}/compact``: writes ``to``, the flat equivalent of
        ``tag``'s chain (no parent; ``branched_from`` is ``compact:<tag>``)."""
        resp = self._request("POST", _snap(tag, "compact"), json={"to": to}, timeout=timeout)
        return SnapshotInfo.from_json(self._json(resp))

    def pack_snapshot(self, tag: str, path: PathLike, *, timeout: Optional[float] = None) -> int:
        """``GET /v1/snapshots/{tag}/pack``: streams ``tag``'s whole chain, as a
        ``.tar.zst`` pack, into the file ``path``; returns its size in bytes.

        The download goes to ``<path>.partial`` first and is renamed when complete, so
        a failed one never leaves a truncated pack under ``path``.
        """
        target = _snap(tag, "pack")
        dest = os.fspath(path)
        partial = dest + ".partial"
        total = 0
        try:
            with self._client.stream(
                "GET", target, timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout
            ) as resp:
                if resp.status_code >= 300:
                    raise error_from_response(resp.status_code, resp.read(), str(resp.request.url))
                with open(partial, "wb") as f:
                    for chunk in resp.iter_bytes():
                        f.write(chunk)
                        total += len(chunk)
            os.replace(partial, dest)
        except httpx.TransportError as e:
            raise ConnectionFailed(
                f"cannot talk to forkvmd at {self.endpoint} (GET {target}): {type(e).__name__}: {e}",
            ) from e
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        return total

    def unpack_snapshot(self, path: PathLike, *, timeout: Optional[float] = None) -> UnpackResult:
        """``POST /v1/snapshots/unpack``: imports the chain in the pack file ``path``
        (streamed, never read whole). The daemon checks all of it before anything
        enters its store: a damaged pack is a :class:`BadRequest` and imports nothing;
        a tag that exists there with other content is a :class:`Conflict`."""
        with open(os.fspath(path), "rb") as f:
            resp = self._request(
                "POST",
                "/v1/snapshots/unpack",
                content=f,
                headers={"Content-Type": "application/zstd"},
                timeout=timeout,
            )
        return UnpackResult.from_json(self._json(resp))

    # --- templates -------------------------------------------------------

    def import_oci_template(
        self,
        path: PathLike,
        name: str,
        *,
        start: Optional[str] = None,
        start_image_command: bool = False,
        ready: Optional[str] = None,
        vcpus: Optional[int] = None,
        memory_mib: Optional[int] = None,
        force: bool = False,
        snapshot: bool = False,
        timeout: Optional[float] = None,
    ) -> TemplateImport:
        """``POST /v1/templates/oci``: makes the template ``name`` from the image archive
        ``path`` (an OCI archive or a ``docker save``, gzip-compressed or not; streamed,
        never read whole): the daemon imports it, writes the template with the image's
        Env, WorkingDir and User as exec defaults, and builds it (``snapshot=True``: its
        template snapshot too, which boots it once). A body that is not an image is a
        :class:`BadRequest`; a built-in name, or a name taken without ``force``, a
        :class:`Conflict`. See docs/templates.md."""
        params: Dict[str, Union[str, int]] = {"name": name}
        if start is not None:
            params["start"] = start
        if ready is not None:
            params["ready"] = ready
        if vcpus is not None:
            params["vcpus"] = vcpus
        if memory_mib is not None:
            params["memory_mib"] = memory_mib
        for key, on in (("start_image_command", start_image_command), ("force", force), ("snapshot", snapshot)):
            if on:
                params[key] = "true"
        with open(os.fspath(path), "rb") as f:
            resp = self._post_tar("/v1/templates/oci", f, params, timeout)
        return template_import_from_lines(resp.text, str(resp.request.url))

    def prune_builds(self, *, dry_run: bool = False, older_than_seconds: Optional[int] = None) -> PruneBuildsReport:
        """``POST /v1/templates/prune``: removes the build cache's step snapshots nothing
        needs (none under a tag, none a sandbox runs from, none younger than
        ``older_than_seconds``), or lists them with ``dry_run``. ``Conflict`` while a
        build runs."""
        body: Dict[str, Any] = {"dry_run": dry_run}
        if older_than_seconds is not None:
            body["older_than_seconds"] = older_than_seconds
        return PruneBuildsReport.from_json(self._json(self._request("POST", "/v1/templates/prune", json=body)))

    def build_template(
        self,
        context: Union[PathLike, bytes],
        tag: str,
        *,
        dockerfile: Optional[str] = None,
        build_args: Optional[Dict[str, str]] = None,
        no_cache: bool = False,
        replace: bool = False,
        start: bool = False,
        timeout: Optional[float] = None,
    ) -> TemplateBuild:
        """``POST /v1/templates/build``: builds a Dockerfile into ``tag``, every step in a
        sandbox on the daemon, each step kept as a diff snapshot so a rebuild runs only what
        changed (docs/dockerfile.md). ``context`` is a directory (archived here with its
        links as links), a tar archive file (gzip-compressed or not), or an archive's
        bytes; the Dockerfile is ``dockerfile`` in it (``Dockerfile``). A Dockerfile that
        does not check out is a :class:`BadRequest` naming the line; a tag no build made is
        a :class:`Conflict` unless ``replace``. What RUN printed is in ``.output``."""
        params: Dict[str, Union[str, int]] = {"tag": tag}
        if dockerfile is not None:
            params["dockerfile"] = dockerfile
        if build_args:
            params["build_args"] = json.dumps(build_args)
        for key, on in (("no_cache", no_cache), ("replace", replace), ("start", start)):
            if on:
                params[key] = "true"
        with _context_archive(context) as body:
            resp = self._post_tar("/v1/templates/build", body, params, timeout)
        return template_build_from_lines(resp.text, str(resp.request.url))

    def _post_tar(
        self,
        path: str,
        body: Union[bytes, IO[bytes]],
        params: Dict[str, Union[str, int]],
        timeout: Optional[float],
    ) -> httpx.Response:
        """A tar archive posted to ``path`` (streamed from a file)."""
        return self._request(
            "POST", path, content=body, params=params, headers={"Content-Type": "application/x-tar"}, timeout=timeout
        )

    # --- sandboxes -------------------------------------------------------

    def list_sandboxes(self) -> List[SandboxInfo]:
        """``GET /v1/sandboxes``."""
        return parse_list(SandboxInfo, self._json(self._request("GET", "/v1/sandboxes")), "sandboxes")

    def spawn_sandboxes(
        self,
        snapshot_tag: str,
        n: int = 1,
        memory_limit_mib: Optional[int] = None,
        *,
        per_child_netns: bool = False,
        ttl_seconds: Optional[int] = None,
        cpu_limit_millis: Optional[int] = None,
        pids_limit: Optional[int] = None,
        io_limits: Optional[Dict[str, int]] = None,
        network: Optional[NetworkPolicyLike] = None,
        vcpus: Optional[int] = None,
        volumes: Optional[Sequence[VolumeLike]] = None,
        checkpoints: Optional["CheckpointPolicy"] = None,
    ) -> List[SandboxInfo]:
        """``POST /v1/sandboxes``: ``n`` sandboxes from a snapshot, all ready, or none.

        ``checkpoints`` is each sandbox's checkpoint policy from the start
        (:class:`CheckpointPolicy`: a timer, after every exec/eval, how many kept).

        ``volumes`` attaches volumes to each (``{"name", "mount", "mode"}`` or
        ``"NAME:/mount[:rw|ro|cow]"``; a writable one only when ``n`` is 1).

        A sandbox has its snapshot's vCPUs; ``vcpus`` says how many the caller expects,
        and another count is refused (:class:`BadRequest`) rather than ignored.

        ``per_child_netns`` is forkd's option, accepted: every forkvm sandbox has a
        network namespace of its own. ``network`` is where each may connect to
        (:class:`NetworkPolicy`, or a dict of its fields); absent: anywhere.
        ``cpu_limit_millis`` (thousandths of a CPU) and
        ``pids_limit`` (tasks) override the daemon's defaults for each sandbox's cgroup.
        ``io_limits`` caps each sandbox's disk and entropy I/O
        (``disk_bytes_per_sec``, ``disk_ops_per_sec``, ``rng_bytes_per_sec``,
        ``net_tx_bytes_per_sec``, ``net_rx_bytes_per_sec``:
        any subset).
        """
        if isinstance(memory_limit_mib, bool):
            raise TypeError("memory_limit_mib is a number of MiB (forkd's 3rd argument per_child_netns is keyword-only here)")
        body: Dict[str, Any] = {"snapshot_tag": snapshot_tag, "n": n}
        if memory_limit_mib is not None:
            body["memory_limit_mib"] = memory_limit_mib
        if per_child_netns:
            body["per_child_netns"] = True
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        _put_limits(body, cpu_limit_millis, pids_limit, io_limits)
        if network is not None:
            body["network"] = network_body(network)
        if vcpus is not None:
            body["vcpus"] = vcpus
        if checkpoints is not None:
            body["checkpoints"] = checkpoints.to_json()
        if volumes:
            body["volumes"] = [volume_body(v) for v in volumes]
        return parse_list(SandboxInfo, self._json(self._request("POST", "/v1/sandboxes", json=body)), "sandboxes")

    def get_sandbox(self, sandbox_id: str) -> SandboxInfo:
        """``GET /v1/sandboxes/{id}``."""
        return SandboxInfo.from_json(self._json(self._request("GET", _sb(sandbox_id))))

    def kill_sandbox(self, sandbox_id: str, purge: bool = False) -> None:
        """``DELETE /v1/sandboxes/{id}``: stops it (or removes its archive).

        With ``purge`` its disk snapshots are destroyed too (its key, then its vault),
        also for a sandbox deleted before; :class:`Conflict` (``state == "in_use"``)
        while its archive or a lazy restore still needs them.
        """
        params: Dict[str, Union[str, int]] = {"purge": "true"} if purge else {}
        self._request("DELETE", _sb(sandbox_id), params=params)

    def console(self, sandbox_id: str, bytes: Optional[int] = None) -> str:
        """``GET /v1/sandboxes/{id}/console``: the end of its serial console log (the
        daemon's default 64 KiB unless ``bytes``, at most 1 MiB), as text; also for a
        sandbox whose VMM stopped and is not swept yet."""
        params: Dict[str, Union[str, int]] = {"bytes": bytes} if bytes is not None else {}
        return self._request("GET", _sb(sandbox_id, "console"), params=params).text

    def sandbox_usage(self, sandbox_id: str) -> SandboxUsage:
        """``GET /v1/sandboxes/{id}/usage``: what its VMM uses of the host now (memory
        charged, cumulative CPU time)."""
        return SandboxUsage.from_json(self._json(self._request("GET", _sb(sandbox_id, "usage"))))

    def lineage(self) -> Lineage:
        """``GET /v1/lineage``: every sandbox and snapshot, and who came from what
        (spawn, fork, branch, chain and compact edges)."""
        return Lineage.from_json(self._json(self._request("GET", "/v1/lineage")))

    def ping_sandbox(self, sandbox_id: str) -> Pong:
        """``POST /v1/sandboxes/{id}/ping``: a round trip to the guest agent."""
        return Pong.from_json(self._json(self._request("POST", _sb(sandbox_id, "ping"))))

    def exec_command(
        self,
        sandbox_id: str,
        args: Optional[Sequence[str]] = None,
        timeout_secs: float = 30,
        *,
        cmd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[str] = None,
        max_output_bytes: Optional[int] = None,
    ) -> ExecResult:
        """``POST /v1/sandboxes/{id}/exec``: runs ``args`` (argv) or ``cmd`` (via
        ``/bin/sh -c``) and waits for it. A timeout is ``timed_out=True``, exit 124.
        ``max_output_bytes`` caps what is kept of each stream (the daemon's default is
        4 MiB, at most 16 MiB); past it the result says ``truncated`` and still counts
        the bytes in ``stdout_bytes``/``stderr_bytes``."""
        body = self._exec_body(args, cmd, timeout_secs, env, cwd, stdin)
        if max_output_bytes is not None:
            if isinstance(max_output_bytes, bool) or not isinstance(max_output_bytes, int) or max_output_bytes < 0:
                raise ValueError("max_output_bytes is a byte count (a non-negative int)")
            body["max_output_bytes"] = max_output_bytes
        resp = self._request("POST", _sb(sandbox_id, "exec"), json=body, timeout=self._exec_timeout(timeout_secs))
        return ExecResult.from_json(self._json(resp))

    def exec_stream(
        self,
        sandbox_id: str,
        args: Optional[Sequence[str]] = None,
        timeout_secs: float = 30,
        *,
        cmd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[str] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
    ) -> ExecResult:
        """``POST /v1/sandboxes/{id}/exec/stream``: as :meth:`exec_command`, calling
        ``on_stdout``/``on_stderr`` with each chunk as it arrives. The result holds
        all the output too. An ``error`` line raises :class:`ForkvmError`."""
        body = self._exec_body(args, cmd, timeout_secs, env, cwd, stdin)
        path = _sb(sandbox_id, "exec", "stream")
        try:
            with self._client.stream(
                "POST", path, json=body, timeout=self._exec_timeout(timeout_secs)
            ) as resp:
                if resp.status_code >= 300:
                    raise error_from_response(resp.status_code, resp.read(), str(resp.request.url))
                return collect_exec_events(resp.iter_raw(), on_stdout, on_stderr, url=str(resp.request.url))
        except httpx.TransportError as e:
            raise ConnectionFailed(
                f"cannot talk to forkvmd at {self.endpoint} (POST {path}): {type(e).__name__}: {e}",
            ) from e

    def eval_code(self, sandbox_id: str, code: str, *, timeout: Optional[float] = None) -> EvalResult:
        """``POST /v1/sandboxes/{id}/eval``: runs ``code`` in the warm interpreter.
        Does not raise when the code raised: see ``EvalResult.error``."""
        resp = self._request("POST", _sb(sandbox_id, "eval"), json={"code": code}, timeout=timeout)
        return EvalResult.from_json(self._json(resp))

    def branch_sandbox(
        self,
        sandbox_id: str,
        tag: Optional[str] = None,
        mode: Optional[str] = None,
        wait: bool = True,
        *,
        parent_tag: Optional[str] = None,
    ) -> SnapshotInfo:
        """``POST /v1/sandboxes/{id}/branch``: a snapshot of the running sandbox.

        ``mode`` is ``full``, ``live`` or ``diff`` (daemon's default, full, if ``None``).
        A live branch with ``wait=False`` returns while the snapshot is still
        ``writing``. A diff branch stores only the pages that differ from the snapshot
        the sandbox was spawned from; ``parent_tag``, if given, must name that snapshot.
        """
        body: Dict[str, Any] = {"wait": wait}
        if tag is not None:
            body["tag"] = tag
        if mode is not None:
            body["mode"] = mode
        if parent_tag is not None:
            body["parent_tag"] = parent_tag
        return SnapshotInfo.from_json(self._json(self._request("POST", _sb(sandbox_id, "branch"), json=body)))

    def fork_sandbox(
        self,
        sandbox_id: str,
        n: int = 1,
        memory_limit_mib: Optional[int] = None,
        *,
        ttl_seconds: Optional[int] = None,
        cpu_limit_millis: Optional[int] = None,
        pids_limit: Optional[int] = None,
        io_limits: Optional[Dict[str, int]] = None,
        network: Optional[NetworkPolicyLike] = None,
    ) -> List[SandboxInfo]:
        """``POST /v1/sandboxes/{id}/fork``: ``n`` running copies, no disk. The copies
        keep the source's limits and network policy but for those given here."""
        body: Dict[str, Any] = {"n": n}
        if memory_limit_mib is not None:
            body["memory_limit_mib"] = memory_limit_mib
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        _put_limits(body, cpu_limit_millis, pids_limit, io_limits)
        if network is not None:
            body["network"] = network_body(network)
        return parse_list(SandboxInfo, self._json(self._request("POST", _sb(sandbox_id, "fork"), json=body)), "sandboxes")

    # --- workspaces (forkd's named sandboxes) ----------------------------

    def list_workspaces(self) -> List[WorkspaceInfo]:
        """``GET /v1/workspaces``."""
        return parse_list(WorkspaceInfo, self._json(self._request("GET", "/v1/workspaces")), "workspaces")

    def create_workspace(
        self, name: str, snapshot_tag: str, *, memory_limit_mib: Optional[int] = None
    ) -> WorkspaceInfo:
        """``POST /v1/workspaces``: one sandbox from ``snapshot_tag``, named ``name``."""
        body: Dict[str, Any] = {"name": name, "snapshot_tag": snapshot_tag}
        if memory_limit_mib is not None:
            body["memory_limit_mib"] = memory_limit_mib
        return WorkspaceInfo.from_json(self._json(self._request("POST", "/v1/workspaces", json=body)))

    def get_workspace(self, name: str) -> WorkspaceInfo:
        """``GET /v1/workspaces/{name}``."""
        return WorkspaceInfo.from_json(self._json(self._request("GET", _ws(name))))

    def delete_workspace(self, name: str) -> None:
        """``DELETE /v1/workspaces/{name}``: its sandbox too (the source tag stays)."""
        self._request("DELETE", _ws(name))

    def suspend_workspace(self, name: str) -> WorkspaceInfo:
        """``POST /v1/workspaces/{name}/suspend``: archives its sandbox."""
        return WorkspaceInfo.from_json(self._json(self._request("POST", _ws(name, "suspend"), json={})))

    def resume_workspace(self, name: str) -> WorkspaceInfo:
        """``POST /v1/workspaces/{name}/resume``: restores its sandbox (same id)."""
        return WorkspaceInfo.from_json(self._json(self._request("POST", _ws(name, "resume"))))

    # --- volumes ---------------------------------------------------------

    def list_volumes(self) -> List[VolumeInfo]:
        """``GET /v1/volumes``."""
        return parse_list(VolumeInfo, self._json(self._request("GET", "/v1/volumes")), "volumes")

    def create_volume(self, name: str, *, size_mib: Optional[int] = None) -> VolumeInfo:
        """``POST /v1/volumes``: a blank ext4 volume (absent size: 4096 MiB, sparse)."""
        body: Dict[str, Any] = {"name": name}
        if size_mib is not None:
            body["size_mib"] = size_mib
        return VolumeInfo.from_json(self._json(self._request("POST", "/v1/volumes", json=body)))

    def get_volume(self, name: str) -> VolumeInfo:
        """``GET /v1/volumes/{name}``."""
        return VolumeInfo.from_json(self._json(self._request("GET", _vol(name))))

    def delete_volume(self, name: str) -> None:
        """``DELETE /v1/volumes/{name}``: :class:`Conflict` while a sandbox has it attached."""
        self._request("DELETE", _vol(name))

    def snapshot_volume(self, name: str, to: str) -> VolumeInfo:
        """``POST /v1/volumes/{name}/snapshot``: a new volume ``to`` with its data as of now."""
        return VolumeInfo.from_json(self._json(self._request("POST", _vol(name, "snapshot"), json={"to": to})))

    # --- the daemon's remote ----------------------------------------------
    # The remote is the daemon's own (``forkvm daemon --remote URL``): a call names tags
    # and locks, never a URL or a key. Without one, each call raises :class:`Conflict`.

    def remote_info(self) -> RemoteInfo:
        """``GET /v1/remote``: the daemon's remote and the tags pushed there."""
        return RemoteInfo.from_json(self._json(self._request("GET", "/v1/remote")))

    def push_tag(self, tag: str, *, timeout: Optional[float] = None) -> PushReport:
        """``POST /v1/remote/push``: the tag's chain (memory and disks), only the blocks
        the remote lacks; answers when the manifest is written."""
        resp = self._request("POST", "/v1/remote/push", json={"tag": tag}, timeout=timeout)
        return PushReport.from_json(self._json(resp))

    def pull_tag(self, tag: str, *, timeout: Optional[float] = None) -> PullReport:
        """``POST /v1/remote/pull``: the links of the tag's chain the daemon's store lacks;
        sandboxes spawn from it once this returns."""
        resp = self._request("POST", "/v1/remote/pull", json={"tag": tag}, timeout=timeout)
        return PullReport.from_json(self._json(resp))

    def remove_remote_tag(self, tag: str) -> None:
        """``DELETE /v1/remote/tags/{tag}``: the tag's manifest; its blocks go at the next
        :meth:`collect_remote`."""
        self._request("DELETE", "/".join(["/v1/remote/tags", quote_segment(tag)]))

    def collect_remote(
        self, *, min_age_s: Optional[int] = None, dry_run: bool = False, timeout: Optional[float] = None
    ) -> GcReport:
        """``POST /v1/remote/gc``: deletes the blocks no tag names and older than
        ``min_age_s`` (absent: a day), under the remote's exclusive lock."""
        body: Dict[str, Any] = {"dry_run": dry_run}
        if min_age_s is not None:
            body["min_age_s"] = min_age_s
        resp = self._request("POST", "/v1/remote/gc", json=body, timeout=timeout)
        return GcReport.from_json(self._json(resp))

    def remote_locks(self) -> List[LockInfo]:
        """``GET /v1/remote/locks``: who holds the remote's locks, oldest first."""
        return parse_list(LockInfo, self._json(self._request("GET", "/v1/remote/locks")), "remote locks")

    def break_remote_lock(self, name: str) -> LockInfo:
        """``DELETE /v1/remote/locks/{name}``: removes a lock a dead push or collection
        left; only for a holder known to be gone."""
        resp = self._request("DELETE", "/".join(["/v1/remote/locks", quote_segment(name)]))
        return LockInfo.from_json(self._json(resp))

    # --- lifecycle -------------------------------------------------------

    def archive_sandbox(self, sandbox_id: str, *, timeout: Optional[float] = None) -> ArchiveReport:
        """``POST /v1/sandboxes/{id}/archive``: the sandbox goes to the store (memory,
        disks, processes) and its VMM stops; it stays listed as ``archived``."""
        resp = self._request("POST", _sb(sandbox_id, "archive"), timeout=timeout)
        return ArchiveReport.from_json(self._json(resp))

    def restore(
        self, sandbox_id: str, *, ttl_seconds: Optional[int] = None, timeout: Optional[float] = None
    ) -> SandboxInfo:
        """``POST /v1/sandboxes/{id}/restore``: an archived sandbox runs again, same id,
        processes and files. ``ttl_seconds`` counts from now (0: none; absent: the
        daemon's ``--default-ttl``)."""
        body: Dict[str, Any] = {}
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        resp = self._request("POST", _sb(sandbox_id, "restore"), json=body, timeout=timeout)
        return SandboxInfo.from_json(self._json(resp))

    restore_sandbox = restore

    # --- checkpoints -----------------------------------------------------

    def list_checkpoints(self, sandbox_id: str) -> "CheckpointList":
        """``GET /v1/sandboxes/{id}/checkpoints``: its checkpoints, oldest first, and
        when it is checkpointed by itself."""
        return CheckpointList.from_json(self._json(self._request("GET", _sb(sandbox_id, "checkpoints"))))

    def create_checkpoint(self, sandbox_id: str, *, note: Optional[str] = None) -> "CheckpointInfo":
        """``POST /v1/sandboxes/{id}/checkpoints``: its memory and disks now, as a
        snapshot tag of their own (the guest pauses for a few milliseconds)."""
        body: Dict[str, Any] = {} if note is None else {"note": note}
        return CheckpointInfo.from_json(self._json(self._request("POST", _sb(sandbox_id, "checkpoints"), json=body)))

    def set_checkpoint_policy(self, sandbox_id: str, policy: "CheckpointPolicy") -> "CheckpointList":
        """``PUT /v1/sandboxes/{id}/checkpoints``: a checkpoint every ``every_seconds``
        and/or after every exec/eval call; ``keep`` of them kept."""
        resp = self._request("PUT", _sb(sandbox_id, "checkpoints"), json=policy.to_json())
        return CheckpointList.from_json(self._json(resp))

    def rewind(
        self, sandbox_id: str, *, seq: Optional[int] = None, ago_seconds: Optional[float] = None
    ) -> "RewindReport":
        """``POST /v1/sandboxes/{id}/rewind``: the sandbox back at checkpoint ``seq`` (or
        the newest at least ``ago_seconds`` old), in place, same id."""
        body: Dict[str, Any] = {}
        if seq is not None:
            body["seq"] = seq
        if ago_seconds is not None:
            body["ago_seconds"] = ago_seconds
        return RewindReport.from_json(self._json(self._request("POST", _sb(sandbox_id, "rewind"), json=body)))

    def set_ttl(self, sandbox_id: str, ttl_seconds: int) -> SandboxInfo:
        """``POST /v1/sandboxes/{id}/ttl``: the daemon archives (never deletes) the
        sandbox ``ttl_seconds`` from now; 0 removes the TTL."""
        resp = self._request("POST", _sb(sandbox_id, "ttl"), json={"ttl_seconds": ttl_seconds})
        return SandboxInfo.from_json(self._json(resp))

    def set_network(self, sandbox_id: str, policy: NetworkPolicyLike) -> SandboxInfo:
        """``PUT /v1/sandboxes/{id}/network``: where the sandbox's guest may connect to,
        from now on (connections already open included). Bad entries are
        :class:`BadRequest` naming them; a sandbox without a network, :class:`Conflict`
        with ``state == "no_network"``."""
        resp = self._request("PUT", _sb(sandbox_id, "network"), json=network_body(policy))
        return SandboxInfo.from_json(self._json(resp))

    def disk_fork(
        self,
        sandbox_id: str,
        seq: Optional[int] = None,
        *,
        memory_limit_mib: Optional[int] = None,
        ttl_seconds: Optional[int] = None,
        restore: Optional[str] = None,
        timeout: Optional[float] = 900.0,
        cpu_limit_millis: Optional[int] = None,
        pids_limit: Optional[int] = None,
        io_limits: Optional[Dict[str, int]] = None,
    ) -> SandboxInfo:
        """``POST /v1/sandboxes/{id}/disk-fork``: a new sandbox cold-booted on disk
        snapshot ``seq`` (default: the newest) of ``sandbox_id`` (running, archived or
        gone). The guest boots, so this is long (about a minute on PVM hosts).
        ``restore``: ``"lazy_playbook"`` (the daemon's default), ``"lazy"`` or ``"eager"``."""
        body: Dict[str, Any] = {}
        values = (("seq", seq), ("memory_limit_mib", memory_limit_mib), ("ttl_seconds", ttl_seconds), ("restore", restore))
        for name, value in values:
            if value is not None:
                body[name] = value
        _put_limits(body, cpu_limit_millis, pids_limit, io_limits)
        resp = self._request("POST", _sb(sandbox_id, "disk-fork"), json=body, timeout=timeout)
        return SandboxInfo.from_json(self._json(resp))

    # --- disk snapshots --------------------------------------------------

    def disk_snapshot(
        self,
        sandbox_id: str,
        *,
        keep_last: Optional[int] = None,
        keep_hourly: Optional[int] = None,
        keep_daily: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> DiskSnapshotReport:
        """``POST /v1/sandboxes/{id}/disk-snapshots``: an encrypted, incremental
        snapshot of the sandbox's layered disks now (``unchanged`` when nothing was
        written since the last one), then retention: the ``keep_*`` given, the daemon's
        ``--disk-retention-keep-*`` for the rest. Waits for a snapshot of the same
        sandbox the daemon's schedule is taking."""
        body: Dict[str, Any] = {}
        for name, value in (("keep_last", keep_last), ("keep_hourly", keep_hourly), ("keep_daily", keep_daily)):
            if value is not None:
                body[name] = value
        resp = self._request("POST", _sb(sandbox_id, "disk-snapshots"), json=body, timeout=timeout)
        return DiskSnapshotReport.from_json(self._json(resp))

    def list_disk_snapshots(self, sandbox_id: str) -> List[DiskSnapshotInfo]:
        """``GET /v1/sandboxes/{id}/disk-snapshots``: oldest first; also for a sandbox
        that is gone but left snapshots."""
        resp = self._request("GET", _sb(sandbox_id, "disk-snapshots"))
        return parse_list(DiskSnapshotInfo, self._json(resp), "disk snapshots")

    # --- exposed ports ---------------------------------------------------

    def list_ports(self, sandbox_id: str) -> List[ExposedPort]:
        """``GET /v1/sandboxes/{id}/ports``: its exposed ports and their tokens."""
        resp = self._request("GET", _sb(sandbox_id, "ports"))
        return parse_list(ExposedPort, self._json(resp), "exposed ports")

    def expose_port(self, sandbox_id: str, port: int, *, dpop_jkt: Optional[str] = None) -> ExposedPort:
        """``POST /v1/sandboxes/{id}/ports``: ``port`` reachable through the daemon under
        a token of its own (the one it has if it was exposed already). With
        ``dpop_jkt`` (the RFC 7638 thumbprint of your public key) the token is bound
        to that key: every request needs ``Authorization: DPoP <token>`` and a DPoP
        proof signed by it (RFC 9449). A sandbox without a network is
        :class:`Conflict` with ``state == "no_network"``."""
        body: Dict[str, Any] = {"port": _guest_port(port)}
        if dpop_jkt is not None:
            if not isinstance(dpop_jkt, str):
                raise TypeError(f"dpop_jkt must be a str, got {type(dpop_jkt).__name__}")
            body["dpop_jkt"] = dpop_jkt
        resp = self._request("POST", _sb(sandbox_id, "ports"), json=body)
        return ExposedPort.from_json(self._json(resp))

    def unexpose_port(self, sandbox_id: str, port: int) -> None:
        """``DELETE /v1/sandboxes/{id}/ports/{port}``: its token stops working."""
        self._request("DELETE", _sb(sandbox_id, "ports", str(_guest_port(port))))

    def port_url(self, exposed: ExposedPort) -> Optional[str]:
        """Where a browser opens ``exposed`` (its token in the address, traded for a
        cookie on the first visit): at the port's own origin when it has one this host
        can reach (a ``*.localhost`` one only when the daemon is on this host's
        loopback), else at its path below the daemon's; ``None`` for a daemon on a Unix
        socket."""
        if self.endpoint.uds is not None:
            return None
        base = httpx.URL(self.endpoint.base_url)
        loopback = base.host == "localhost" or _is_loopback(base.host)
        if exposed.host is not None and (loopback or not exposed.host.endswith(".localhost")):
            port = base.port or (443 if base.scheme == "https" else 80)
            return f"{base.scheme}://{exposed.host}:{port}/?forkvm_token={exposed.token}"
        return f"{self.endpoint.base_url.rstrip('/')}{exposed.path}?forkvm_token={exposed.token}"

    def port_request(
        self,
        exposed: ExposedPort,
        method: str = "GET",
        path: str = "/",
        **kwargs: Any,
    ) -> httpx.Response:
        """A request to the guest behind ``exposed`` (``path`` below its root), with its
        token and without the daemon's: the guest's answer, whatever its status
        (errors of the daemon itself, before the guest answered, raise as usual:
        401/403 for a token refused, :class:`BadGateway` when nothing listens).
        ``kwargs`` go to httpx (``content``, ``json``, ``headers``, ``params``)."""
        headers = dict(kwargs.pop("headers", None) or {})
        headers[PORT_TOKEN_HEADER] = exposed.token
        target = exposed.path.rstrip("/") + "/" + path.lstrip("/")
        req = self._client.build_request(method, target, headers=headers, **kwargs)
        # The daemon's own token is never sent where a guest answers.
        if req.headers.get("authorization", "") == f"Bearer {self._token}":
            del req.headers["authorization"]
        try:
            resp = self._client.send(req)
        except httpx.TransportError as e:
            raise ConnectionFailed(
                f"cannot talk to forkvmd at {self.endpoint} ({method} {target}): {type(e).__name__}: {e}",
                url=str(req.url),
            ) from e
        # The daemon marks the answers it gave itself (a guest's own are never marked).
        if resp.headers.get(PROXY_ERROR_HEADER) is not None:
            raise error_from_response(resp.status_code, resp.content, str(req.url))
        return resp

    def connect_tcp(self, sandbox_id: str, port: int, *, timeout: float = 30.0) -> "socket.socket":
        """``GET /v1/sandboxes/{id}/tcp/{port}``, upgraded: a socket whose bytes go to and
        come from guest ``port`` (blocking mode; close it when done). Nothing
        listening there is :class:`BadGateway`."""
        target = _sb(sandbox_id, "tcp", str(_guest_port(port)))
        return open_tcp(self.endpoint, target, self._token, timeout=timeout, verify=self._verify)

    # --- files -----------------------------------------------------------

    def read_file(self, sandbox_id: str, path: str) -> bytes:
        """``GET /v1/sandboxes/{id}/files?path=``: the file's bytes."""
        return self._request("GET", _sb(sandbox_id, "files"), params={"path": path}).content

    def write_file(
        self,
        sandbox_id: str,
        path: str,
        data: Union[bytes, str],
        mode: Optional[int] = None,
        create_parents: bool = False,
    ) -> FileWritten:
        """``PUT /v1/sandboxes/{id}/files?path=``: writes ``data`` (str as UTF-8),
        replacing the file atomically. ``mode`` is the permission bits (e.g. 0o755)."""
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        params = _upload_params(path, mode, create_parents, sha256_of_body(content))
        resp = self._request("PUT", _sb(sandbox_id, "files"), params=params, content=content)
        return FileWritten.from_json(self._json(resp))

    def upload_file(
        self,
        sandbox_id: str,
        local_path: PathLike,
        path: str,
        *,
        mode: Optional[int] = None,
        create_parents: bool = False,
        timeout: Optional[float] = None,
    ) -> FileWritten:
        """``PUT /v1/sandboxes/{id}/files?path=`` from the local file ``local_path``,
        streamed (any size). Its SHA-256, read first, goes with it: a body that arrives
        otherwise is refused and nothing is written."""
        params = _upload_params(path, mode, create_parents, sha256_of_file(local_path))
        with open(os.fspath(local_path), "rb") as f:
            resp = self._request(
                "PUT",
                _sb(sandbox_id, "files"),
                params=params,
                content=f,
                headers={"Content-Type": "application/octet-stream"},
                timeout=timeout,
            )
        return FileWritten.from_json(self._json(resp))

    def download_file(
        self, sandbox_id: str, path: str, local_path: PathLike, *, verify: bool = True, timeout: Optional[float] = None
    ) -> FileChecksum:
        """``GET /v1/sandboxes/{id}/files?path=`` into the local file ``local_path``,
        streamed (any size) through ``<local_path>.partial``. With ``verify``, what came
        is compared with the file's SHA-256 computed in the guest before it is renamed
        into place (a difference is a :class:`ProtocolError`, and nothing is left)."""

        def check(size: int, sha256: str) -> None:
            if verify:
                theirs = self.file_checksum(sandbox_id, path)
                if (theirs.size, theirs.sha256) != (size, sha256):
                    raise ProtocolError(
                        f"{path}: {size} bytes with sha256 {sha256} came, but the guest's file has "
                        f"{theirs.size} bytes with sha256 {theirs.sha256} (changed meanwhile?)"
                    )

        size, sha256 = stream_to_file(
            self._client,
            _sb(sandbox_id, "files"),
            {"path": path},
            local_path,
            timeout=timeout,
            endpoint=str(self.endpoint),
            check=check,
        )
        return FileChecksum(path=path, size=size, sha256=sha256)

    def file_checksum(self, sandbox_id: str, path: str) -> FileChecksum:
        """``GET /v1/sandboxes/{id}/files/sha256?path=``: the file's size and SHA-256,
        computed in the guest."""
        resp = self._request("GET", _sb(sandbox_id, "files", "sha256"), params={"path": path})
        return FileChecksum.from_json(self._json(resp))

    def download_tar(self, sandbox_id: str, path: str, local_path: PathLike, *, timeout: Optional[float] = None) -> int:
        """``GET /v1/sandboxes/{id}/files/tar?path=``: a tar archive of the guest
        directory ``path`` into the local file ``local_path`` (streamed); its size."""
        size, _ = stream_to_file(
            self._client,
            _sb(sandbox_id, "files", "tar"),
            {"path": path},
            local_path,
            timeout=timeout,
            endpoint=str(self.endpoint),
        )
        return size

    def upload_tar(
        self, sandbox_id: str, path: str, source: Union[PathLike, bytes], *, timeout: Optional[float] = None
    ) -> FileWritten:
        """``PUT /v1/sandboxes/{id}/files/tar?path=``: ``source`` (a local directory,
        archived here with links as links; a tar file; or an archive's bytes) unpacked
        into the guest directory ``path``, streamed, its SHA-256 checked by the daemon."""
        with _context_archive(source) as body:
            params = {"path": path, "sha256": sha256_of_body(body)}
            resp = self._request(
                "PUT",
                _sb(sandbox_id, "files", "tar"),
                params=params,
                content=body,
                headers={"Content-Type": "application/x-tar"},
                timeout=timeout,
            )
        return FileWritten.from_json(self._json(resp))

    def remove_file(self, sandbox_id: str, path: str, recursive: bool = False) -> None:
        """``DELETE /v1/sandboxes/{id}/files?path=``."""
        params: Dict[str, Union[str, int]] = {"path": path}
        if recursive:
            params["recursive"] = "true"
        self._request("DELETE", _sb(sandbox_id, "files"), params=params)

    def list_files(self, sandbox_id: str, path: str) -> List[FileEntry]:
        """``GET /v1/sandboxes/{id}/files/list?path=``: a directory's entries."""
        resp = self._request("GET", _sb(sandbox_id, "files", "list"), params={"path": path})
        return parse_list(FileEntry, self._json(resp), "files")

    def watch_files(self, sandbox_id: str, path: str, *, recursive: bool = False) -> FileWatch:
        """``GET /v1/sandboxes/{id}/files/watch?path=``: the changes below the directory
        ``path``, as they happen. Returns once the watch is in place, so every change
        made after this call is reported; iterate it for :class:`FileChange` records and
        close it (or use it in a ``with`` block) to end the watch."""
        params = {"path": path}
        if recursive:
            params["recursive"] = "true"
        return FileWatch(self._client, _sb(sandbox_id, "files", "watch"), params, str(self.endpoint))

    # --- background processes --------------------------------------------

    def list_processes(self, sandbox_id: str) -> List[ProcessInfo]:
        """``GET /v1/sandboxes/{id}/processes``: running and ended, oldest pid first."""
        resp = self._request("GET", _sb(sandbox_id, "processes"))
        return parse_list(ProcessInfo, self._json(resp), "processes")

    def start_process(
        self,
        sandbox_id: str,
        args: Optional[Sequence[str]] = None,
        *,
        cmd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        pty: Optional[Sequence[int]] = None,
        tag: Optional[str] = None,
        ring_bytes: Optional[int] = None,
        timeout_secs: Optional[int] = None,
    ) -> ProcessInfo:
        """``POST /v1/sandboxes/{id}/processes``: starts ``args`` (or the shell line
        ``cmd``) in the background; returns once it runs. ``pty=(rows, cols)`` runs it
        on a terminal of that size."""
        body: Dict[str, Any] = {}
        if args is not None:
            body["args"] = list(args)
        for name, value in (("cmd", cmd), ("cwd", cwd), ("user", user), ("tag", tag)):
            if value is not None:
                body[name] = value
        if env:
            body["env"] = dict(env)
        if pty is not None:
            rows, cols = pty
            body["pty"] = {"rows": int(rows), "cols": int(cols)}
        if ring_bytes is not None:
            body["ring_bytes"] = int(ring_bytes)
        if timeout_secs is not None:
            body["timeout_secs"] = int(timeout_secs)
        resp = self._request("POST", _sb(sandbox_id, "processes"), json=body)
        return ProcessInfo.from_json(self._json(resp))

    def process_output(
        self, sandbox_id: str, pid: int, *, offset: Optional[int] = None, follow: bool = False
    ) -> ProcessOutput:
        """``GET /v1/sandboxes/{id}/processes/{pid}/output``: its output from ``offset``
        (the oldest byte kept by default); with ``follow``, as it comes until it ends.
        Iterate it for :class:`~forkvm.processes.OutputChunk` records."""
        params: Dict[str, str] = {}
        if offset is not None:
            params["offset"] = str(int(offset))
        if follow:
            params["follow"] = "true"
        path = _sb(sandbox_id, "processes", str(int(pid)), "output")
        return ProcessOutput(self._client, path, params, str(self.endpoint))

    def process_input(self, sandbox_id: str, pid: int, data: Union[bytes, str], *, close: bool = False) -> int:
        """``POST /v1/sandboxes/{id}/processes/{pid}/input``: ``data`` to its stdin
        (``close``: then end its input); the bytes it took."""
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        params: Dict[str, Union[str, int]] = {"close": "true"} if close else {}
        resp = self._request("POST", _sb(sandbox_id, "processes", str(int(pid)), "input"), params=params, content=content)
        return int(self._json(resp)["bytes"])

    def signal_process(self, sandbox_id: str, pid: int, signal: int = 15) -> None:
        """``POST /v1/sandboxes/{id}/processes/{pid}/signal``: to its process group."""
        self._request("POST", _sb(sandbox_id, "processes", str(int(pid)), "signal"), json={"signal": int(signal)})

    def resize_process(self, sandbox_id: str, pid: int, rows: int, cols: int) -> None:
        """``POST /v1/sandboxes/{id}/processes/{pid}/resize``: its terminal's size."""
        body = {"rows": int(rows), "cols": int(cols)}
        self._request("POST", _sb(sandbox_id, "processes", str(int(pid)), "resize"), json=body)

    def attach_process(
        self, sandbox_id: str, pid: int, *, offset: Optional[int] = None, timeout: float = 30.0
    ) -> ProcessSocket:
        """``GET /v1/sandboxes/{id}/processes/{pid}/attach``, a WebSocket: its output
        from ``offset`` (the oldest byte kept by default) as it comes, its input and
        controls the other way. Close it to detach; the process runs on."""
        target = _sb(sandbox_id, "processes", str(int(pid)), "attach")
        if offset is not None:
            target += f"?offset={int(offset)}"
        return ProcessSocket(self.endpoint, target, self._token, timeout=timeout, verify=self._verify)


#: The I/O caps a request's ``io_limits`` may hold.
IO_LIMITS = (
    "disk_bytes_per_sec",
    "disk_ops_per_sec",
    "rng_bytes_per_sec",
    "net_tx_bytes_per_sec",
    "net_rx_bytes_per_sec",
)


def _upload_params(path: str, mode: Optional[int], create_parents: bool, sha256: str) -> Dict[str, Union[str, int]]:
    params: Dict[str, Union[str, int]] = {"path": path, "sha256": sha256}
    if mode is not None:
        params["mode"] = int(mode)
    if create_parents:
        params["create_parents"] = "true"
    return params


@contextlib.contextmanager
def _context_archive(context: Union[PathLike, bytes]) -> Iterator[Union[bytes, IO[bytes]]]:
    """A build context as a request body: bytes as they are, an archive file opened, a
    directory archived into a temporary file first (links as links, never followed)."""
    if isinstance(context, bytes):
        yield context
        return
    path = os.fspath(context)
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            yield f
        return
    with tempfile.TemporaryFile() as f:
        with tarfile.open(fileobj=f, mode="w") as tar:
            tar.add(path, arcname=".", recursive=True)
        f.seek(0)
        yield f


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def network_body(policy: NetworkPolicyLike) -> Dict[str, Any]:
    """The request body for ``policy``, checked for shape (the daemon checks entries)."""
    if isinstance(policy, NetworkPolicy):
        return policy.to_json()
    if not isinstance(policy, Mapping):
        raise TypeError(f"network is a NetworkPolicy or a dict, got {policy!r}")
    unknown = sorted(set(policy) - {"allow_internet", "allow", "deny"})
    if unknown:
        raise ValueError(f"network: unknown fields {unknown} (known: allow_internet, allow, deny)")
    body: Dict[str, Any] = {}
    if "allow_internet" in policy:
        if not isinstance(policy["allow_internet"], bool):
            raise TypeError(f"network['allow_internet'] is a bool, got {policy['allow_internet']!r}")
        body["allow_internet"] = policy["allow_internet"]
    for name in ("allow", "deny"):
        if name in policy:
            entries = policy[name]
            if isinstance(entries, str) or not all(isinstance(e, str) for e in entries):
                raise TypeError(f"network[{name!r}] is a list of strings, got {entries!r}")
            body[name] = list(entries)
    return body


def _put_limits(
    body: Dict[str, Any],
    cpu_limit_millis: Optional[int],
    pids_limit: Optional[int],
    io_limits: Optional[Dict[str, int]] = None,
) -> None:
    """Adds the CPU and tasks limits and the I/O caps that were given to a request body
    (the daemon checks their bounds and answers 400 naming a bad one)."""
    for name, value in (("cpu_limit_millis", cpu_limit_millis), ("pids_limit", pids_limit)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} is a whole number, got {value!r}")
        body[name] = value
    if io_limits is None:
        return
    if not isinstance(io_limits, dict):
        raise TypeError(f"io_limits is a dict of {', '.join(IO_LIMITS)}, got {io_limits!r}")
    unknown = sorted(set(io_limits) - set(IO_LIMITS))
    if unknown:
        raise ValueError(f"io_limits: unknown caps {unknown} (known: {', '.join(IO_LIMITS)})")
    for name, value in io_limits.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"io_limits[{name!r}] is a whole number, got {value!r}")
    if io_limits:
        body["io_limits"] = dict(io_limits)
