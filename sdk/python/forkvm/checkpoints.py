"""Checkpoints of a running sandbox and rewinding it to one, in place.

A checkpoint holds the sandbox's memory and disks as they were (processes, interpreter
state and files), as a snapshot tag of its own. ``sandbox.checkpoints`` takes them, sets
when the daemon takes them by itself (a timer, after every exec/eval call), lists them,
rewinds the sandbox to one (same id) and forks children from one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from .types import _Fields, _raw, _Record

if TYPE_CHECKING:  # pragma: no cover
    from .sandbox import Sandbox

__all__ = ["CheckpointInfo", "CheckpointList", "CheckpointPolicy", "RewindReport", "Checkpoints"]


@dataclass
class CheckpointPolicy(_Record):
    """When the daemon checkpoints a sandbox by itself, and how many it keeps."""

    #: A checkpoint every this many seconds while it runs (None: no timer).
    every_seconds: Optional[int] = None
    #: A checkpoint after every exec and eval call, before the call answers.
    after_exec: bool = False
    #: How many are kept (1-256); the oldest goes first.
    keep: int = 32
    #: The most MiB (memory and disk layers) the kept checkpoints may have added to the
    #: store (None: no bound).
    max_stored_mib: Optional[int] = None
    #: Checkpoints older than this many seconds go; the newest stays (None: no window).
    max_age_seconds: Optional[int] = None
    #: Checkpoints older than this many seconds are thinned to one per
    #: ``thin_every_seconds`` (the newest of each stretch stays); both or neither.
    thin_after_seconds: Optional[int] = None
    thin_every_seconds: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "CheckpointPolicy":
        f = _Fields("CheckpointPolicy", data)
        return cls(
            every_seconds=f.opt_int("every_seconds"),
            after_exec=f.bool_or("after_exec", False),
            keep=f.int_or("keep", 32),
            max_stored_mib=f.opt_int("max_stored_mib"),
            max_age_seconds=f.opt_int("max_age_seconds"),
            thin_after_seconds=f.opt_int("thin_after_seconds"),
            thin_every_seconds=f.opt_int("thin_every_seconds"),
            raw=_raw(data),
        )

    def to_json(self) -> Dict[str, Any]:
        return {
            "every_seconds": self.every_seconds,
            "after_exec": self.after_exec,
            "keep": self.keep,
            "max_stored_mib": self.max_stored_mib,
            "max_age_seconds": self.max_age_seconds,
            "thin_after_seconds": self.thin_after_seconds,
            "thin_every_seconds": self.thin_every_seconds,
        }


@dataclass
class CheckpointInfo(_Record):
    """One checkpoint: ``tag`` is a snapshot tag (spawn or fork children from it)."""

    sandbox_id: str
    seq: int
    tag: str
    created_at_unix_ms: int
    #: ``api``, ``interval`` or ``exec``.
    trigger: str
    #: The note given, or for ``exec`` the call that ran just before it.
    note: Optional[str]
    pause_ms: float
    #: Memory pages that differ from the sandbox's base snapshot.
    pages: int
    #: Bytes this checkpoint added to the store, memory and disk.
    bytes_stored: int
    #: Of ``bytes_stored``, the disks' new sealed layers.
    disk_bytes_stored: int
    total_ms: float
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "CheckpointInfo":
        f = _Fields("CheckpointInfo", data)
        return cls(
            sandbox_id=f.req_str("sandbox_id"),
            seq=f.req_int("seq"),
            tag=f.req_str("tag"),
            created_at_unix_ms=f.req_int("created_at_unix_ms"),
            trigger=f.req_str("trigger"),
            note=f.opt_str("note"),
            pause_ms=f.req_float("pause_ms"),
            pages=f.req_int("pages"),
            bytes_stored=f.req_int("bytes_stored"),
            disk_bytes_stored=f.req_int("disk_bytes_stored"),
            total_ms=f.req_float("total_ms"),
            raw=_raw(data),
        )


@dataclass
class CheckpointList(_Record):
    """``GET /v1/sandboxes/{id}/checkpoints``: oldest first, with the policy."""

    sandbox_id: str
    policy: CheckpointPolicy
    base_tag: Optional[str]
    checkpoints: List[CheckpointInfo]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "CheckpointList":
        f = _Fields("CheckpointList", data)
        items = data.get("checkpoints") if isinstance(data, dict) else None
        return cls(
            sandbox_id=f.req_str("sandbox_id"),
            policy=CheckpointPolicy.from_json(data.get("policy") if isinstance(data, dict) else None),
            base_tag=f.opt_str("base_tag"),
            checkpoints=[CheckpointInfo.from_json(c) for c in (items if isinstance(items, list) else [])],
            raw=_raw(data),
        )


@dataclass
class RewindReport(_Record):
    """What a rewind did: the checkpoint the sandbox is back at, and the time it took."""

    sandbox_id: str
    checkpoint: CheckpointInfo
    stop_ms: float
    total_ms: float
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> "RewindReport":
        f = _Fields("RewindReport", data)
        return cls(
            sandbox_id=f.req_str("sandbox_id"),
            checkpoint=CheckpointInfo.from_json(data.get("checkpoint") if isinstance(data, dict) else None),
            stop_ms=f.req_float("stop_ms"),
            total_ms=f.req_float("total_ms"),
            raw=_raw(data),
        )


class Checkpoints:
    """``sandbox.checkpoints``: take, list, rewind to and fork from checkpoints."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def create(self, note: Optional[str] = None) -> CheckpointInfo:
        """A checkpoint now (the guest pauses for a few milliseconds)."""
        return self._sb.controller.create_checkpoint(self._sb.id, note=note)

    def list(self) -> List[CheckpointInfo]:
        """The kept checkpoints, oldest first."""
        return self._sb.controller.list_checkpoints(self._sb.id).checkpoints

    def policy(self) -> CheckpointPolicy:
        return self._sb.controller.list_checkpoints(self._sb.id).policy

    def set_policy(
        self,
        *,
        every_seconds: Optional[int] = None,
        after_exec: bool = False,
        keep: int = 32,
        max_stored_mib: Optional[int] = None,
        max_age_seconds: Optional[int] = None,
    ) -> CheckpointPolicy:
        """Replaces when the daemon checkpoints this sandbox by itself, and how many (and
        how many MiB of them) it keeps."""
        policy = CheckpointPolicy(
            every_seconds=every_seconds,
            after_exec=after_exec,
            keep=keep,
            max_stored_mib=max_stored_mib,
            max_age_seconds=max_age_seconds,
        )
        return self._sb.controller.set_checkpoint_policy(self._sb.id, policy).policy

    def rewind(self, seq: Optional[int] = None, *, ago_seconds: Optional[float] = None) -> RewindReport:
        """Puts this sandbox back at checkpoint ``seq`` (or the newest at least
        ``ago_seconds`` old), in place: same id, its processes, variables and files as
        they were then. What it did since is gone."""
        report = self._sb.controller.rewind(self._sb.id, seq=seq, ago_seconds=ago_seconds)
        self._sb.refresh()
        return report

    def fork(self, seq: int, n: int = 1) -> "List[Sandbox]":
        """``n`` new sandboxes started at checkpoint ``seq`` (this one runs on)."""
        from .sandbox import Sandbox

        tag = next((c.tag for c in self.list() if c.seq == seq), None)
        if tag is None:
            from .errors import NotFound

            raise NotFound(f"sandbox {self._sb.id} has no checkpoint {seq}", status=404, code="not_found")
        infos = self._sb.controller.spawn_sandboxes(tag, n)
        return [Sandbox(info, self._sb.controller) for info in infos]
