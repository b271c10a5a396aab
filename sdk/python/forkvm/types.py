"""Typed views of forkvmd's JSON answers (mirrors crates/forkvm-api/src/lib.rs).

Each class parses one response shape with ``from_json``. Parsing is strict about the
fields the daemon always sends (a missing or mistyped one is a ``ProtocolError``, not
an ``AttributeError`` three calls later) and tolerant of fields it does not know, so a
newer daemon that adds fields keeps working. The whole object stays in ``.raw``, and
``obj["field"]`` reads it, which keeps code written for forkd's dict answers working.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type, TypeVar

from .errors import ProtocolError

__all__ = [
    "SnapshotInfo",
    "SnapshotInfoDetail",
    "UnpackResult",
    "SandboxInfo",
    "LastDiskSnapshot",
    "VmmJail",
    "NetworkPolicy",
    "ExposedPort",
    "DiskSnapshotReport",
    "DiskSnapshotDisk",
    "DiskSnapshotInfo",
    "ExecResult",
    "EvalResult",
    "FileEntry",
    "FileWritten",
    "FileChecksum",
    "Lineage",
    "LineageNode",
    "LineageEdge",
    "SandboxUsage",
    "PruneBuildsReport",
    "Pong",
    "VersionInfo",
    "WorkspaceInfo",
    "VolumeInfo",
    "ProcessExit",
    "ProcessInfo",
    "RemoteInfo",
    "PushReport",
    "PullReport",
    "GcReport",
    "LockInfo",
]

T = TypeVar("T")
_MISSING = object()


class _Fields:
    """Reads typed fields out of one JSON object, naming the shape in every error."""

    def __init__(self, shape: str, data: Any) -> None:
        if not isinstance(data, Mapping):
            raise ProtocolError(f"{shape}: expected a JSON object, got {type(data).__name__}")
        self.shape = shape
        self.data: Mapping[str, Any] = data

    def _get(self, name: str, kinds: Tuple[type, ...], required: bool, default: Any) -> Any:
        value = self.data.get(name, _MISSING)
        if value is _MISSING:
            if required:
                raise ProtocolError(f"{self.shape}: missing field {name!r}")
            return default
        # bool is an int in Python; JSON true is never a number here.
        if isinstance(value, bool) and bool not in kinds:
            ok = False
        else:
            ok = isinstance(value, kinds)
        if not ok:
            names = "/".join(k.__name__ for k in kinds)
            raise ProtocolError(f"{self.shape}: field {name!r} should be {names}, got {value!r}")
        return value

    def req_str(self, name: str) -> str:
        v: str = self._get(name, (str,), True, None)
        return v

    def req_int(self, name: str) -> int:
        v: int = self._get(name, (int,), True, None)
        return v

    def req_bool(self, name: str) -> bool:
        v: bool = self._get(name, (bool,), True, None)
        return v

    def opt_str(self, name: str) -> Optional[str]:
        v: Optional[str] = self._get(name, (str, type(None)), False, None)
        return v

    def opt_int(self, name: str) -> Optional[int]:
        v: Optional[int] = self._get(name, (int, type(None)), False, None)
        return v

    def opt_float(self, name: str) -> Optional[float]:
        v = self._get(name, (int, float, type(None)), False, None)
        return None if v is None else float(v)

    def int_or(self, name: str, default: int) -> int:
        v: int = self._get(name, (int,), False, default)
        return v

    def bool_or(self, name: str, default: bool) -> bool:
        v: bool = self._get(name, (bool,), False, default)
        return v

    def str_or(self, name: str, default: str) -> str:
        v: str = self._get(name, (str,), False, default)
        return v

    def str_list(self, name: str, required: bool = True) -> List[str]:
        v = self._get(name, (list,), required, [])
        if not all(isinstance(x, str) for x in v):
            raise ProtocolError(f"{self.shape}: field {name!r} should be a list of strings")
        return list(v)

    def req_float(self, name: str) -> float:
        v = self._get(name, (int, float), True, None)
        return float(v)


class _Record:
    """Gives every response ``.raw`` and forkd-style ``obj["field"]`` access."""

    raw: Dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)


def _raw(data: Any) -> Dict[str, Any]:
    return dict(data)


def parse_list(cls: Type[T], data: Any, shape: str) -> List[T]:
    """Parses a JSON array of ``cls`` (which must have ``from_json``)."""
    if not isinstance(data, list):
        raise ProtocolError(f"{shape}: expected a JSON array, got {type(data).__name__}")
    return [cls.from_json(item) for item in data]  # type: ignore[attr-defined]


@dataclass
class VersionInfo(_Record):
    """``GET /version``."""

    version: str
    api: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "VersionInfo":
        f = _Fields("VersionInfo", data)
        return cls(version=f.req_str("version"), api=f.req_str("api"), raw=_raw(data))


@dataclass
class SnapshotInfo(_Record):
    """A snapshot in the store (``GET /v1/snapshots``, create, branch)."""

    tag: str
    dir: str
    created_at_unix: int
    #: ``writing``, ``ready`` or ``failed``.
    status: str
    #: Whether a sandbox can be spawned from it now.
    bootable: bool
    branched_from: Optional[str] = None
    #: Pause window of the branch that made it, whole milliseconds rounded up (forkd's
    #: integer); ``pause_us`` has the precision.
    pause_ms: Optional[float] = None
    #: forkvm: the pause window in microseconds.
    pause_us: Optional[int] = None
    #: forkd's ``measure_diff``: what a diff over the sandbox's parent would store: the
    #: milliseconds it took to work out, the bytes of the pages that differ, and the
    #: memory size they are out of.
    diff_ms: Optional[int] = None
    diff_physical_bytes: Optional[int] = None
    diff_logical_bytes: Optional[int] = None
    warning: Optional[str] = None
    template: Optional[str] = None
    #: Branch mode (``full``, ``live``, ``diff``) for branches.
    mode: Optional[str] = None
    memory_logical_bytes: int = 0
    memory_physical_bytes: int = 0
    #: forkvm: the limits a sandbox spawned from it gets unless its spawn asks for
    #: others (``memory_limit_mib``, ``cpu_limit_millis``, ``pids_limit``, ``io_limits``);
    #: ``None``: forkvm's defaults.
    default_limits: Optional[Dict[str, Any]] = None
    #: forkvm: where a sandbox spawned from it may connect to unless its spawn asks for
    #: another policy (a branch: its sandbox's policy when it was taken); ``None``:
    #: anywhere.
    default_network: Optional["NetworkPolicy"] = None
    #: forkvm: vCPUs of the sandboxes spawned from it (``None`` from an older daemon).
    vcpus: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "SnapshotInfo":
        f = _Fields("SnapshotInfo", data)
        limits = f._get("default_limits", (dict, type(None)), False, None)
        network = f._get("default_network", (dict, type(None)), False, None)
        return cls(
            tag=f.req_str("tag"),
            dir=f.req_str("dir"),
            created_at_unix=f.req_int("created_at_unix"),
            status=f.req_str("status"),
            bootable=f.req_bool("bootable"),
            branched_from=f.opt_str("branched_from"),
            pause_ms=f.opt_float("pause_ms"),
            pause_us=f.opt_int("pause_us"),
            diff_ms=f.opt_int("diff_ms"),
            diff_physical_bytes=f.opt_int("diff_physical_bytes"),
            diff_logical_bytes=f.opt_int("diff_logical_bytes"),
            warning=f.opt_str("warning"),
            template=f.opt_str("template"),
            mode=f.opt_str("mode"),
            memory_logical_bytes=f.int_or("memory_logical_bytes", 0),
            memory_physical_bytes=f.int_or("memory_physical_bytes", 0),
            default_limits=None
            if limits is None
            else {str(k): v for k, v in limits.items() if isinstance(v, int) and not isinstance(v, bool)},
            default_network=None if network is None else NetworkPolicy.from_json(network),
            vcpus=f.opt_int("vcpus"),
            raw=_raw(data),
        )


@dataclass
class SnapshotInfoDetail(_Record):
    """``GET /v1/snapshots/{tag}/info``: sizes, lineage and bootability.

    The fields after ``branched_from`` are forkvm's; they take their defaults when a
    daemon without snapshot chains leaves them out.
    """

    tag: str
    dir: str
    created_at_unix: Optional[int]
    #: Guest memory size.
    memory_logical_bytes: int
    #: Bytes the memory occupies on disk (a whole image's blocks, or a chunked
    #: snapshot's map plus the chunks it references).
    memory_physical_bytes: int
    vmstate_bytes: int
    parent_tag: Optional[str]
    parent_content_hash: Optional[str]
    #: Links above the chain's base (0 without a parent).
    chain_depth: int
    #: From the base to the parent.
    ancestors: List[str]
    #: Snapshots made directly on top of this one.
    dependents: List[str]
    #: ``writing``, ``ready`` or ``failed`` (not bootable; see ``problem``).
    status: str
    branched_from: Optional[str] = None
    #: Every snapshot built on this one, deepest first (``cascade`` deletes them).
    descendants: List[str] = field(default_factory=list)
    bootable: bool = True
    #: Why it is not bootable (say, its parent was deleted with ``force``).
    problem: Optional[str] = None
    #: ``image`` or ``chunked``.
    memory_format: str = ""
    content_hash: Optional[str] = None
    #: Bytes on disk of the whole chain, base to this snapshot.
    chain_physical_bytes: int = 0
    #: Chunks its memory map references.
    chunks: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "SnapshotInfoDetail":
        f = _Fields("SnapshotInfoDetail", data)
        return cls(
            tag=f.req_str("tag"),
            dir=f.req_str("dir"),
            created_at_unix=f.opt_int("created_at_unix"),
            memory_logical_bytes=f.req_int("memory_logical_bytes"),
            memory_physical_bytes=f.req_int("memory_physical_bytes"),
            vmstate_bytes=f.req_int("vmstate_bytes"),
            parent_tag=f.opt_str("parent_tag"),
            parent_content_hash=f.opt_str("parent_content_hash"),
            chain_depth=f.req_int("chain_depth"),
            ancestors=f.str_list("ancestors"),
            dependents=f.str_list("dependents"),
            status=f.req_str("status"),
            branched_from=f.opt_str("branched_from"),
            descendants=f.str_list("descendants", required=False),
            bootable=f.bool_or("bootable", True),
            problem=f.opt_str("problem"),
            memory_format=f.str_or("memory_format", ""),
            content_hash=f.opt_str("content_hash"),
            chain_physical_bytes=f.int_or("chain_physical_bytes", 0),
            chunks=f.int_or("chunks", 0),
            raw=_raw(data),
        )


@dataclass
class UnpackResult(_Record):
    """``POST /v1/snapshots/unpack``: what a pack brought into the store."""

    #: The chain's head (the tag that was packed).
    head: str
    #: Links written into the store, base first.
    imported: List[str]
    #: Links already there with the same content.
    reused: List[str]
    chunks_new: int
    chunks_present: int
    logical_bytes: int
    pack_bytes: int
    ms: float
    #: The ed25519 public key (hex) that signed the pack, if it was signed.
    signed_by: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "UnpackResult":
        f = _Fields("UnpackResult", data)
        return cls(
            head=f.req_str("head"),
            imported=f.str_list("imported"),
            reused=f.str_list("reused"),
            chunks_new=f.req_int("chunks_new"),
            chunks_present=f.req_int("chunks_present"),
            logical_bytes=f.req_int("logical_bytes"),
            pack_bytes=f.req_int("pack_bytes"),
            ms=f.req_float("ms"),
            signed_by=f.opt_str("signed_by"),
            raw=_raw(data),
        )


@dataclass
class LastDiskSnapshot(_Record):
    """forkvm: the daemon's last disk snapshot attempt on a sandbox."""

    #: When the attempt ended (Unix milliseconds).
    at_unix_ms: int
    #: The newest snapshot the attempt left (``None`` if it failed and none was taken).
    seq: Optional[int] = None
    #: Why the attempt failed; ``None`` when it succeeded.
    error: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "LastDiskSnapshot":
        f = _Fields("LastDiskSnapshot", data)
        return cls(at_unix_ms=f.req_int("at_unix_ms"), seq=f.opt_int("seq"), error=f.opt_str("error"), raw=_raw(data))


