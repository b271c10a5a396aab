"""forkd's own clients against `forkvm daemon --forkd-compat`, call by call.

Each test makes exactly the HTTP calls forkd's clients make (method, path, headers, the
body fields each sends, the response fields each reads), as listed from their source in
docs/forkd-compat.md: its Python `Controller` (urllib, a bearer token, Content-Type only
with a body), its TypeScript SDK (fetch, explicit `false`s), its MCP server (Content-Type
on every request, `memory_limit_mib: 256` always) and its CLI (`as_u64` on integer
fields, an empty JSON body on ping, workspaces). Nothing of forkd is vendored or fetched.

The daemon runs with `--forkd-compat` and no `--bind`: it must listen where forkd's
clients look, 127.0.0.1:8889, with the token from `$FORKD_TOKEN_FILE`. Real sandboxes
from the python template (about six restores in all).
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, Optional, Tuple

import pytest

from daemon_proc import FORKVM_BIN, Daemon, serving

TEMPLATE_TIMEOUT_S = 900
FORKD_URL = "http://127.0.0.1:8889"
TOKEN = "forkd-compat-test-token-0123456789"

if os.environ.get("FORKVM_SDK_REQUIRE_DAEMON") == "1" and not os.path.exists(FORKVM_BIN):
    raise RuntimeError(f"FORKVM_BIN={FORKVM_BIN} does not exist, and FORKVM_SDK_REQUIRE_DAEMON=1")

pytestmark = pytest.mark.skipif(
    not os.path.exists(FORKVM_BIN),
    reason=f"FORKVM_BIN={FORKVM_BIN} does not exist: build it with `cargo build -p forkvm` or set FORKVM_BIN",
)


def call(
    method: str,
    path: str,
    body: Any = None,
    *,
    token: Optional[str] = TOKEN,
    json_type_always: bool = False,
    raw_body: Optional[bytes] = None,
    timeout: float = 120,
) -> Tuple[int, Any]:
    """One request as forkd's clients send it: urllib over TCP, `Authorization: Bearer`
    when there is a token, `Content-Type: application/json` with a body (or always, as
    its MCP server and CLI do). Returns the status and the parsed JSON (None if empty)."""
    data = raw_body if raw_body is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(FORKD_URL + path, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None or json_type_always:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, text = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    if not text:
        return status, None
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text.decode("utf-8", "replace")


def as_u64(v: Any) -> int:
    """forkd's CLI reads integer fields with serde_json's `as_u64`: a float reads as 0."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", 8889))
        except OSError as e:
            pytest.fail(f"127.0.0.1:8889, forkd's address, is taken on this host ({e}); free it to run these tests")
    # The Unix socket's line comes first; the tests talk to the TCP listener, so wait for
    # its line too (a request sent between the two was refused).
    with serving(
        ["--forkd-compat"],
        wait_for=("forkvmd listening on unix:", "forkvmd listening on http://127.0.0.1:8889"),
        files={"token": TOKEN + "\n"},
        env_extra={"FORKD_TOKEN_FILE": "{root}/token"},
    ) as d:
        yield d


@pytest.fixture(scope="module")
def py(daemon: Daemon) -> str:
    """Tag `py` from the python template, made through forkvm's own create (forkd's
    kernel + rootfs create is refused: see test_snapshot_create_in_forkds_shape_is_refused)."""
    status, snap = call("POST", "/v1/snapshots", {"tag": "py", "template": "python"}, timeout=TEMPLATE_TIMEOUT_S)
    assert status == 201, snap
    return "py"


@pytest.fixture(scope="module")
def sandbox(py: str) -> str:
    """One sandbox spawned as forkd's Python Controller does it with every flag on."""
    status, sbs = call(
        "POST",
        "/v1/sandboxes",
        {"snapshot_tag": py, "n": 1, "per_child_netns": True, "prewarm": True, "live_fork": True, "hugepages": True},
    )
    assert status == 201, sbs
    return str(sbs[0]["id"])


