"""Reading ``POST /v1/templates/oci`` (an image archive made into a template) and
``POST /v1/templates/build`` (a Dockerfile built into a tag, every step in a sandbox).

The daemon imports the uploaded image before it answers (a body that is not an image is
a :class:`BadRequest`, a name taken a :class:`Conflict`), then sends one JSON line per
step of the build: ``imported`` first, ``built``, ``snapshot`` when asked, ``done`` or
``error`` last. :func:`template_import_from_lines` turns them into one
:class:`TemplateImport`; an ``error`` line raises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .errors import ForkvmError, ProtocolError

__all__ = ["TemplateImport", "template_import_from_lines", "TemplateBuild", "template_build_from_lines"]


@dataclass(frozen=True)
class TemplateImport:
    """A template made from an OCI image (``docs/templates.md``)."""

    #: The template's name (what ``create_snapshot(tag, template)`` takes).
    template: str
    #: The image manifest's digest, ``sha256:<hex>``.
    manifest: str
    layers: int
    #: Blob bytes the import added to the daemon's store, and those it found there.
    new_bytes: int
    shared_bytes: int
    #: The image's Entrypoint + Cmd, and its ExposedPorts.
    command: List[str]
    exposed_ports: List[str]
    image_bytes: int
    build_seconds: float
    #: Set when the template snapshot was made too (``snapshot=True``).
    snapshot_seconds: Optional[float] = None
    #: Every line, as sent.
    events: List[Dict[str, Any]] = field(default_factory=list, repr=False, compare=False)


def _events(text: str, url: str, what: str) -> List[Dict[str, Any]]:
    """The NDJSON lines of a template import or build; an ``error`` line raises."""
    events: List[Dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except ValueError as e:
            raise ProtocolError(f"{what} line is not JSON: {line[:200]!r} ({e})", url=url) from e
        if not isinstance(ev, dict):
            raise ProtocolError(f"{what} line is not an object: {line[:200]!r}", url=url)
        if ev.get("type") == "error":
            message = ev.get("error")
            raise ForkvmError(message if isinstance(message, str) else f"{what} failed: {ev!r}", url=url, body=ev)
        events.append(ev)
    return events


def template_import_from_lines(text: str, url: str) -> TemplateImport:
    events = _events(text, url, "template import")
    by_type = {ev.get("type"): ev for ev in events}
    imported, built, done = by_type.get("imported"), by_type.get("built"), by_type.get("done")
    if imported is None or built is None or done is None or events[-1].get("type") != "done":
        raise ProtocolError(f"template import ended early: {[ev.get('type') for ev in events]}", url=url)
    try:
        snapshot = by_type.get("snapshot")
        return TemplateImport(
            template=str(done["template"]),
            manifest=str(imported["manifest"]),
            layers=int(imported["layers"]),
            new_bytes=int(imported["new_bytes"]),
            shared_bytes=int(imported["shared_bytes"]),
            command=[str(w) for w in imported["command"]],
            exposed_ports=[str(p) for p in imported["exposed_ports"]],
            image_bytes=int(built["image_bytes"]),
            build_seconds=float(built["seconds"]),
            snapshot_seconds=None if snapshot is None else float(snapshot["seconds"]),
            events=events,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"template import lines lack a field: {e}", url=url) from e


@dataclass(frozen=True)
class TemplateBuild:
    """A Dockerfile built into a tag (``docs/dockerfile.md``): the ``done`` line's report."""

    #: The tag the result is published as (what ``spawn_sandboxes`` takes).
    tag: str
    #: FROM, variables expanded, and the snapshot the first step forked.
    base: str
    base_snapshot: str
    #: Steps run and steps found from earlier builds; the last step found too.
    ran: int
    cached: int
    finish_cached: bool
    #: One dict per step: ``step``, ``line``, ``instruction``, ``snapshot``, ``cached``,
    #: ``seconds`` (when it ran).
    steps: List[Dict[str, Any]]
    #: ENTRYPOINT + CMD as one argv, EXPOSE, ENV as ``NAME=VALUE``.
    command: Optional[List[str]]
    expose: List[str]
    env: List[str]
    workdir: Optional[str]
    user: Optional[str]
    replaced: bool
    seconds: float
    #: The report as sent, and every line (``output`` lines carry what RUN printed).
    report: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    events: List[Dict[str, Any]] = field(default_factory=list, repr=False, compare=False)

    @property
    def output(self) -> str:
        """Everything the steps printed, in order."""
        return "".join(str(e.get("text", "")) for e in self.events if e.get("type") == "output")


def template_build_from_lines(text: str, url: str) -> TemplateBuild:
    events = _events(text, url, "template build")
    if not events or events[-1].get("type") != "done":
        raise ProtocolError(f"template build ended early: {[ev.get('type') for ev in events]}", url=url)
    r = events[-1].get("report")
    try:
        assert isinstance(r, dict)
        return TemplateBuild(
            tag=str(r["tag"]),
            base=str(r["from"]),
            base_snapshot=str(r["base_snapshot"]),
            ran=int(r["ran"]),
            cached=int(r["cached"]),
            finish_cached=bool(r["finish_cached"]),
            steps=[dict(s) for s in r["steps"]],
            command=None if r.get("command") is None else [str(w) for w in r["command"]],
            expose=[str(p) for p in r["expose"]],
            env=[str(e) for e in r["env"]],
            workdir=r.get("workdir"),
            user=r.get("user"),
            replaced=bool(r["replaced"]),
            seconds=float(r["seconds"]),
            report=r,
            events=events,
        )
    except (AssertionError, KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"template build report lacks a field: {e!r}", url=url) from e