@dataclass
class VmmJail(_Record):
    """forkvm: how a sandbox's VMM process is confined, as the kernel reports it."""

    uid: int
    gid: int
    #: No capability in its effective, permitted or ambient set.
    no_capabilities: bool
    no_new_privs: bool
    #: ``filter`` (every thread), ``off`` (none) or ``partial``.
    seccomp: str
    threads: int
    seccomp_filtered_threads: int
    #: Namespaces it does not share with the daemon.
    own_namespaces: List[str]
    #: Its root directory as the daemon sees it.
    root: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "VmmJail":
        f = _Fields("VmmJail", data)
        return cls(
            uid=f.req_int("uid"),
            gid=f.req_int("gid"),
            no_capabilities=f.req_bool("no_capabilities"),
            no_new_privs=f.req_bool("no_new_privs"),
            seccomp=f.req_str("seccomp"),
            threads=f.req_int("threads"),
            seccomp_filtered_threads=f.req_int("seccomp_filtered_threads"),
            own_namespaces=f.str_list("own_namespaces"),
            root=f.req_str("root"),
            raw=_raw(data),
        )


@dataclass
class NetworkPolicy(_Record):
    """forkvm: where a sandbox's guest may connect to (docs/networking.md).

    ``allow`` and ``deny`` hold IPv4 addresses, CIDRs, domain names and wildcards
    (``*.pythonhosted.org``: every name under it). What ``allow`` names is reachable
    whatever ``deny`` says; what neither names is reachable when ``allow_internet``.
    """

    allow_internet: bool = True
    allow: List[str] = field(default_factory=list)
    deny: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "NetworkPolicy":
        f = _Fields("NetworkPolicy", data)
        return cls(
            allow_internet=f._get("allow_internet", (bool,), False, True),
            allow=f.str_list("allow", required=False),
            deny=f.str_list("deny", required=False),
            raw=_raw(data),
        )

    def to_json(self) -> Dict[str, Any]:
        """The request body that asks for this policy."""
        return {"allow_internet": self.allow_internet, "allow": list(self.allow), "deny": list(self.deny)}