def test_the_listener_is_forkds_and_takes_its_bearer_token(daemon: Daemon) -> None:
    assert call("GET", "/healthz", token=None) == (200, {"ok": True})
    status, body = call("GET", "/v1/snapshots", token=None)
    assert status == 401 and "error" in body, body
    status, body = call("GET", "/v1/snapshots", token="wrong-token-wrong-token")
    assert status == 401 and "error" in body, body
    # forkd's MCP server sends Content-Type: application/json on GETs too.
    status, snaps = call("GET", "/v1/snapshots", json_type_always=True)
    assert status == 200 and isinstance(snaps, list), snaps


def test_snapshot_create_in_forkds_shape_is_refused(daemon: Daemon) -> None:
    # forkd-mcp's create_snapshot: host paths for a kernel and a root filesystem. An API
    # body never names a host path here (docs/forkd-compat.md); the refusal says what to send.
    status, body = call(
        "POST",
        "/v1/snapshots",
        {"tag": "x", "kernel": "/boot/vmlinux", "rootfs": "/tmp/r.ext4", "rw": False, "boot_wait_secs": 10},
        json_type_always=True,
    )
    assert status == 400, body
    assert "kernel" in body["error"] and "template" in body["error"], body


def test_spawn_with_each_clients_flags(py: str) -> None:
    bodies = [
        # forkd's TypeScript SDK: explicit falses.
        {"snapshot_tag": py, "n": 1, "per_child_netns": False, "prewarm": False, "live_fork": False, "hugepages": False},
        # forkd-mcp: memory_limit_mib 256 and prewarm always.
        {"snapshot_tag": py, "n": 1, "per_child_netns": False, "memory_limit_mib": 256, "prewarm": False},
    ]
    for body in bodies:
        status, sbs = call("POST", "/v1/sandboxes", body, json_type_always=True)
        assert status == 201, (body, sbs)
        assert len(sbs) == 1
        sb = sbs[0]
        # What forkd's CLI `spawn` and `ls` read.
        assert isinstance(sb["id"], str) and isinstance(sb["guest_addr"], str), sb
        assert sb["netns"] is None or isinstance(sb["netns"], str)
        assert sb["pid"] is None or as_u64(sb["pid"]) > 0
        assert as_u64(sb.get("branch_count", 0)) == 0
        assert call("DELETE", f"/v1/sandboxes/{sb['id']}") == (204, None)
    status, body = call("POST", "/v1/sandboxes", {"snapshot_tag": py, "n": 0, "per_child_netns": False})
    assert status == 400 and "error" in body


def test_list_get_ping_exec_eval(sandbox: str) -> None:
    status, sbs = call("GET", "/v1/sandboxes")
    assert status == 200 and sandbox in [s["id"] for s in sbs]
    listed = next(s for s in sbs if s["id"] == sandbox)
    assert listed["snapshot_tag"] == "py" and isinstance(listed["guest_addr"], str)
    status, one = call("GET", f"/v1/sandboxes/{sandbox}")
    assert status == 200 and one["id"] == sandbox
    # Controller: no body. CLI snapshot-diff: an empty body with a JSON content type.
    for kw in ({}, {"raw_body": b"", "json_type_always": True}):
        status, pong = call("POST", f"/v1/sandboxes/{sandbox}/ping", **kw)  # type: ignore[arg-type]
        assert status == 200, pong
        assert pong["pong"] is True and pong["agent_lang"] == "python" and pong["warmup_ready"] is True, pong
    status, r = call("POST", f"/v1/sandboxes/{sandbox}/exec", {"args": ["sh", "-c", "echo out; echo err >&2; exit 3"], "timeout_secs": 30})
    assert status == 200 and (r["stdout"], r["stderr"], r["exit_code"]) == ("out\n", "err\n", 3), r
    status, r = call("POST", f"/v1/sandboxes/{sandbox}/exec", {"args": ["no-such-program"], "timeout_secs": 30})
    assert status == 200 and r["exit_code"] == 127, r
    # forkd-mcp's wait_for_text poll (it gives 5 s; a first exec of `tail` in an emulated
    # guest can take longer here, so 30).
    status, r = call(
        "POST", f"/v1/sandboxes/{sandbox}/exec", {"args": ["sh", "-c", "tail -c 4096 /etc/hostname 2>/dev/null || true"], "timeout_secs": 30}
    )
    assert status == 200 and (r["stdout"], r["exit_code"]) == ("forkvm\n", 0), r
    # forkd's parent predefines numpy as `np`; eval is an expression; result is a repr.
    status, r = call("POST", f"/v1/sandboxes/{sandbox}/eval", {"code": "int(np.arange(4).sum())"})
    assert status == 200 and (r["result"], r["error"], r["exit_code"]) == ("6", None, 0), r
    status, r = call("POST", f"/v1/sandboxes/{sandbox}/eval", {"code": "1/0"})
    assert status == 200 and r["result"] is None and "ZeroDivisionError" in r["error"] and r["exit_code"] == 1, r


