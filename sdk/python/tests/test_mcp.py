"""`forkvm mcp` driven by the official MCP Python SDK (`mcp`), against a real daemon
with real sandboxes: over stdio (the agent host starts `forkvm mcp`) and over
streamable HTTP (with its bearer token).

One daemon for the module, on a private socket and store; the snapshot tag `py` from
the python template (the boot is cached). The lifecycle test makes every guest call
once; the others need no guest, or only the sandbox it leaves running.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Dict, Iterator, List, Tuple

import pytest

from daemon_proc import FORKVM_BIN, Daemon, serving

mcp = pytest.importorskip("mcp", reason="the MCP Python SDK (`pip install mcp`) is not installed")
import anyio  # noqa: E402  (a dependency of mcp)
import httpx2  # noqa: E402  (the HTTP client mcp's transport uses)
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from forkvm import BadRequest, Controller  # noqa: E402

if os.environ.get("FORKVM_SDK_REQUIRE_DAEMON") == "1" and not os.path.exists(FORKVM_BIN):
    raise RuntimeError(f"FORKVM_BIN={FORKVM_BIN} does not exist, and FORKVM_SDK_REQUIRE_DAEMON=1")

pytestmark = pytest.mark.skipif(not os.path.exists(FORKVM_BIN), reason=f"FORKVM_BIN={FORKVM_BIN} does not exist")

TOOLS = {
    "list_snapshots", "create_snapshot", "snapshot_info", "delete_snapshot", "list_sandboxes", "spawn",
    "exec", "eval", "read_file", "write_file", "list_files", "branch", "fork", "kill",
    "start_process", "process_output", "send_input", "stop_process", "list_processes", "lineage",
    "checkpoint", "list_checkpoints", "rewind",
}
# Seconds a guest call may take here (guest kernel code is emulated, ~1000x slower).
GUEST_CALL_S = 300


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with serving() as d:
        yield d


@pytest.fixture(scope="module")
def py(daemon: Daemon) -> str:
    with Controller(daemon.url, timeout=900) as c:
        snap = c.create_snapshot("py", "python")
    assert snap.bootable
    return snap.tag


def server_params(daemon: Daemon) -> StdioServerParameters:
    return StdioServerParameters(command=FORKVM_BIN, args=["mcp", "--daemon", daemon.url], env={"FORKVM_TOKEN": ""})


@asynccontextmanager
async def stdio_session(daemon: Daemon) -> AsyncIterator[ClientSession]:
    with tempfile.TemporaryFile(mode="w+") as errlog:
        async with stdio_client(server_params(daemon), errlog=errlog) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=GUEST_CALL_S) as session:
                await session.initialize()
                yield session


def text_of(result: Any) -> str:
    assert len(result.content) == 1, result
    return result.content[0].text


async def call(session: ClientSession, tool: str, args: Dict[str, Any]) -> Any:
    """The tool's JSON reply; fails the test on a tool error."""
    result = await session.call_tool(tool, args)
    assert not result.is_error, f"{tool}({args}) failed: {text_of(result)}"
    return json.loads(text_of(result))


async def call_error(session: ClientSession, tool: str, args: Dict[str, Any]) -> str:
    """The message of a tool call that must fail as a tool error (not a protocol error)."""
    result = await session.call_tool(tool, args)
    assert result.is_error, f"{tool}({args}) should have failed: {text_of(result)}"
    return text_of(result)


def test_initialize_lists_tools_with_schemas_and_resources_templates(daemon: Daemon) -> None:
    async def main() -> None:
        async with stdio_session(daemon) as s:
            assert s.server_info is not None and s.server_info.name == "forkvm"
            assert "fork" in (s.instructions or "")
            tools = (await s.list_tools()).tools
            assert {t.name for t in tools} == TOOLS
            for t in tools:
                assert t.description and len(t.description) > 30, t.name
                schema = t.input_schema
                assert schema["type"] == "object", t.name
                for name, prop in schema.get("properties", {}).items():
                    assert prop.get("description"), f"{t.name}.{name} has no description"
            exec_tool = next(t for t in tools if t.name == "exec")
            assert exec_tool.input_schema["required"] == ["sandbox_id"]
            templates = (await s.list_resource_templates()).resource_templates
            assert {t.uri_template for t in templates} == {
                "forkvm://sandboxes/{id}/console",
                "forkvm://sandboxes/{id}/tree/{+path}",
            }

    anyio.run(main)