@dataclass
class ExposedPort(_Record):
    """forkvm: a guest port reachable through the daemon at ``path``, by requests that
    present ``token`` (header ``X-Forkvm-Port-Token``, or once in a browser as
    ``?forkvm_token=``). Each sandbox and port has its own token; a fork's child gets
    new ones."""

    port: int
    #: ``/v1/sandboxes/{id}/ports/{port}/``, relative to the daemon's address.
    path: str
    token: str
    created_at_unix_ms: int
    #: The key thumbprint the token is bound to (DPoP, RFC 9449); ``None``: a bearer token.
    dpop_jkt: Optional[str] = None
    #: The ``Host`` that serves the port at an origin of its own, every path the
    #: guest's (``8000-<id>.localhost``: browsers resolve ``*.localhost`` to loopback);
    #: ``None`` when the daemon gives none.
    host: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "ExposedPort":
        f = _Fields("ExposedPort", data)
        return cls(
            port=f.req_int("port"),
            path=f.req_str("path"),
            token=f.req_str("token"),
            created_at_unix_ms=f.req_int("created_at_unix_ms"),
            dpop_jkt=f.opt_str("dpop_jkt"),
            host=f.opt_str("host"),
            raw=_raw(data),
        )


@dataclass
class DiskSnapshotReport(_Record):
    """forkvm: ``POST /v1/sandboxes/{id}/disk-snapshots``: what one disk snapshot did."""

    sandbox_id: str
    #: The snapshot's sequence number (the newest existing one when ``unchanged``).
    seq: int
    #: Nothing was written since the last snapshot: no new one was made.
    unchanged: bool
    new_layers: int
    #: Time the VMM spent sealing the disks (the vCPUs are not paused).
    seal_ms: float
    #: Time spent encrypting and writing to the vault.
    write_ms: float
    written_chunks: int
    written_bytes: int
    #: Bytes of distinct chunks the snapshot references (its whole disk state).
    stored_bytes: int
    #: Snapshots the retention policy removed afterwards.
    retired: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "DiskSnapshotReport":
        f = _Fields("DiskSnapshotReport", data)
        return cls(
            sandbox_id=f.req_str("sandbox_id"),
            seq=f.req_int("seq"),
            unchanged=f.req_bool("unchanged"),
            new_layers=f.req_int("new_layers"),
            seal_ms=f.req_float("seal_ms"),
            write_ms=f.req_float("write_ms"),
            written_chunks=f.req_int("written_chunks"),
            written_bytes=f.req_int("written_bytes"),
            stored_bytes=f.req_int("stored_bytes"),
            retired=f.req_int("retired"),
            raw=_raw(data),
        )