def test_branch_modes_as_forkds_clients_ask(sandbox: str) -> None:
    # Controller.branch_sandbox() with defaults: `{}`; the CLI reads tag, dir, branched_from.
    status, full = call("POST", f"/v1/sandboxes/{sandbox}/branch", {})
    assert status == 201, full
    assert isinstance(full["tag"], str) and isinstance(full["dir"], str) and full["branched_from"] == sandbox
    assert isinstance(full["pause_ms"], int) and as_u64(full["pause_ms"]) >= 1, full
    assert full["pause_us"] > 0 and full["pause_ms"] * 1000 >= full["pause_us"], full
    # forkd bench: the legacy `diff: true`; it reads pause_ms and diff_physical_bytes with as_u64.
    status, diff = call("POST", f"/v1/sandboxes/{sandbox}/branch", {"diff": True})
    assert status == 201 and diff["mode"] == "diff" and isinstance(diff["pause_ms"], int), diff
    # measure_diff: a full branch that also reports the diff it could have been.
    status, m = call("POST", f"/v1/sandboxes/{sandbox}/branch", {"tag": "measured", "measure_diff": True})
    assert status == 201 and m["mode"] == "full", m
    logical = m["memory_logical_bytes"]
    assert m["diff_logical_bytes"] == logical, m
    assert 0 < as_u64(m["diff_physical_bytes"]) < logical and m["diff_physical_bytes"] % 4096 == 0, m
    assert isinstance(m["diff_ms"], int), m
    status, body = call("POST", f"/v1/sandboxes/{sandbox}/branch", {"measure_diff": True, "mode": "live"})
    assert status == 400 and "measure_diff" in body["error"], body
    # CLI `snapshot --live --no-wait`: 202 writing, ready later.
    status, live = call("POST", f"/v1/sandboxes/{sandbox}/branch", {"tag": "live-nw", "mode": "live", "wait": False})
    assert status in (201, 202), live
    deadline = time.monotonic() + 120
    while True:
        snaps = {s["tag"]: s for s in call("GET", "/v1/snapshots")[1]}
        if snaps["live-nw"]["status"] == "ready":
            break
        assert time.monotonic() < deadline, snaps["live-nw"]
        time.sleep(0.5)
    # CLI `snapshot-diff`: mode diff with parent_tag.
    status, d2 = call("POST", f"/v1/sandboxes/{sandbox}/branch", {"tag": "d2", "mode": "diff", "parent_tag": "py"})
    assert status == 201 and d2["tag"] == "d2", d2
    # CLI `snapshot-info`: typed fields.
    status, info = call("GET", "/v1/snapshots/d2/info")
    assert status == 200, info
    assert info["parent_tag"] == "py" and as_u64(info["chain_depth"]) == 1 and info["ancestors"][-1] == "py", info
    for k in ("memory_logical_bytes", "memory_physical_bytes", "vmstate_bytes"):
        assert as_u64(info[k]) > 0, (k, info)
    assert call("GET", "/v1/snapshots/nope/info")[0] == 404
    # CLI `snapshot-compact`: 200 with tag, dir, branched_from.
    status, flat = call("POST", "/v1/snapshots/d2/compact", {"to": "d2-flat"})
    assert status == 200 and flat["tag"] == "d2-flat" and isinstance(flat["dir"], str), flat
    # CLI `rmi --cascade`; the Controller's plain delete; 404 for one that is gone.
    assert call("DELETE", "/v1/snapshots/d2?cascade=true") == (204, None)
    for tag in ("d2-flat", "measured", "live-nw", full["tag"]):
        assert call("DELETE", f"/v1/snapshots/{tag}") == (204, None), tag
    assert call("DELETE", "/v1/snapshots/measured")[0] == 404


