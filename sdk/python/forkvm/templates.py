"""Reading ``POST /v1/templates/oci``: an image archive made into a template.

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

__all__ = ["TemplateImport", "template_import_from_lines"]


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


def template_import_from_lines(text: str, url: str) -> TemplateImport:
    events: List[Dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except ValueError as e:
            raise ProtocolError(f"template import line is not JSON: {line[:200]!r} ({e})", url=url) from e
        if not isinstance(ev, dict):
            raise ProtocolError(f"template import line is not an object: {line[:200]!r}", url=url)
        if ev.get("type") == "error":
            message = ev.get("error")
            raise ForkvmError(message if isinstance(message, str) else f"template import failed: {ev!r}", url=url, body=ev)
        events.append(ev)
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