@dataclass
class DiskSnapshotDisk(_Record):
    """forkvm: one disk of a disk snapshot."""

    #: The disk's serial (e.g. ``forkvm-data``).
    id: str
    #: Content key of the base image its layers sit on.
    base_key: str
    size: int
    #: The newest sealed layer the snapshot covers (hex).
    layer_id: str
    #: Blocks that differ from the base.
    blocks: int
    extents: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "DiskSnapshotDisk":
        f = _Fields("DiskSnapshotDisk", data)
        return cls(
            id=f.req_str("id"),
            base_key=f.req_str("base_key"),
            size=f.req_int("size"),
            layer_id=f.req_str("layer_id"),
            blocks=f.req_int("blocks"),
            extents=f.req_int("extents"),
            raw=_raw(data),
        )


@dataclass
class DiskSnapshotInfo(_Record):
    """forkvm: one entry of ``GET /v1/sandboxes/{id}/disk-snapshots``."""

    seq: int
    created_unix_ms: int
    #: Bytes of distinct encrypted chunks it references.
    stored_bytes: int
    disks: List[DiskSnapshotDisk]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "DiskSnapshotInfo":
        f = _Fields("DiskSnapshotInfo", data)
        disks = f._get("disks", (list,), True, None)
        return cls(
            seq=f.req_int("seq"),
            created_unix_ms=f.req_int("created_unix_ms"),
            stored_bytes=f.req_int("stored_bytes"),
            disks=[DiskSnapshotDisk.from_json(d) for d in disks],
            raw=_raw(data),
        )


@dataclass
class SandboxInfo(_Record):
    """A sandbox: running, paused (by the daemon, when idle) or archived."""

    id: str
    guest_addr: str
    created_at_unix: int
    has_branched: bool
    branch_count: int
    #: ``running``, ``paused`` (idle; the next call resumes it) or ``archived``.
    state: str
    last_active_unix: int
    snapshot_tag: Optional[str] = None
    netns: Optional[str] = None
    pid: Optional[int] = None
    memory_limit_mib: Optional[int] = None
    #: forkvm: the CPU limit (thousandths of a CPU) and tasks limit its cgroup holds;
    #: ``None`` without a cgroup.
    cpu_limit_millis: Optional[int] = None
    pids_limit: Optional[int] = None
    #: forkvm: the caps on its disk and entropy I/O (``disk_bytes_per_sec``,
    #: ``disk_ops_per_sec``, ``rng_bytes_per_sec``, ``net_tx_bytes_per_sec``,
    #: ``net_rx_bytes_per_sec``); ``None``: no cap.
    io_limits: Optional[Dict[str, int]] = None
    last_branch_memory_path: Optional[str] = None
    template: Optional[str] = None
    #: The running sandbox it was forked from, if any.
    forked_from: Optional[str] = None
    #: forkvm: the daemon's last disk snapshot of it, if it tried one since it started.
    last_disk_snapshot: Optional[LastDiskSnapshot] = None
    #: forkvm: why it is in its state: ``idle`` (paused), ``api``/``ttl``/``recovered`` (archived).
    reason: Optional[str] = None
    #: forkvm: last call that used it, Unix ms.
    last_activity_unix_ms: int = 0
    #: forkvm: its time to live and when it runs out (Unix ms), if it has one.
    ttl_seconds: Optional[int] = None
    expires_at_unix_ms: Optional[int] = None
    #: forkvm: when it was archived (Unix ms).
    archived_at_unix_ms: Optional[int] = None
    #: forkvm: how its VMM is confined (``get_sandbox`` only; ``None`` in lists).
    jail: Optional[VmmJail] = None
    #: forkvm: where its guest may connect to; ``None``: anywhere.
    network: Optional[NetworkPolicy] = None
    #: forkvm: its vCPUs (its snapshot's; ``None`` from an older daemon).
    vcpus: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "SandboxInfo":
        f = _Fields("SandboxInfo", data)
        last = f._get("last_disk_snapshot", (dict, type(None)), False, None)
        jail = f._get("jail", (dict, type(None)), False, None)
        network = f._get("network", (dict, type(None)), False, None)
        return cls(
            id=f.req_str("id"),
            guest_addr=f.req_str("guest_addr"),
            created_at_unix=f.req_int("created_at_unix"),
            has_branched=f.req_bool("has_branched"),
            branch_count=f.req_int("branch_count"),
            state=f.req_str("state"),
            last_active_unix=f.req_int("last_active_unix"),
            snapshot_tag=f.opt_str("snapshot_tag"),
            netns=f.opt_str("netns"),
            pid=f.opt_int("pid"),
            memory_limit_mib=f.opt_int("memory_limit_mib"),
            cpu_limit_millis=f.opt_int("cpu_limit_millis"),
            pids_limit=f.opt_int("pids_limit"),
            io_limits=f._get("io_limits", (dict, type(None)), False, None),
            last_branch_memory_path=f.opt_str("last_branch_memory_path"),
            template=f.opt_str("template"),
            forked_from=f.opt_str("forked_from"),
            last_disk_snapshot=None if last is None else LastDiskSnapshot.from_json(last),
            reason=f.opt_str("reason"),
            last_activity_unix_ms=f.opt_int("last_activity_unix_ms") or 0,
            ttl_seconds=f.opt_int("ttl_seconds"),
            expires_at_unix_ms=f.opt_int("expires_at_unix_ms"),
            archived_at_unix_ms=f.opt_int("archived_at_unix_ms"),
            jail=None if jail is None else VmmJail.from_json(jail),
            network=None if network is None else NetworkPolicy.from_json(network),
            vcpus=f.opt_int("vcpus"),
            raw=_raw(data),
        )