def test_errors_are_tool_errors_with_the_daemons_words_and_the_server_goes_on(daemon: Daemon) -> None:
    async def main() -> None:
        async with stdio_session(daemon) as s:
            msg = await call_error(s, "exec", {"sandbox_id": "no-such-sandbox", "command": "true"})
            assert "no-such-sandbox" in msg and "not found" in msg, msg
            msg = await call_error(s, "spawn", {"snapshot_tag": "no-such-tag"})
            assert "no-such-tag" in msg, msg
            msg = await call_error(s, "spawn", {"snapshot_tag": "py", "n": 0})
            assert "n must be between 1 and 100" in msg, msg
            msg = await call_error(s, "write_file", {"sandbox_id": "x", "path": "/a", "content": "%%%", "encoding": "base64"})
            assert "base64" in msg, msg
            # Arguments the schema does not allow are refused before any daemon call.
            bad = await s.call_tool("kill", {"sandbox_id": "x", "force": True})
            assert bad.is_error and "force" in text_of(bad), bad
            # A resource of a sandbox that does not exist is a resource error, and the
            # session still answers afterwards.
            with pytest.raises(mcp.MCPError) as ei:
                await s.read_resource("forkvm://sandboxes/nope/console")
            assert "nope" in str(ei.value)
            with pytest.raises(mcp.MCPError) as ei:
                await s.read_resource("file:///etc/passwd")
            assert "not a forkvm" in str(ei.value)
            assert await call(s, "list_sandboxes", {}) == []

    anyio.run(main)


