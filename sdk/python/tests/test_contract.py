"""The SDK's response types against docs/openapi.json, the schema the daemon is tested
against (crates/forkvmd/tests/api_schema.rs checks it against the Rust wire types), so
no hand-kept copy of a shape can drift. Needs no daemon."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Dict

import pytest

import forkvm.types as types

OPENAPI = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"

#: SDK class -> schema component, where the names differ.
ALIASES = {
    "ExecResult": "ExecResponse",
    "EvalResult": "EvalResponse",
    "UnpackResult": "UnpackResponse",
}


def schemas() -> Dict[str, Any]:
    doc = json.loads(OPENAPI.read_text())
    comps: Dict[str, Any] = doc["components"]["schemas"]
    return comps


def sdk_fields(cls: type) -> Dict[str, dataclasses.Field]:  # type: ignore[type-arg]
    """Fields by their JSON name (a field named after a Python keyword, ``from_``, says
    its JSON name in its metadata)."""
    return {f.metadata.get("json", f.name): f for f in dataclasses.fields(cls) if f.name != "raw"}


@pytest.mark.parametrize("name", types.__all__)
def test_each_response_type_has_the_schema_fields(name: str) -> None:
    cls = getattr(types, name)
    schema = schemas().get(ALIASES.get(name, name))
    assert schema is not None, f"{name}: no component {ALIASES.get(name, name)!r} in {OPENAPI}"
    fields = sdk_fields(cls)
    props = set(schema.get("properties", {}))
    assert set(fields) == props, (
        f"{name}: the SDK has {sorted(set(fields) - props)} the schema lacks, "
        f"and lacks {sorted(props - set(fields))}"
    )
    # The SDK may tolerate a field the daemon always sends (forkd leaves some out), but
    # must never insist on one the daemon may leave out.
    required = set(schema.get("required", []))
    insists = {
        n
        for n, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert insists <= required, f"{name}: the SDK requires {sorted(insists - required)}, which the daemon may omit"



def test_error_bodies_keep_every_documented_code() -> None:
    from forkvm import errors

    for code in schemas()["ErrorBody"]["properties"]["code"]["enum"]:
        body = json.dumps({"error": "x", "code": code}).encode()
        assert errors.error_from_response(500, body).code == code