@dataclass
class WorkspaceInfo(_Record):
    """A workspace (``/v1/workspaces``): forkd's named, long-lived sandbox. Suspend
    archives its sandbox, resume restores the same one."""

    id: str
    name: str
    source_snapshot_tag: str
    #: ``running``, ``suspended`` or ``stale`` (its sandbox was deleted on its own).
    status: str
    created_at_unix: int
    last_active_unix: int
    #: forkvm: its sandbox, running or archived (the same across suspend and resume).
    sandbox_id: str
    #: Its sandbox while it runs.
    live_sandbox_id: Optional[str] = None
    #: forkd's; never set by forkvm (a suspended workspace is an archive, not a tag).
    current_state_tag: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "WorkspaceInfo":
        f = _Fields("WorkspaceInfo", data)
        return cls(
            id=f.req_str("id"),
            name=f.req_str("name"),
            source_snapshot_tag=f.req_str("source_snapshot_tag"),
            status=f.req_str("status"),
            created_at_unix=f.req_int("created_at_unix"),
            last_active_unix=f.req_int("last_active_unix"),
            sandbox_id=f.req_str("sandbox_id"),
            live_sandbox_id=f.opt_str("live_sandbox_id"),
            current_state_tag=f.opt_str("current_state_tag"),
            raw=_raw(data),
        )


@dataclass
class VolumeInfo(_Record):
    """A volume (``/v1/volumes``): a named ext4 disk that outlives sandboxes. A spawn
    attaches it with ``volumes=[{"name": ..., "mount": "/data", "mode": "rw"}]``."""

    name: str
    size_bytes: int
    created_at_unix_ms: int
    #: Sealed layers (each a set of writes taken in).
    layers: int
    #: Bytes its files take on the host's disk.
    stored_bytes: int
    #: The sandbox writing it now.
    writer: Optional[str] = None
    #: Live sandboxes reading it (read-only or copy-on-write).
    readers: List[str] = field(default_factory=list)
    #: The volume it was snapshotted from.
    snapshot_of: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "VolumeInfo":
        f = _Fields("VolumeInfo", data)
        return cls(
            name=f.req_str("name"),
            size_bytes=f.req_int("size_bytes"),
            created_at_unix_ms=f.req_int("created_at_unix_ms"),
            layers=f.req_int("layers"),
            stored_bytes=f.req_int("stored_bytes"),
            writer=f.opt_str("writer"),
            readers=f.str_list("readers", required=False),
            snapshot_of=f.opt_str("snapshot_of"),
            raw=_raw(data),
        )


@dataclass
class ArchiveReport(_Record):
    """forkvm: ``POST /v1/sandboxes/{id}/archive``: what archiving did."""

    sandbox_id: str
    #: The archive, ``<store>/archives/<id>``.
    dir: str
    #: ``api`` or ``ttl``.
    reason: str
    write_ms: float
    total_ms: float
    #: The last disk snapshot taken before the VMM stopped (layered disks only).
    disk_snapshot_seq: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "ArchiveReport":
        f = _Fields("ArchiveReport", data)
        return cls(
            sandbox_id=f.req_str("sandbox_id"),
            dir=f.req_str("dir"),
            reason=f.req_str("reason"),
            write_ms=f.req_float("write_ms"),
            total_ms=f.req_float("total_ms"),
            disk_snapshot_seq=f.opt_int("disk_snapshot_seq"),
            raw=_raw(data),
        )