def test_an_agent_spawns_execs_evals_edits_files_branches_forks_and_kills(daemon: Daemon, py: str) -> None:
    async def main() -> None:
        async with stdio_session(daemon) as s:
            tags = [snap["tag"] for snap in await call(s, "list_snapshots", {})]
            assert py in tags
            [sb] = await call(s, "spawn", {"snapshot_tag": py})
            sid = sb["id"]
            try:
                await lifecycle(s, sid)
            finally:
                for other in await call(s, "list_sandboxes", {}):
                    await call(s, "kill", {"sandbox_id": other["id"]})
            assert await call(s, "list_sandboxes", {}) == []

    async def lifecycle(s: ClientSession, sid: str) -> None:
        r = await call(s, "exec", {"sandbox_id": sid, "command": "echo hi; echo oops >&2; exit 3"})
        assert (r["stdout"], r["stderr"], r["exit_code"], r["timed_out"]) == ("hi\n", "oops\n", 3, False)
        assert "hint" not in r

        # Long output: head and tail shown, all of it saved in the sandbox.
        r = await call(s, "exec", {"sandbox_id": sid, "command": "seq 1 20000", "max_output_bytes": 1000})
        assert r["stdout"].startswith("1\n2\n3\n") and r["stdout"].endswith("19999\n20000\n"), r["stdout"][-40:]
        assert "bytes left out" in r["stdout"] and r["stdout_bytes"] == 108894
        saved = re.search(r"(/tmp/forkvm-mcp/exec-[0-9-]+)/stdout", r["hint"])
        assert saved, r["hint"]
        page = await call(s, "read_file", {"sandbox_id": sid, "path": saved.group(0), "offset": 100000, "max_bytes": 10000})
        assert page["next_offset"] is None and page["bytes"] == 8894
        assert page["text"].endswith("19999\n20000\n")

        # Files: write, list, read a window.
        w = await call(s, "write_file", {"sandbox_id": sid, "path": "/tmp/mcp/notes.txt", "content": "alpha\nbeta\n"})
        assert w["bytes"] == 11
        entries = await call(s, "list_files", {"sandbox_id": sid, "path": "/tmp/mcp"})
        assert [(e["name"], e["type"], e["size"]) for e in entries] == [("notes.txt", "file", 11)]
        part = await call(s, "read_file", {"sandbox_id": sid, "path": "/tmp/mcp/notes.txt", "offset": 2, "max_bytes": 5})
        assert (part["text"], part["next_offset"]) == ("pha\nb", 7)

        # A background process: started, fed, read a window at a time until it ended.
        p = await call(s, "start_process", {"sandbox_id": sid, "command": "read x; echo got $x; seq 1 3; exit 4"})
        pid = p["pid"]
        assert (await call(s, "send_input", {"sandbox_id": sid, "pid": pid, "text": "hi\n", "close": True}))["bytes"] == 3
        deadline = time.monotonic() + GUEST_CALL_S
        while True:
            out = await call(s, "process_output", {"sandbox_id": sid, "pid": pid})
            if not out["running"] or time.monotonic() > deadline:
                break
            await anyio.sleep(0.5)
        assert (out["text"], out["exit_code"], out["next_offset"]) == ("got hi\n1\n2\n3\n", 4, 13), out
        head = await call(s, "process_output", {"sandbox_id": sid, "pid": pid, "offset": 4, "max_bytes": 3})
        assert (head["text"], head["next_offset"], head["more"]) == ("hi\n", 7, True), head
        sleeper = await call(s, "start_process", {"sandbox_id": sid, "command": "sleep 600", "tag": "nap"})
        assert any(q["pid"] == sleeper["pid"] and q["running"] for q in await call(s, "list_processes", {"sandbox_id": sid}))
        await call(s, "stop_process", {"sandbox_id": sid, "pid": sleeper["pid"], "signal": 9})
        while any(q["pid"] == sleeper["pid"] and q["running"] for q in await call(s, "list_processes", {"sandbox_id": sid})):
            assert time.monotonic() < deadline, "the stopped process runs on"
            await anyio.sleep(0.5)

        # Python state persists between evals in the warm interpreter.
        e = await call(s, "eval", {"sandbox_id": sid, "code": "x = np.arange(5)\nx.sum()"})
        assert e["error"] is None and e["result"] in ("10", "np.int64(10)"), e
        e = await call(s, "eval", {"sandbox_id": sid, "code": "int(x.sum()) + 1"})
        assert e["result"] == "11", e

        # Resources: the sandbox's console and file tree.
        uris = {str(r.uri) for r in (await s.list_resources()).resources}
        assert {f"forkvm://sandboxes/{sid}/console", f"forkvm://sandboxes/{sid}/tree/"} <= uris
        console = (await s.read_resource(f"forkvm://sandboxes/{sid}/console")).contents[0].text
        assert console.strip(), "empty console"
        # The route under it: a bounded tail, and bounds checked.
        with Controller(daemon.url, timeout=60) as c:
            tail = c.console(sid, bytes=16)
            assert 0 < len(tail.encode()) <= 16 * 3 and console.endswith(tail), (tail, console[-40:])
            with pytest.raises(BadRequest, match="bytes must be between 1 and 1048576"):
                c.console(sid, bytes=0)
        tree = (await s.read_resource(f"forkvm://sandboxes/{sid}/tree/tmp?depth=2")).contents[0].text.splitlines()
        assert "/tmp/mcp/" in tree and "/tmp/mcp/notes.txt 11" in tree, tree

        # Branch mid-task, fork twice; each copy has the file and goes on alone.
        snap = await call(s, "branch", {"sandbox_id": sid, "tag": "mcp-branch", "mode": "live"})
        assert (snap["tag"], snap["status"], snap["bootable"]) == ("mcp-branch", "ready", True)
        info = await call(s, "snapshot_info", {"tag": "mcp-branch"})
        assert info["tag"] == "mcp-branch"
        kids = await call(s, "fork", {"sandbox_id": sid, "n": 2})
        assert len(kids) == 2 and all(k["forked_from"] == sid for k in kids)
        graph = await call(s, "lineage", {})
        edges = {(e["from"], e["to"], e["kind"]) for e in graph["edges"]}
        assert {(f"sandbox:{sid}", f"sandbox:{k['id']}", "fork") for k in kids} <= edges, edges
        assert (f"sandbox:{sid}", "snapshot:mcp-branch", "branch") in edges, edges
        for i, kid in enumerate(kids):
            r = await call(s, "exec", {"sandbox_id": kid["id"], "command": f"cat /tmp/mcp/notes.txt; echo {i} > /tmp/mine"})
            assert r["stdout"] == "alpha\nbeta\n", r
        for kid in kids:
            await call(s, "kill", {"sandbox_id": kid["id"]})
        r = await call(s, "exec", {"sandbox_id": sid, "command": "cat /tmp/mine 2>/dev/null || echo none"})
        assert r["stdout"] == "none\n", "a fork's write reached its source"
        assert (await call(s, "delete_snapshot", {"tag": "mcp-branch"})) == {"deleted": "mcp-branch"}

        # A checkpoint before something risky; the rewind puts the file (and x) back.
        ck = await call(s, "checkpoint", {"sandbox_id": sid, "note": "before rm"})
        assert (ck["seq"], ck["note"]) == (1, "before rm"), ck
        await call(s, "exec", {"sandbox_id": sid, "command": "rm -rf /tmp/mcp"})
        listed = await call(s, "list_checkpoints", {"sandbox_id": sid})
        assert [c["tag"] for c in listed["checkpoints"]] == [ck["tag"]], listed
        back = await call(s, "rewind", {"sandbox_id": sid, "seq": 1})
        assert back["checkpoint"]["seq"] == 1, back
        r = await call(s, "exec", {"sandbox_id": sid, "command": "cat /tmp/mcp/notes.txt"})
        assert r["stdout"] == "alpha\nbeta\n", r
        assert (await call(s, "eval", {"sandbox_id": sid, "code": "int(x.sum())"}))["result"] == "10"

    anyio.run(main)