def test_workspaces_as_forkds_cli_drives_them(py: str) -> None:
    status, ws = call("POST", "/v1/workspaces", {"name": "dev", "snapshot_tag": py, "per_child_netns": False}, json_type_always=True)
    assert status == 201, ws
    assert (ws["name"], ws["status"], ws["source_snapshot_tag"]) == ("dev", "running", py), ws
    sid = ws["live_sandbox_id"]
    assert ws["id"] == "ws-" + sid[:16] and ws["sandbox_id"] == sid
    assert call("POST", "/v1/workspaces", {"name": "dev", "snapshot_tag": py, "per_child_netns": False})[0] == 409
    status, r = call("POST", f"/v1/sandboxes/{sid}/exec", {"args": ["sh", "-c", "echo kept > /tmp/state; sleep 1000 >/dev/null 2>&1 & echo $!"], "timeout_secs": 30})
    assert status == 200 and r["exit_code"] == 0, r
    sleeper = r["stdout"].strip()
    # CLI `workspace suspend`: a JSON body always.
    status, ws = call("POST", "/v1/workspaces/dev/suspend", {"diff": False}, json_type_always=True)
    assert status == 200 and ws["status"] == "suspended" and "live_sandbox_id" not in ws, ws
    status, body = call("POST", "/v1/workspaces/dev/suspend", {"diff": True})
    assert status == 400 and "suspended" in body["error"], body
    status, all_ws = call("GET", "/v1/workspaces", json_type_always=True)
    assert status == 200 and [(w["name"], w["status"]) for w in all_ws] == [("dev", "suspended")], all_ws
    # CLI `workspace resume`: `{}`.
    status, ws = call("POST", "/v1/workspaces/dev/resume", {}, json_type_always=True)
    assert status == 200 and ws["status"] == "running" and ws["live_sandbox_id"] == sid, ws
    status, r = call("POST", f"/v1/sandboxes/{sid}/exec", {"args": ["sh", "-c", f"cat /tmp/state; kill -0 {sleeper} && echo alive"], "timeout_secs": 30})
    assert status == 200 and r["stdout"] == "kept\nalive\n", r
    assert call("POST", "/v1/workspaces/dev/resume", {})[0] == 400
    # Its sandbox deleted behind its back: stale; resume starts afresh from the source.
    assert call("DELETE", f"/v1/sandboxes/{sid}") == (204, None)
    status, ws = call("GET", "/v1/workspaces/dev")
    assert status == 200 and ws["status"] == "stale", ws
    status, ws = call("POST", "/v1/workspaces/dev/resume", {})
    assert status == 200 and ws["status"] == "running" and ws["live_sandbox_id"] != sid, ws
    # CLI `workspace delete`: its sandbox goes too; the source tag stays.
    new_sid = ws["live_sandbox_id"]
    assert call("DELETE", "/v1/workspaces/dev", json_type_always=True) == (204, None)
    assert call("GET", "/v1/workspaces/dev")[0] == 404
    assert call("GET", f"/v1/sandboxes/{new_sid}")[0] == 404
    assert "py" in [s["tag"] for s in call("GET", "/v1/snapshots")[1]]
    status, body = call("POST", "/v1/workspaces", {"name": "../x", "snapshot_tag": py})
    assert status == 400 and "workspace name" in body["error"], body


def test_kill_is_204_then_404(sandbox: str) -> None:
    assert call("DELETE", f"/v1/sandboxes/{sandbox}") == (204, None)
    status, body = call("DELETE", f"/v1/sandboxes/{sandbox}")
    assert status == 404 and "error" in body