@dataclass
class ExecResult(_Record):
    """What a command did. ``exit_code`` is the process's code, else 128 + signal,
    else 124 on timeout; ``signal`` and ``timed_out`` say which. ``truncated``: stdout
    or stderr was longer than the call's ``max_output_bytes`` and is cut there;
    ``stdout_bytes``/``stderr_bytes`` count everything the process wrote."""

    stdout: str
    stderr: str
    exit_code: int
    signal: Optional[int] = None
    timed_out: bool = False
    duration_ms: int = 0
    truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """Exited by itself with code 0."""
        return self.exit_code == 0 and not self.timed_out and self.signal is None

    @classmethod
    def from_json(cls, data: Any) -> "ExecResult":
        f = _Fields("ExecResult", data)
        return cls(
            stdout=f.req_str("stdout"),
            stderr=f.req_str("stderr"),
            exit_code=f.req_int("exit_code"),
            signal=f.opt_int("signal"),
            timed_out=f.bool_or("timed_out", False),
            duration_ms=f.int_or("duration_ms", 0),
            truncated=f.bool_or("truncated", False),
            stdout_bytes=f.int_or("stdout_bytes", 0),
            stderr_bytes=f.int_or("stderr_bytes", 0),
            raw=_raw(data),
        )


@dataclass
class EvalResult(_Record):
    """``POST /v1/sandboxes/{id}/eval``: ``result`` is ``repr()`` of the last expression;
    ``error`` the exception and traceback if the code raised (then ``exit_code`` is 1)."""

    result: Optional[str]
    error: Optional[str]
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "EvalResult":
        f = _Fields("EvalResult", data)
        return cls(
            result=f.opt_str("result"),
            error=f.opt_str("error"),
            exit_code=f.req_int("exit_code"),
            stdout=f.str_or("stdout", ""),
            stderr=f.str_or("stderr", ""),
            raw=_raw(data),
        )


@dataclass
class FileEntry(_Record):
    """One entry of a directory listing."""

    name: str
    #: ``file``, ``dir``, ``symlink`` or ``other``.
    type: str
    size: int
    mode: int
    mtime_unix_ns: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @classmethod
    def from_json(cls, data: Any) -> "FileEntry":
        f = _Fields("FileEntry", data)
        return cls(
            name=f.req_str("name"),
            type=f.req_str("type"),
            size=f.req_int("size"),
            mode=f.req_int("mode"),
            mtime_unix_ns=f.req_int("mtime_unix_ns"),
            raw=_raw(data),
        )


@dataclass
class FileWritten(_Record):
    """The reply to a file or tar upload: where it went, how many bytes, and their
    SHA-256 as the daemon received them (``None`` from a daemon older than that)."""

    path: str
    bytes: int
    sha256: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "FileWritten":
        f = _Fields("FileWritten", data)
        return cls(path=f.req_str("path"), bytes=f.req_int("bytes"), sha256=f.opt_str("sha256"), raw=_raw(data))


@dataclass
class FileChecksum(_Record):
    """A file's size and SHA-256 (lowercase hex), computed in the guest."""

    path: str
    size: int
    sha256: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "FileChecksum":
        f = _Fields("FileChecksum", data)
        return cls(path=f.req_str("path"), size=f.req_int("size"), sha256=f.req_str("sha256"), raw=_raw(data))


@dataclass
class LineageNode(_Record):
    """A sandbox (``sandbox:ID``) or a snapshot (``snapshot:TAG``) of the lineage graph."""

    id: str
    #: ``sandbox`` or ``snapshot``.
    kind: str
    #: The sandbox's id or the snapshot's tag.
    name: str
    #: A sandbox's (``running``, ``paused``, ``archived``) or a snapshot's (``ready``,
    #: ``writing``, ``failed``).
    state: str
    #: Guest memory: a snapshot's, a sandbox's (its snapshot's; its limit or 0 when
    #: that snapshot is gone).
    memory_bytes: int
    #: Bytes a snapshot's memory occupies in the store (None for a sandbox).
    stored_bytes: Optional[int]
    created_at_unix: int
    #: A branch's mode (``full``, ``live``, ``diff``), when recorded.
    mode: Optional[str]
    #: Links below a snapshot in its chain (0 for a sandbox).
    chain_depth: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "LineageNode":
        f = _Fields("LineageNode", data)
        return cls(
            id=f.req_str("id"),
            kind=f.req_str("kind"),
            name=f.req_str("name"),
            state=f.req_str("state"),
            memory_bytes=f.req_int("memory_bytes"),
            stored_bytes=f.opt_int("stored_bytes"),
            created_at_unix=f.req_int("created_at_unix"),
            mode=f.opt_str("mode"),
            chain_depth=f.int_or("chain_depth", 0),
            raw=_raw(data),
        )


@dataclass
class LineageEdge(_Record):
    """Who came from what: ``spawn``, ``fork``, ``branch``, ``chain`` or ``compact``."""

    #: Node ids (``sandbox:ID``, ``snapshot:TAG``).
    from_: str = field(metadata={"json": "from"})
    to: str
    kind: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "LineageEdge":
        f = _Fields("LineageEdge", data)
        return cls(from_=f.req_str("from"), to=f.req_str("to"), kind=f.req_str("kind"), raw=_raw(data))


@dataclass
class Lineage(_Record):
    """``GET /v1/lineage``: every sandbox and snapshot, and the edges between them."""

    nodes: List[LineageNode]
    edges: List[LineageEdge]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "Lineage":
        f = _Fields("Lineage", data)
        nodes = f._get("nodes", (list,), True, None)
        edges = f._get("edges", (list,), True, None)
        return cls(
            nodes=[LineageNode.from_json(n) for n in nodes],
            edges=[LineageEdge.from_json(e) for e in edges],
            raw=_raw(data),
        )

    def node(self, node_id: str) -> Optional[LineageNode]:
        """The node ``node_id`` (``sandbox:ID`` or ``snapshot:TAG``), if listed."""
        return next((n for n in self.nodes if n.id == node_id), None)