def start_http(daemon: Daemon, token_file: str) -> Tuple["subprocess.Popen[bytes]", str]:
    proc = subprocess.Popen(
        [FORKVM_BIN, "mcp", "--daemon", daemon.url, "--http", "127.0.0.1:0", "--token-file", token_file],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "FORKVM_TOKEN": ""},
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    lines: List[str] = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline().decode()
        if not line:
            break
        lines.append(line)
        m = re.search(r"serving MCP on (http://\S+)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    proc.wait()
    raise AssertionError(f"forkvm mcp --http did not start: {lines}")


def test_streamable_http_needs_the_token_and_serves_the_same_tools(daemon: Daemon, tmp_path: Any) -> None:
    token = "t-" + os.urandom(16).hex()
    token_file = tmp_path / "mcp.token"
    token_file.write_text(token + "\n")
    # Without a token there is no HTTP mode at all.
    no_token = subprocess.run(
        [FORKVM_BIN, "mcp", "--daemon", daemon.url, "--http", "127.0.0.1:0"],
        capture_output=True, env={**os.environ, "FORKVM_MCP_TOKEN": ""}, timeout=30,
    )
    assert no_token.returncode != 0 and b"token" in no_token.stderr, no_token

    proc, url = start_http(daemon, str(token_file))
    try:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
        accept = {"Accept": "application/json, text/event-stream"}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {token}x"}):
            r = httpx2.post(url, json=init, headers={**accept, **headers}, timeout=10)
            assert r.status_code == 401, (headers, r.status_code, r.text)
        # A browser page (any Origin) is refused even with the token.
        r = httpx2.post(url, json=init, headers={**accept, "Authorization": f"Bearer {token}", "Origin": "http://evil.test"}, timeout=10)
        assert r.status_code == 403, (r.status_code, r.text)

        async def main() -> None:
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
                async with streamable_http_client(url, http_client=http) as (read, write):
                    async with ClientSession(read, write) as s:
                        await s.initialize()
                        assert {t.name for t in (await s.list_tools()).tools} == TOOLS
                        assert await call(s, "list_sandboxes", {}) == []
                        msg = await call_error(s, "kill", {"sandbox_id": "gone"})
                        assert "gone" in msg

        anyio.run(main)
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