@dataclass
class SandboxUsage(_Record):
    """``GET /v1/sandboxes/{id}/usage``: what its VMM uses of the host now."""

    at_unix_ms: int
    #: Memory charged to its VMM.
    memory_bytes: int
    memory_limit_bytes: Optional[int]
    #: CPU time since it started (a rate is the difference of two samples).
    cpu_usage_usec: int
    vcpus: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "SandboxUsage":
        f = _Fields("SandboxUsage", data)
        return cls(
            at_unix_ms=f.req_int("at_unix_ms"),
            memory_bytes=f.req_int("memory_bytes"),
            memory_limit_bytes=f.opt_int("memory_limit_bytes"),
            cpu_usage_usec=f.req_int("cpu_usage_usec"),
            vcpus=f.req_int("vcpus"),
            raw=_raw(data),
        )


@dataclass
class PruneBuildsReport(_Record):
    """``POST /v1/templates/prune``: the build cache's step snapshots removed (or, in a
    dry run, those that would be)."""

    #: Leaves first.
    removed: List[str]
    #: Step snapshots kept: under a tag, run from, or too recent.
    kept: int
    freed_bytes: int
    dry_run: bool
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "PruneBuildsReport":
        f = _Fields("PruneBuildsReport", data)
        return cls(
            removed=f.str_list("removed"),
            kept=f.req_int("kept"),
            freed_bytes=f.req_int("freed_bytes"),
            dry_run=f.req_bool("dry_run"),
            raw=_raw(data),
        )


@dataclass
class Pong(_Record):
    """The guest agent's answer to a ping."""

    agent_version: str
    protocol_version: int
    uptime_ms: int
    generation: int
    eval_available: bool
    sandbox_id: Optional[str] = None
    #: forkd's fields: always true; whether the warm interpreter is there; its language
    #: (``python``, or ``None`` without one).
    pong: bool = True
    warmup_ready: bool = False
    agent_lang: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "Pong":
        f = _Fields("Pong", data)
        return cls(
            agent_version=f.req_str("agent_version"),
            protocol_version=f.req_int("protocol_version"),
            uptime_ms=f.req_int("uptime_ms"),
            generation=f.req_int("generation"),
            eval_available=f.req_bool("eval_available"),
            sandbox_id=f.opt_str("sandbox_id"),
            pong=f.bool_or("pong", True),
            warmup_ready=f.bool_or("warmup_ready", False),
            agent_lang=f.opt_str("agent_lang"),
            raw=_raw(data),
        )


@dataclass
class ProcessExit(_Record):
    """How a background process ended."""

    #: Its code, else 128 + the signal that ended it, else 124 after its timeout.
    exit_code: int
    timed_out: bool
    duration_ms: int
    signal: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "ProcessExit":
        f = _Fields("ProcessExit", data)
        return cls(
            exit_code=f.req_int("exit_code"),
            timed_out=f.req_bool("timed_out"),
            duration_ms=f.req_int("duration_ms"),
            signal=f.opt_int("signal"),
            raw=_raw(data),
        )


@dataclass
class ProcessInfo(_Record):
    """A background process of a sandbox (``/v1/sandboxes/{id}/processes``): it runs on
    after the call that started it; its output is kept (the last ``ring_bytes``) to
    read from any offset. Offsets count stdout and stderr together."""

    pid: int
    argv: List[str]
    started_at_unix_ms: int
    #: The offset after its last byte of output so far.
    output_end: int
    #: The offset of the oldest byte still kept.
    output_start: int
    stdin_open: bool
    running: bool
    tag: Optional[str] = None
    #: ``(rows, cols)`` of its terminal, when it runs on one.
    pty: Optional[Tuple[int, int]] = None
    #: How it ended; ``None`` while it runs.
    exit: Optional[ProcessExit] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "ProcessInfo":
        f = _Fields("ProcessInfo", data)
        pty = data.get("pty") if isinstance(data, Mapping) else None
        size: Optional[Tuple[int, int]] = None
        if pty is not None:
            if not isinstance(pty, Mapping) or not all(isinstance(pty.get(k), int) for k in ("rows", "cols")):
                raise ProtocolError(f"ProcessInfo: field 'pty' should be {{rows, cols}}, got {pty!r}")
            size = (int(pty["rows"]), int(pty["cols"]))
        exit_ = data.get("exit") if isinstance(data, Mapping) else None
        return cls(
            pid=f.req_int("pid"),
            argv=f.str_list("argv"),
            started_at_unix_ms=f.req_int("started_at_unix_ms"),
            output_end=f.req_int("output_end"),
            output_start=f.req_int("output_start"),
            stdin_open=f.req_bool("stdin_open"),
            running=f.req_bool("running"),
            tag=f.opt_str("tag"),
            pty=size,
            exit=None if exit_ is None else ProcessExit.from_json(exit_),
            raw=_raw(data),
        )


# --- the daemon's remote (``/v1/remote*``) -----------------------------------------------


@dataclass
class RemoteInfo(_Record):
    """forkvm: ``GET /v1/remote``: the daemon's object-storage remote (``forkvm daemon
    --remote URL``) and the tags pushed there."""

    url: str
    tags: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "RemoteInfo":
        f = _Fields("RemoteInfo", data)
        return cls(url=f.req_str("url"), tags=f.str_list("tags"), raw=_raw(data))


@dataclass
class PushReport(_Record):
    """forkvm: ``POST /v1/remote/push``: what pushing a tag's chain did."""

    tag: str
    remote: str
    #: Tags from the base to the head.
    links: List[str]
    entries: int
    #: Blocks the chain is made of (holes are not blocks).
    blocks: int
    #: Blocks uploaded: the remote lacked them.
    blocks_uploaded: int
    #: Blocks the remote held already (another tag's, or an earlier cut-off push's).
    blocks_present: int
    #: Blocks repeated within the chain, uploaded once.
    blocks_repeated: int
    #: Bytes uploaded (sealed blocks and the manifest).
    bytes_uploaded: int
    #: Bytes of the entries' blocks before compression.
    logical_bytes: int
    ms: float
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "PushReport":
        f = _Fields("PushReport", data)
        return cls(
            tag=f.req_str("tag"),
            remote=f.req_str("remote"),
            links=f.str_list("links"),
            entries=f.req_int("entries"),
            blocks=f.req_int("blocks"),
            blocks_uploaded=f.req_int("blocks_uploaded"),
            blocks_present=f.req_int("blocks_present"),
            blocks_repeated=f.req_int("blocks_repeated"),
            bytes_uploaded=f.req_int("bytes_uploaded"),
            logical_bytes=f.req_int("logical_bytes"),
            ms=f.req_float("ms"),
            raw=_raw(data),
        )


@dataclass
class PullReport(_Record):
    """forkvm: ``POST /v1/remote/pull``: what pulling a tag's chain did."""

    tag: str
    remote: str
    #: Links written into the store, base first.
    imported: List[str]
    #: Links the store had with the same content.
    reused: List[str]
    #: Blocks the chain is made of.
    blocks: int
    #: Blocks not needed: the store had them.
    blocks_local: int
    #: Blocks read from the host's block cache.
    blocks_cached: int
    #: Blocks downloaded.
    blocks_fetched: int
    #: Bytes downloaded (sealed blocks and the manifest).
    bytes_fetched: int
    #: Memory chunks the store gained.
    chunks_new: int
    #: Memory chunks left on the remote (a lazy pull).
    chunks_left_remote: int
    ms: float
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "PullReport":
        f = _Fields("PullReport", data)
        return cls(
            tag=f.req_str("tag"),
            remote=f.req_str("remote"),
            imported=f.str_list("imported"),
            reused=f.str_list("reused"),
            blocks=f.req_int("blocks"),
            blocks_local=f.req_int("blocks_local"),
            blocks_cached=f.req_int("blocks_cached"),
            blocks_fetched=f.req_int("blocks_fetched"),
            bytes_fetched=f.req_int("bytes_fetched"),
            chunks_new=f.req_int("chunks_new"),
            chunks_left_remote=f.req_int("chunks_left_remote"),
            ms=f.req_float("ms"),
            raw=_raw(data),
        )


@dataclass
class GcReport(_Record):
    """forkvm: ``POST /v1/remote/gc``: what a collection did (or, dry, would do)."""

    remote: str
    dry_run: bool
    #: Tags whose manifests were read.
    tags: int
    #: Blocks on the remote before.
    blocks: int
    #: Blocks some manifest names.
    blocks_referenced: int
    #: Blocks no manifest names but younger than the minimum age (kept).
    blocks_young: int
    #: Blocks deleted (or that would be).
    blocks_deleted: int
    bytes_deleted: int
    ms: float
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "GcReport":
        f = _Fields("GcReport", data)
        return cls(
            remote=f.req_str("remote"),
            dry_run=f.req_bool("dry_run"),
            tags=f.req_int("tags"),
            blocks=f.req_int("blocks"),
            blocks_referenced=f.req_int("blocks_referenced"),
            blocks_young=f.req_int("blocks_young"),
            blocks_deleted=f.req_int("blocks_deleted"),
            bytes_deleted=f.req_int("bytes_deleted"),
            ms=f.req_float("ms"),
            raw=_raw(data),
        )


@dataclass
class LockInfo(_Record):
    """forkvm: one lock on the daemon's remote (``GET /v1/remote/locks``)."""

    #: The object's name under ``locks/`` (what :meth:`Controller.break_remote_lock` takes).
    name: str
    #: ``shared`` (a push) or ``exclusive`` (a collection).
    kind: str
    #: Seconds since the holder last rewrote it.
    age_s: int
    #: Not rewritten for 30 minutes: a crashed holder's, which nothing waits for.
    stale: bool
    #: Who wrote it, when it could be read.
    host: Optional[str] = None
    pid: Optional[int] = None
    #: What holds it: ``push TAG`` or ``gc``.
    purpose: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "LockInfo":
        f = _Fields("LockInfo", data)
        return cls(
            name=f.req_str("name"),
            kind=f.req_str("kind"),
            age_s=f.req_int("age_s"),
            stale=f.req_bool("stale"),
            host=f.opt_str("host"),
            pid=f.opt_int("pid"),
            purpose=f.opt_str("purpose"),
            raw=_raw(data),
        )
