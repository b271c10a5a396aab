"""Unit tests: no daemon, no KVM. HTTP behaviour is checked against a real tiny HTTP
server started in-process (http.server in a thread, on 127.0.0.1 or a Unix socket)."""

from __future__ import annotations

import json
import os
import socketserver
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import httpx
import pytest

import forkvm
from forkvm import (
    BadRequest,
    Busy,
    Conflict,
    ConnectionFailed,
    Controller,
    DiskFull,
    EvalError,
    ForkvmError,
    NotFound,
    ProtocolError,
    Sandbox,
    ServerError,
    Unauthorized,
)
from forkvm.streaming import NdjsonDecoder
from forkvm.transport import UDS_BASE_URL, default_socket_path, quote_segment, resolve_endpoint
from forkvm.types import ExecResult, FileEntry, SandboxInfo, SnapshotInfo, SnapshotInfoDetail, UnpackResult


# --- a tiny real HTTP server ------------------------------------------------

Reply = Tuple[int, Dict[str, str], bytes]
Route = Callable[["Handler"], Optional[Reply]]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "FakeServerMixin"  # type: ignore[assignment]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _serve(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(n) if n else b""
        self.server.requests.append((self.command, self.path, dict(self.headers), self.body))
        route_path = self.path.split("?", 1)[0]
        fn = self.server.routes.get((self.command, route_path))
        reply = fn(self) if fn else (404, {}, json.dumps({"error": f"no fake route {route_path}", "code": "not_found"}).encode())
        if reply is None:  # the route wrote its own response
            return
        status, headers, body = reply
        self.send_response(status)
        headers = {"Content-Type": "application/json", **headers}
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    # helpers for streaming routes
    def start_chunked(self, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class FakeServerMixin:
    routes: Dict[Tuple[str, str], Route]
    requests: List[Tuple[str, str, Dict[str, str], bytes]]

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        # A client that stops reading early (an error line ends a stream) resets the
        # connection under the handler; that is expected, anything else is shown.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[misc]


class TcpServer(FakeServerMixin, ThreadingHTTPServer):
    daemon_threads = True


class UnixServer(FakeServerMixin, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _json_reply(status: int, obj: Any) -> Route:
    return lambda h: (status, {}, json.dumps(obj).encode())


def _start(server: FakeServerMixin) -> Iterator[FakeServerMixin]:
    server.routes = {}
    server.requests = []
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)  # type: ignore[attr-defined]
    t.start()
    yield server
    server.shutdown()  # type: ignore[attr-defined]
    server.server_close()  # type: ignore[attr-defined]


@pytest.fixture
def server() -> Iterator[FakeServerMixin]:
    yield from _start(TcpServer(("127.0.0.1", 0), Handler))


def _url(server: Any) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


@pytest.fixture
def client(server: TcpServer) -> Iterator[Controller]:
    with Controller(_url(server), token="", timeout=20) as c:
        yield c


SANDBOX = {
    "id": "abc",
    "snapshot_tag": "py",
    "netns": None,
    "guest_addr": "unix:/run/x/v.sock",
    "created_at_unix": 1,
    "pid": 42,
    "memory_limit_mib": None,
    "has_branched": False,
    "last_branch_memory_path": None,
    "branch_count": 0,
    "state": "running",
    "template": "python",
    "forked_from": None,
    "last_active_unix": 2,
}


# --- endpoint resolution ----------------------------------------------------


def test_endpoint_explicit_wins_over_env() -> None:
    env = {"FORKVM_DAEMON": "http://other:1"}
    assert resolve_endpoint("unix:/s/d.sock", env) == forkvm.Endpoint(UDS_BASE_URL, "/s/d.sock")
    assert resolve_endpoint("http://h:8080/", env).base_url == "http://h:8080"


def test_endpoint_from_env_forms() -> None:
    assert resolve_endpoint(None, {"FORKVM_DAEMON": "unix:/a/b.sock"}).uds == "/a/b.sock"
    assert resolve_endpoint(None, {"FORKVM_DAEMON": "unix:///a/b.sock"}).uds == "/a/b.sock"
    e = resolve_endpoint(None, {"FORKVM_DAEMON": "https://h:9443"})
    assert (e.base_url, e.uds) == ("https://h:9443", None)
    assert str(resolve_endpoint(None, {"FORKVM_DAEMON": "unix:/x.sock"})) == "unix:/x.sock"
    with pytest.raises(ValueError, match="FORKVM_DAEMON"):
        resolve_endpoint(None, {"FORKVM_DAEMON": "ftp://h"})
    with pytest.raises(ValueError):
        resolve_endpoint(None, {"FORKVM_DAEMON": "unix:"})


def test_default_socket_order() -> None:
    both = {"FORKVM_RUN": "/r", "XDG_RUNTIME_DIR": "/x"}
    assert default_socket_path(both, uid=1000) == "/r/forkvmd.sock"
    assert default_socket_path({"XDG_RUNTIME_DIR": "/x", "FORKVM_RUN": ""}, uid=1000) == "/x/forkvm/forkvmd.sock"
    assert default_socket_path({}, uid=0) == "/run/forkvm/forkvmd.sock"
    assert default_socket_path({}, uid=1000) == "/tmp/forkvm-1000/forkvmd.sock"
    assert default_socket_path({"TMPDIR": "/t"}, uid=7) == "/t/forkvm-7/forkvmd.sock"
    e = resolve_endpoint(None, {"FORKVM_RUN": "/r"})
    assert (e.base_url, e.uds) == (UDS_BASE_URL, "/r/forkvmd.sock")


def test_controller_reads_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKVM_DAEMON", "unix:/nowhere/forkvmd.sock")
    with Controller() as c:
        assert str(c.endpoint) == "unix:/nowhere/forkvmd.sock"


# --- URL quoting --------------------------------------------------------------


def test_quote_segment() -> None:
    assert quote_segment("sb-1_a") == "sb-1_a"
    assert quote_segment("a/b") == "a%2Fb"
    assert quote_segment("..") == "%2E%2E"
    assert quote_segment(".") == "%2E"
    assert quote_segment("../x") == "..%2Fx"
    assert quote_segment("a?b#c d") == "a%3Fb%23c%20d"
    with pytest.raises(ValueError):
        quote_segment("")


@pytest.mark.parametrize(
    "sid, raw",
    [
        ("a/b", "/v1/sandboxes/a%2Fb"),
        ("..", "/v1/sandboxes/%2E%2E"),
        ("../../healthz", "/v1/sandboxes/..%2F..%2Fhealthz"),
        ("x?y", "/v1/sandboxes/x%3Fy"),
    ],
)
def test_ids_stay_one_segment_on_the_wire(server: TcpServer, client: Controller, sid: str, raw: str) -> None:
    with pytest.raises(NotFound):
        client.get_sandbox(sid)
    method, path, _, _ = server.requests[-1]
    assert (method, path) == ("GET", raw)


def test_tag_and_query_quoting(server: TcpServer, client: Controller) -> None:
    server.routes[("DELETE", "/v1/snapshots/a%2F..")] = lambda h: (204, {}, b"")
    client.delete_snapshot("a/..", cascade=True)
    assert server.requests[-1][1] == "/v1/snapshots/a%2F..?cascade=true"
    server.routes[("GET", "/v1/sandboxes/s/files")] = lambda h: (200, {"Content-Type": "application/octet-stream"}, b"\x00\xff")
    assert client.read_file("s", "/tmp/a b&c=d") == b"\x00\xff"
    assert server.requests[-1][1] == "/v1/sandboxes/s/files?path=%2Ftmp%2Fa+b%26c%3Dd"


# --- error mapping ------------------------------------------------------------


@pytest.mark.parametrize(
    "status, cls",
    [(400, BadRequest), (401, Unauthorized), (404, NotFound), (409, Conflict), (503, Busy), (507, DiskFull), (500, ServerError), (502, ServerError), (403, forkvm.Forbidden), (504, ServerError), (418, ForkvmError)],
)
def test_status_maps_to_class(server: TcpServer, client: Controller, status: int, cls: type) -> None:
    body = {"error": f"boom {status}", "code": "some_code", "state": "writing"}
    server.routes[("GET", "/v1/sandboxes/x")] = _json_reply(status, body)
    with pytest.raises(ForkvmError) as ei:
        client.get_sandbox("x")
    e = ei.value
    assert type(e) is cls
    assert (e.status, e.code, e.message, e.state) == (status, "some_code", f"boom {status}", "writing")
    assert e.url is not None and e.url.endswith("/v1/sandboxes/x")
    assert f"boom {status}" in str(e)


def test_non_json_error_body_is_kept(server: TcpServer, client: Controller) -> None:
    server.routes[("GET", "/version")] = lambda h: (502, {"Content-Type": "text/html"}, b"<h1>Bad Gateway</h1>")
    with pytest.raises(ServerError) as ei:
        client.version()
    assert ei.value.message == "<h1>Bad Gateway</h1>" and ei.value.code is None


def test_bad_success_body_is_protocol_error(server: TcpServer, client: Controller) -> None:
    server.routes[("GET", "/v1/sandboxes/x")] = _json_reply(200, {"id": "x"})
    with pytest.raises(ProtocolError, match="guest_addr"):
        client.get_sandbox("x")
    server.routes[("GET", "/version")] = lambda h: (200, {}, b"not json")
    with pytest.raises(ProtocolError):
        client.version()


def test_connection_failed_names_endpoint(tmp_path: Any) -> None:
    sock = str(tmp_path / "none.sock")
    with Controller(f"unix:{sock}") as c:
        with pytest.raises(ConnectionFailed) as ei:
            c.health()
    assert sock in str(ei.value) and ei.value.status is None


def test_token_sent_as_bearer(server: TcpServer) -> None:
    server.routes[("GET", "/healthz")] = _json_reply(200, {"ok": True})
    with Controller(_url(server), token="s3cret") as c:
        assert c.health() is True
    headers = {k.lower(): v for k, v in server.requests[-1][2].items()}
    assert headers["authorization"] == "Bearer s3cret"


def test_token_from_env(server: TcpServer, monkeypatch: pytest.MonkeyPatch) -> None:
    server.routes[("GET", "/healthz")] = _json_reply(200, {"ok": True})
    monkeypatch.setenv("FORKVM_TOKEN", "envtok")
    with Controller(_url(server)) as c:
        c.health()
    headers = {k.lower(): v for k, v in server.requests[-1][2].items()}
    assert headers["authorization"] == "Bearer envtok"


def test_unix_socket_transport() -> None:
    d = tempfile.mkdtemp(prefix="fkpy-")
    path = os.path.join(d, "forkvmd.sock")
    gen = _start(UnixServer(path, Handler))
    srv = next(gen)
    try:
        srv.routes[("GET", "/version")] = _json_reply(200, {"version": "0.1.0", "api": "v1", "new_field": 1})
        with Controller(f"unix:{path}") as c:
            v = c.version()
        assert (v.version, v.api, v["new_field"]) == ("0.1.0", "v1", 1)
        assert srv.requests[-1][2].get("Host") == "forkvmd"
    finally:
        next(gen, None)
        os.unlink(path)
        os.rmdir(d)


# --- request bodies -------------------------------------------------------------


def test_exec_body_shapes(server: TcpServer, client: Controller) -> None:
    out = {"stdout": "hi\n", "stderr": "", "exit_code": 0, "signal": None, "timed_out": False, "duration_ms": 3}
    server.routes[("POST", "/v1/sandboxes/s/exec")] = _json_reply(200, out)
    r = client.exec_command("s", ["echo", "hi"], 5)
    assert json.loads(server.requests[-1][3]) == {"args": ["echo", "hi"], "timeout_secs": 5}
    assert r == ExecResult("hi\n", "", 0, None, False, 3)
    client.exec_command("s", cmd="echo $A", timeout_secs=1.5, env={"A": "1"}, cwd="/tmp", stdin="in")
    assert json.loads(server.requests[-1][3]) == {"cmd": "echo $A", "timeout_secs": 2, "env": {"A": "1"}, "cwd": "/tmp", "stdin": "in"}
    with pytest.raises(ValueError):
        client.exec_command("s", ["a"], cmd="b")
    with pytest.raises(ValueError):
        client.exec_command("s")
    cut = {**out, "stdout": "ab", "truncated": True, "stdout_bytes": 10, "stderr_bytes": 0}
    server.routes[("POST", "/v1/sandboxes/s/exec")] = _json_reply(200, cut)
    r = client.exec_command("s", ["yes"], 5, max_output_bytes=2)
    assert json.loads(server.requests[-1][3]) == {"args": ["yes"], "timeout_secs": 5, "max_output_bytes": 2}
    assert (r.stdout, r.truncated, r.stdout_bytes) == ("ab", True, 10)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_output_bytes"):
            client.exec_command("s", ["yes"], max_output_bytes=bad)  # type: ignore[arg-type]


def test_sandbox_api_over_fake_server(server: TcpServer, client: Controller) -> None:
    server.routes[("POST", "/v1/sandboxes")] = _json_reply(201, [SANDBOX])
    server.routes[("PUT", "/v1/sandboxes/abc/files")] = _json_reply(201, {"path": "/a/b", "bytes": 2})
    server.routes[("POST", "/v1/sandboxes/abc/eval")] = lambda h: (
        200,
        {},
        json.dumps(
            {"result": None, "error": "Traceback (most recent call last):\nZeroDivisionError: division by zero\n", "exit_code": 1}
            if b"1/0" in h.body
            else {"result": "2", "error": None, "exit_code": 0, "stdout": "", "stderr": ""}
        ).encode(),
    )
    killed: List[int] = []

    def kill_route(h: Handler) -> Reply:
        killed.append(1)
        return (204, {}, b"") if len(killed) == 1 else (404, {}, b'{"error":"gone","code":"not_found"}')

    server.routes[("DELETE", "/v1/sandboxes/abc")] = kill_route
    with Sandbox.create("py", controller=client, memory_limit_mib=64) as sb:
        assert json.loads(server.requests[-1][3]) == {"snapshot_tag": "py", "n": 1, "memory_limit_mib": 64}
        assert sb.id == "abc" and sb.info.state == "running"
        assert sb.files.write("/a/b", "hi", mode=0o644).bytes == 2
        hi = "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4"
        assert server.requests[-1][1] == f"/v1/sandboxes/abc/files?path=%2Fa%2Fb&sha256={hi}&mode=420&create_parents=true"
        assert server.requests[-1][3] == b"hi"
        assert sb.eval("1+1") == "2"
        with pytest.raises(EvalError) as ei:
            sb.eval("1/0")
        assert "ZeroDivisionError" in str(ei.value) and "Traceback" in ei.value.traceback
        sb.kill()
        sb.kill()  # idempotent: no second request
    assert killed == [1]
    Sandbox(SandboxInfo.from_json(SANDBOX), client).kill()  # a 404 on kill is fine
    assert killed == [1, 1]


# --- types --------------------------------------------------------------------


def test_limits_go_in_the_body_only_when_given(server: TcpServer, client: Controller) -> None:
    info = dict(SANDBOX, cpu_limit_millis=500, pids_limit=4352)
    server.routes[("POST", "/v1/sandboxes")] = lambda h: (201, {}, json.dumps([info]).encode())
    server.routes[("POST", "/v1/sandboxes/abc/fork")] = lambda h: (201, {}, json.dumps([info]).encode())
    [made] = client.spawn_sandboxes("py", cpu_limit_millis=500)
    assert json.loads(server.requests[-1][3]) == {"snapshot_tag": "py", "n": 1, "cpu_limit_millis": 500}
    assert (made.cpu_limit_millis, made.pids_limit) == (500, 4352)
    client.fork_sandbox("abc", n=2, pids_limit=64)
    assert json.loads(server.requests[-1][3]) == {"n": 2, "pids_limit": 64}
    client.fork_sandbox("abc")
    assert json.loads(server.requests[-1][3]) == {"n": 1}
    with pytest.raises(TypeError):
        client.spawn_sandboxes("py", cpu_limit_millis=True)
    with pytest.raises(TypeError):
        client.fork_sandbox("abc", pids_limit="64")  # type: ignore[arg-type]
    # An older daemon's answer, without the fields, reads as no limits known.
    assert SandboxInfo.from_json(SANDBOX).cpu_limit_millis is None
    snap = {"tag": "t", "dir": "/s/t", "created_at_unix": 1, "status": "ready", "bootable": True}
    server.routes[("POST", "/v1/snapshots")] = lambda h: (
        201,
        {},
        json.dumps(dict(snap, default_limits={"cpu_limit_millis": 700})).encode(),
    )
    made_tag = client.create_snapshot("t", "tiny", cpu_limit_millis=700)
    assert json.loads(server.requests[-1][3]) == {"tag": "t", "template": "tiny", "default_limits": {"cpu_limit_millis": 700}}
    assert made_tag.default_limits == {"cpu_limit_millis": 700}
    client.create_snapshot("t", "tiny")
    assert json.loads(server.requests[-1][3]) == {"tag": "t", "template": "tiny"}
    assert SnapshotInfo.from_json(snap).default_limits is None


def test_io_limits_are_checked_here_and_sent_as_given(server: TcpServer, client: Controller) -> None:
    caps = {"disk_bytes_per_sec": 1 << 20, "rng_bytes_per_sec": 4096}
    info = dict(SANDBOX, io_limits=caps)
    server.routes[("POST", "/v1/sandboxes")] = lambda h: (201, {}, json.dumps([info]).encode())
    server.routes[("POST", "/v1/sandboxes/abc/fork")] = lambda h: (201, {}, json.dumps([info]).encode())
    [made] = client.spawn_sandboxes("py", io_limits=caps)
    assert json.loads(server.requests[-1][3]) == {"snapshot_tag": "py", "n": 1, "io_limits": caps}
    assert made.io_limits == caps
    client.fork_sandbox("abc", io_limits={"disk_ops_per_sec": 50})
    assert json.loads(server.requests[-1][3]) == {"n": 1, "io_limits": {"disk_ops_per_sec": 50}}
    sent = len(server.requests)
    with pytest.raises(ValueError, match="disk_iops"):
        client.spawn_sandboxes("py", io_limits={"disk_iops": 5})
    with pytest.raises(TypeError):
        client.spawn_sandboxes("py", io_limits={"disk_ops_per_sec": "50"})  # type: ignore[dict-item]
    assert len(server.requests) == sent, "a bad cap was sent"
    assert SandboxInfo.from_json(SANDBOX).io_limits is None


def test_types_tolerate_extra_and_require_required() -> None:
    snap = {"tag": "t", "dir": "/d", "created_at_unix": 5, "status": "ready", "bootable": True, "future": [1]}
    s = SnapshotInfo.from_json(snap)
    assert (s.tag, s.branched_from, s.memory_logical_bytes, s["future"]) == ("t", None, 0, [1])
    for missing in ("tag", "status", "bootable"):
        with pytest.raises(ProtocolError, match=missing):
            SnapshotInfo.from_json({k: v for k, v in snap.items() if k != missing})
    with pytest.raises(ProtocolError, match="created_at_unix"):
        SnapshotInfo.from_json({**snap, "created_at_unix": True})
    with pytest.raises(ProtocolError):
        SnapshotInfo.from_json([snap])
    assert SandboxInfo.from_json({**SANDBOX, "extra": {}}).pid == 42
    f = FileEntry.from_json({"name": "a", "type": "dir", "size": 0, "mode": 0o40755, "mtime_unix_ns": -1})
    assert f.is_dir and not f.is_file
    e = ExecResult.from_json({"stdout": "", "stderr": "", "exit_code": 124, "timed_out": True})
    assert e.timed_out and not e.ok and e.duration_ms == 0


# --- NDJSON streaming ---------------------------------------------------------------


def _events_bytes() -> bytes:
    lines = [
        {"type": "stdout", "data": "héllo\n"},
        {"type": "stderr", "data": "warn\n"},
        {"type": "future_kind", "x": 1},
        {"type": "stdout", "data": "wörld ✓\n"},
        {"type": "exit", "exit_code": 3, "signal": None, "timed_out": False, "duration_ms": 7},
    ]
    return b"".join(json.dumps(l, ensure_ascii=False).encode() + b"\n" for l in lines)


def test_ndjson_decoder_every_split_point() -> None:
    data = _events_bytes()
    want = NdjsonDecoder().feed(data)
    assert len(want) == 5
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1, 7):
            dec = NdjsonDecoder()
            got = dec.feed(data[:i]) + dec.feed(data[i:j]) + dec.feed(data[j:]) + dec.close()
            assert got == want, (i, j)
    dec = NdjsonDecoder()
    assert [dec.feed(bytes([b])) for b in data].count([]) == len(data) - 5


def test_ndjson_last_line_without_newline_and_bad_line() -> None:
    dec = NdjsonDecoder()
    assert dec.feed(b'{"type":"exit","exit_code":0}') == []
    assert dec.close() == [{"type": "exit", "exit_code": 0}]
    with pytest.raises(ProtocolError):
        NdjsonDecoder().feed(b"{oops\n")


def test_stream_is_consumed_as_it_arrives(server: TcpServer, client: Controller) -> None:
    """The server holds back the rest of the body until the client has reported the
    first chunk through on_stdout, so a client that buffered the body would never see
    a result; chunks split lines and a UTF-8 character."""
    seen_first = threading.Event()
    data = _events_bytes()
    first_line_end = data.index(b"\n") + 1

    def route(h: Handler) -> None:
        h.start_chunked()
        h.chunk(data[: first_line_end + 5])  # first line and part of the second
        if not seen_first.wait(10):
            h.chunk(b'{"type":"error","error":"client did not stream"}\n')
            h.end_chunked()
            return
        rest = data[first_line_end + 5 :]
        w = "ö".encode()
        k = rest.index(w) + 1  # split in the middle of a two-byte character
        h.chunk(rest[:k])
        h.chunk(rest[k:])
        h.end_chunked()

    server.routes[("POST", "/v1/sandboxes/s/exec/stream")] = route
    out: List[str] = []
    err: List[str] = []

    def on_out(s: str) -> None:
        out.append(s)
        seen_first.set()

    r = client.exec_stream("s", cmd="x", on_stdout=on_out, on_stderr=err.append)
    assert out == ["héllo\n", "wörld ✓\n"] and err == ["warn\n"]
    assert (r.stdout, r.stderr, r.exit_code, r.duration_ms) == ("héllo\nwörld ✓\n", "warn\n", 3, 7)


def test_stream_error_line_and_http_error(server: TcpServer, client: Controller) -> None:
    def route(h: Handler) -> None:
        h.start_chunked()
        h.chunk(b'{"type":"stdout","data":"a"}\n{"type":"error","error":"agent went away"}\n')
        h.end_chunked()

    server.routes[("POST", "/v1/sandboxes/s/exec/stream")] = route
    with pytest.raises(ForkvmError, match="agent went away"):
        client.exec_stream("s", ["true"])
    server.routes[("POST", "/v1/sandboxes/s/exec/stream")] = _json_reply(404, {"error": "no sandbox s", "code": "not_found"})
    with pytest.raises(NotFound, match="no sandbox s"):
        client.exec_stream("s", ["true"])

    def truncated(h: Handler) -> None:
        h.start_chunked()
        h.chunk(b'{"type":"stdout","data":"a"}\n')
        h.end_chunked()

    server.routes[("POST", "/v1/sandboxes/s/exec/stream")] = truncated
    with pytest.raises(ProtocolError, match="without an exit"):
        client.exec_stream("s", ["true"])


def test_version_is_single_source() -> None:
    assert forkvm.__version__ == "0.1.0"
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(here, "pyproject.toml")) as f:
        text = f.read()
    assert 'version = { attr = "forkvm.__version__" }' in text
    assert "\nversion =" not in text.split("[tool.setuptools.dynamic]")[0]



# --- every route of routes.rs has a Controller method that calls it ------------------

ROUTES_RS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "crates", "forkvm-api", "src", "routes.rs")

SNAP = {"tag": "TAG", "dir": "/d", "created_at_unix": 1, "status": "ready", "bootable": True}
EXEC = {"stdout": "", "stderr": "", "exit_code": 0}
PONG = {"agent_version": "0", "protocol_version": 1, "uptime_ms": 1, "sandbox_id": "ID", "generation": 1, "eval_available": True}
DETAIL = {
    "tag": "TAG", "dir": "/d", "created_at_unix": 1, "memory_logical_bytes": 1, "memory_physical_bytes": 1,
    "vmstate_bytes": 1, "parent_tag": None, "parent_content_hash": None, "chain_depth": 0,
    "ancestors": [], "dependents": [], "status": "ready",
}
SB = {**SANDBOX, "id": "ID"}
UNPACKED = {
    "head": "TAG", "imported": ["base", "TAG"], "reused": [], "chunks_new": 3, "chunks_present": 0,
    "logical_bytes": 10, "pack_bytes": 4, "ms": 1.5,
}


_SCRATCH = tempfile.TemporaryDirectory(prefix="fkpy-unit-")  # removed at exit


def _scratch(name: str) -> str:
    return os.path.join(_SCRATCH.name, name)


def _pack_file(data: bytes) -> str:
    """A pack file holding ``data``."""
    path = _scratch("in.tar.zst")
    with open(path, "wb") as f:
        f.write(data)
    return path
WS = {"id": "ws-ID", "name": "NAME", "source_snapshot_tag": "TAG", "status": "running",
      "live_sandbox_id": "ID", "created_at_unix": 1, "last_active_unix": 2, "sandbox_id": "ID"}
VOL = {"name": "data", "size_bytes": 1, "created_at_unix_ms": 2, "layers": 0, "stored_bytes": 3,
       "writer": None, "readers": [], "snapshot_of": None}
ENTRY = {"name": "a", "type": "file", "size": 1, "mode": 420, "mtime_unix_ns": 0}
WATCH = b'{"type":"armed","directories":1}\n{"type":"keepalive"}\n{"type":"end","reason":"gone"}\n'
IMPORTED = (
    b'{"type":"imported","manifest":"sha256:ab","layers":2,"new_bytes":3,"shared_bytes":4,"command":["sh"],"exposed_ports":[]}\n'
    b'{"type":"built","image_bytes":5,"seconds":0.5}\n{"type":"done","template":"app"}\n'
)
BUILT = (
    b'{"type":"planned","from":"tiny","steps":1,"unused_build_args":[]}\n'
    b'{"type":"output","step":1,"text":"hello\\n"}\n'
    b'{"type":"done","report":{"tag":"app","from":"tiny","base_snapshot":"build-base-1","base_cached":true,'
    b'"steps":[{"step":1,"line":2,"instruction":"RUN echo hello","snapshot":"build-2","cached":false,"seconds":1.5}],'
    b'"ran":1,"cached":0,"finish_cached":false,"env":["A=1"],"workdir":"/app","command":["python3"],'
    b'"expose":["8080"],"labels":[],"replaced":false,"seconds":2.5}}\n'
)
STREAM = b'{"type":"exit","exit_code":0,"signal":null,"timed_out":false,"duration_ms":1}\n'

# route name in routes.rs -> (canned JSON reply, call through the Controller)
PROC = {
    "pid": 7,
    "argv": ["sleep", "9"],
    "tag": None,
    "pty": None,
    "started_at_unix_ms": 1,
    "output_end": 2,
    "output_start": 0,
    "stdin_open": True,
    "running": True,
    "exit": None,
}
PROC_ENDED = {**PROC, "running": False, "stdin_open": False, "exit": {"exit_code": 3, "signal": None, "timed_out": False, "duration_ms": 5}}
PROC_OUTPUT = (
    b'{"type":"from","offset":0,"skipped":0}\n'
    b'{"type":"output","stream":"stdout","offset":0,"data":"aGk="}\n'
    b'{"type":"keepalive"}\n'
    b'{"type":"output","stream":"stderr","offset":2,"data":"IQ=="}\n'
    + b'{"type":"end","process":' + json.dumps(PROC_ENDED).encode() + b"}\n"
)

PUSHED = {
    "tag": "py", "remote": "file:///r", "links": ["py"], "entries": 3, "blocks": 10, "blocks_uploaded": 4,
    "blocks_present": 6, "blocks_repeated": 0, "bytes_uploaded": 100, "logical_bytes": 1000, "ms": 1.5,
}
PULLED = {
    "tag": "py", "remote": "file:///r", "imported": ["py"], "reused": [], "blocks": 10, "blocks_local": 0,
    "blocks_cached": 1, "blocks_fetched": 9, "bytes_fetched": 90, "chunks_new": 5, "chunks_left_remote": 0, "ms": 2.0,
}
COLLECTED = {
    "remote": "file:///r", "dry_run": True, "tags": 1, "blocks": 12, "blocks_referenced": 10, "blocks_young": 0,
    "blocks_deleted": 2, "bytes_deleted": 20, "ms": 0.5,
}
LOCK = {
    "name": "shared-0123456789abcdef", "kind": "shared", "host": "h", "pid": 7, "purpose": "push py",
    "age_s": 3, "stale": False,
}


CALLS: Dict[str, Tuple[Any, Callable[[Controller], Any]]] = {
    "Health": ({"ok": True}, lambda c: c.health()),
    "Version": ({"version": "0.1.0", "api": "v1"}, lambda c: c.version()),
    "Metrics": ("# text", lambda c: c.metrics()),
    "ListSnapshots": ([SNAP], lambda c: c.list_snapshots()),
    "CreateSnapshot": (SNAP, lambda c: c.create_snapshot("TAG", "python")),
    "DeleteSnapshot": (None, lambda c: c.delete_snapshot("TAG")),
    "SnapshotInfo": (DETAIL, lambda c: c.snapshot_info("TAG")),
    "CompactSnapshot": (SNAP, lambda c: c.compact_snapshot("TAG", "flat")),
    "PackSnapshot": (b"pack", lambda c: c.pack_snapshot("TAG", _scratch("p.tar.zst"))),
    "UnpackSnapshot": (UNPACKED, lambda c: c.unpack_snapshot(_pack_file(b"pack"))),
    "ListSandboxes": ([SB], lambda c: c.list_sandboxes()),
    "CreateSandboxes": ([SB], lambda c: c.spawn_sandboxes("TAG")),
    "GetSandbox": (SB, lambda c: c.get_sandbox("ID")),
    "DeleteSandbox": (None, lambda c: c.kill_sandbox("ID")),
    "ReadConsole": ("[    0.000000] Linux", lambda c: c.console("ID", bytes=100)),
    "Ping": (PONG, lambda c: c.ping_sandbox("ID")),
    "Exec": (EXEC, lambda c: c.exec_command("ID", ["true"])),
    "ExecStream": (STREAM, lambda c: c.exec_stream("ID", ["true"])),
    "Eval": ({"result": "1", "error": None, "exit_code": 0}, lambda c: c.eval_code("ID", "1")),
    "Branch": (SNAP, lambda c: c.branch_sandbox("ID")),
    "Fork": ([SB], lambda c: c.fork_sandbox("ID")),
    "ReadFile": (b"x", lambda c: c.read_file("ID", "/a")),
    "WriteFile": ({"path": "/a", "bytes": 1, "sha256": "ab" * 32}, lambda c: c.write_file("ID", "/a", b"x")),
    "RemoveFile": (None, lambda c: c.remove_file("ID", "/a")),
    "ListFiles": ([ENTRY], lambda c: c.list_files("ID", "/")),
    "WatchFiles": (WATCH, lambda c: list(c.watch_files("ID", "/"))),
    "FileChecksum": ({"path": "/a", "size": 2, "sha256": "ab" * 32}, lambda c: c.file_checksum("ID", "/a")),
    "ReadTar": (b"tar bytes", lambda c: c.download_tar("ID", "/d", os.path.join(tempfile.mkdtemp(), "d.tar"))),
    "WriteTar": ({"path": "/d", "bytes": 3, "sha256": "ab" * 32}, lambda c: c.upload_tar("ID", "/d", b"tar")),
    "TakeDiskSnapshot": (None, lambda c: c.disk_snapshot("ID")),
    "ListDiskSnapshots": (None, lambda c: c.list_disk_snapshots("ID")),
    "ListWorkspaces": ([WS], lambda c: c.list_workspaces()),
    "CreateWorkspace": (WS, lambda c: c.create_workspace("NAME", "TAG")),
    "GetWorkspace": (WS, lambda c: c.get_workspace("NAME")),
    "DeleteWorkspace": (None, lambda c: c.delete_workspace("NAME")),
    "SuspendWorkspace": (WS, lambda c: c.suspend_workspace("NAME")),
    "ResumeWorkspace": (WS, lambda c: c.resume_workspace("NAME")),
    "ListVolumes": ([VOL], lambda c: c.list_volumes()),
    "CreateVolume": (VOL, lambda c: c.create_volume("data", size_mib=64)),
    "GetVolume": (VOL, lambda c: c.get_volume("NAME")),
    "DeleteVolume": (None, lambda c: c.delete_volume("NAME")),
    "SnapshotVolume": (VOL, lambda c: c.snapshot_volume("NAME", "data2")),
    "ImportOciTemplate": (IMPORTED, lambda c: c.import_oci_template(_pack_file(b"image"), "app")),
    "BuildTemplate": (BUILT, lambda c: c.build_template(b"context", "app")),
    "PruneBuilds": (
        {"removed": ["build-ab"], "kept": 2, "freed_bytes": 4096, "dry_run": True},
        lambda c: c.prune_builds(dry_run=True, older_than_seconds=60),
    ),
    "ListProcesses": ([PROC], lambda c: c.list_processes("ID")),
    "StartProcess": (PROC, lambda c: c.start_process("ID", ["sleep", "9"])),
    "ProcessOutput": (PROC_OUTPUT, lambda c: c.process_output("ID", 7).read_all()),
    "ProcessInput": ({"bytes": 2}, lambda c: c.process_input("ID", 7, b"hi")),
    "SignalProcess": (None, lambda c: c.signal_process("ID", 7, 15)),
    "ResizeProcess": (None, lambda c: c.resize_process("ID", 7, 24, 80)),
    "SandboxUsage": (
        {"at_unix_ms": 1, "memory_bytes": 2, "memory_limit_bytes": None, "cpu_usage_usec": 3, "vcpus": 1},
        lambda c: c.sandbox_usage("ID"),
    ),
    "Lineage": (
        {
            "nodes": [
                {"id": "snapshot:py", "kind": "snapshot", "name": "py", "state": "ready", "memory_bytes": 1,
                 "stored_bytes": 1, "created_at_unix": 1, "mode": None, "chain_depth": 0},
                {"id": "sandbox:a", "kind": "sandbox", "name": "a", "state": "running", "memory_bytes": 0,
                 "stored_bytes": None, "created_at_unix": 2, "mode": None, "chain_depth": 0},
            ],
            "edges": [{"from": "snapshot:py", "to": "sandbox:a", "kind": "spawn"}],
        },
        lambda c: c.lineage(),
    ),
    "RemoteInfo": ({"url": "file:///r", "tags": ["py"]}, lambda c: c.remote_info()),
    "PushTag": (PUSHED, lambda c: c.push_tag("py")),
    "PullTag": (PULLED, lambda c: c.pull_tag("py")),
    "RemoveRemoteTag": (None, lambda c: c.remove_remote_tag("TAG")),
    "CollectRemote": (COLLECTED, lambda c: c.collect_remote(min_age_s=0, dry_run=True)),
    "ListRemoteLocks": ([LOCK], lambda c: c.remote_locks()),
    "BreakRemoteLock": (LOCK, lambda c: c.break_remote_lock("NAME")),
}


def _fixed(status: int, ctype: str, body: bytes) -> Route:
    return lambda h: (status, {"Content-Type": ctype}, body)


def _routes_rs() -> List[Tuple[str, str, str]]:
    import re

    with open(ROUTES_RS) as f:
        text = f.read()
    return re.findall(r'r\("([A-Z]+)", "([^"]+)", RouteName::(\w+)\)', text)


@pytest.mark.skipif(not os.path.exists(ROUTES_RS), reason="crates/forkvm-api/src/routes.rs not found (SDK outside the repo)")
def test_every_route_is_covered(server: TcpServer, client: Controller) -> None:
    routes = _routes_rs()
    assert len(routes) >= 24
    assert {name for _, _, name in routes} == set(CALLS), "routes.rs and the SDK's route table differ"
    for method, template, name in routes:
        reply, call = CALLS[name]
        path = (
            template.replace("{id}", "ID")
            .replace("{tag}", "TAG")
            .replace("{name}", "NAME")
            .replace("{port}", "8000")
            .replace("{pid}", "7")
        )
        if isinstance(reply, bytes):
            body, ctype = reply, "application/octet-stream"
        elif isinstance(reply, str):
            body, ctype = reply.encode(), "text/plain"
        else:
            body, ctype = json.dumps(reply).encode(), "application/json"
        status = 204 if reply is None else 200
        server.routes[(method, path)] = _fixed(status, ctype, body if status != 204 else b"")
        call(client)
        got_method, raw, _, _ = server.requests[-1]
        assert (got_method, raw.split("?", 1)[0]) == (method, path), name


def test_the_remote_calls_send_tags_and_read_typed_reports(server: TcpServer, client: Controller) -> None:
    server.routes[("POST", "/v1/remote/push")] = _fixed(200, "application/json", json.dumps(PUSHED).encode())
    r = client.push_tag("py")
    assert (r.tag, r.blocks_uploaded, r.blocks_present, r.ms, r.links) == ("py", 4, 6, 1.5, ["py"])
    assert json.loads(server.requests[-1][3]) == {"tag": "py"}
    server.routes[("POST", "/v1/remote/gc")] = _fixed(200, "application/json", json.dumps(COLLECTED).encode())
    g = client.collect_remote(min_age_s=0, dry_run=True)
    assert (g.dry_run, g.blocks_deleted, g.bytes_deleted) == (True, 2, 20)
    assert json.loads(server.requests[-1][3]) == {"min_age_s": 0, "dry_run": True}
    client.collect_remote()
    assert json.loads(server.requests[-1][3]) == {"dry_run": False}
    server.routes[("GET", "/v1/remote/locks")] = _fixed(200, "application/json", json.dumps([LOCK, {**LOCK, "host": None, "pid": None, "purpose": None}]).encode())
    locks = client.remote_locks()
    assert [(l.kind, l.pid, l.purpose, l.stale) for l in locks] == [("shared", 7, "push py", False), ("shared", None, None, False)]
    server.routes[("DELETE", "/v1/remote/locks/a%2Fb")] = _fixed(200, "application/json", json.dumps(LOCK).encode())
    client.break_remote_lock("a/b")
    assert server.requests[-1][1] == "/v1/remote/locks/a%2Fb", "a name stays one path segment"


# --- file watching ------------------------------------------------------------------


def test_a_template_import_sends_its_options_and_reads_its_lines(server: TcpServer, client: Controller) -> None:
    from forkvm import ForkvmError, ProtocolError

    route = ("POST", "/v1/templates/oci")
    server.routes[route] = _fixed(200, "application/x-ndjson", IMPORTED)
    t = client.import_oci_template(_pack_file(b"image"), "app", start="srv --port 80", force=True, vcpus=2)
    assert (t.template, t.manifest, t.layers, t.new_bytes, t.shared_bytes) == ("app", "sha256:ab", 2, 3, 4)
    assert (t.command, t.image_bytes, t.build_seconds, t.snapshot_seconds) == (["sh"], 5, 0.5, None)
    method, raw, headers, body = server.requests[-1]
    assert raw == "/v1/templates/oci?name=app&start=srv+--port+80&vcpus=2&force=true"
    assert body == b"image"
    error = IMPORTED.split(b"\n")[0] + b'\n{"type":"error","error":"mkfs failed"}\n'
    server.routes[route] = _fixed(200, "application/x-ndjson", error)
    with pytest.raises(ForkvmError, match="mkfs failed"):
        client.import_oci_template(_pack_file(b"image"), "app")
    server.routes[route] = _fixed(200, "application/x-ndjson", IMPORTED.split(b"\n")[0] + b"\n")
    with pytest.raises(ProtocolError, match="ended early"):
        client.import_oci_template(_pack_file(b"image"), "app")


def test_a_template_build_sends_its_context_and_options_and_reads_its_report(
    server: TcpServer, client: Controller, tmp_path: Any
) -> None:
    import io
    import tarfile

    from forkvm import ForkvmError, ProtocolError

    route = ("POST", "/v1/templates/build")
    server.routes[route] = _fixed(200, "application/x-ndjson", BUILT)
    ctx = tmp_path / "ctx"
    (ctx / "app").mkdir(parents=True)
    (ctx / "app" / "main.py").write_text("print(1)\n")
    (ctx / "Dockerfile").write_text("FROM tiny\n")
    os.symlink("/etc/passwd", ctx / "app" / "link")
    b = client.build_template(ctx, "app", build_args={"V": "2"}, no_cache=True, dockerfile="Dockerfile")
    assert (b.tag, b.base, b.ran, b.cached, b.finish_cached, b.command, b.expose) == (
        "app", "tiny", 1, 0, False, ["python3"], ["8080"])
    assert (b.workdir, b.env, b.steps[0]["seconds"], b.output) == ("/app", ["A=1"], 1.5, "hello\n")
    method, raw, headers, body = server.requests[-1]
    assert raw == "/v1/templates/build?tag=app&dockerfile=Dockerfile&build_args=%7B%22V%22%3A+%222%22%7D&no_cache=true"
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert {"./Dockerfile", "./app/main.py", "./app/link"} <= set(members), members
    assert members["./app/link"].issym() and members["./app/link"].linkname == "/etc/passwd"
    server.routes[route] = _fixed(200, "application/x-ndjson", BUILT.split(b"\n")[0] + b'\n{"type":"error","error":"step 1 failed"}\n')
    with pytest.raises(ForkvmError, match="step 1 failed"):
        client.build_template(b"context", "app")
    server.routes[route] = _fixed(200, "application/x-ndjson", BUILT.split(b"\n")[0] + b"\n")
    with pytest.raises(ProtocolError, match="ended early"):
        client.build_template(b"context", "app")


def test_a_watch_yields_changes_and_ends_or_raises_as_its_lines_say(server: TcpServer, client: Controller) -> None:
    from forkvm import FileChange, ForkvmError, ProtocolError

    route = ("GET", "/v1/sandboxes/ID/files/watch")
    lines = [
        {"type": "armed", "directories": 3},
        {"type": "change", "kind": "create", "path": "a/b"},
        {"type": "keepalive"},
        {"type": "overflow"},
        {"type": "something-newer"},
        {"type": "change", "kind": "remove", "path": "a/b"},
        {"type": "end", "reason": "gone"},
    ]
    server.routes[route] = _fixed(200, "application/x-ndjson", b"".join(json.dumps(x).encode() + b"\n" for x in lines))
    w = client.watch_files("ID", "/w", recursive=True)
    assert w.directories == 3
    assert server.requests[-1][1] == "/v1/sandboxes/ID/files/watch?path=%2Fw&recursive=true"
    assert list(w) == [FileChange("create", "a/b"), FileChange("overflow", ""), FileChange("remove", "a/b")]

    server.routes[route] = _fixed(200, "application/x-ndjson", b'{"type":"armed","directories":1}\n{"type":"error","error":"agent: gone"}\n')
    with client.watch_files("ID", "/w") as w, pytest.raises(ForkvmError, match="agent: gone"):
        list(w)
    server.routes[route] = _fixed(200, "application/x-ndjson", b'{"type":"change","kind":"create","path":"x"}\n')
    with pytest.raises(ProtocolError, match="armed"):
        client.watch_files("ID", "/w")
    server.routes[route] = _fixed(200, "application/x-ndjson", b'{"type":"armed","directories":1}\n')
    with pytest.raises(ProtocolError, match="without an `end`"):
        list(client.watch_files("ID", "/w"))
    server.routes[route] = _json_reply(404, {"error": "sandbox ID: watch /w: No such file", "code": "not_found"})
    with pytest.raises(NotFound):
        client.watch_files("ID", "/w")


# --- snapshot chains ------------------------------------------------------------------


def test_chain_request_shapes(server: TcpServer, client: Controller, tmp_path: Any) -> None:
    server.routes[("POST", "/v1/snapshots/head/compact")] = _json_reply(200, {**SNAP, "tag": "flat", "branched_from": "compact:head"})
    flat = client.compact_snapshot("head", "flat")
    assert (flat.tag, flat.branched_from) == ("flat", "compact:head")
    method, path, headers, body = server.requests[-1]
    assert (method, path, json.loads(body)) == ("POST", "/v1/snapshots/head/compact", {"to": "flat"})

    server.routes[("DELETE", "/v1/snapshots/base")] = lambda h: (204, {}, b"")
    client.delete_snapshot("base", force=True)
    assert server.requests[-1][1] == "/v1/snapshots/base?force=true"
    client.delete_snapshot("base", cascade=True)
    assert server.requests[-1][1] == "/v1/snapshots/base?cascade=true"

    server.routes[("POST", "/v1/sandboxes/sb/branch")] = _json_reply(201, {**SNAP, "tag": "d1", "mode": "diff", "pause_ms": 30.5})
    snap = client.branch_sandbox("sb", "d1", mode="diff", parent_tag="py")
    assert (snap.mode, snap.pause_ms) == ("diff", 30.5)
    assert json.loads(server.requests[-1][3]) == {"tag": "d1", "mode": "diff", "parent_tag": "py", "wait": True}
    Sandbox(SandboxInfo.from_json({**SANDBOX, "id": "sb"}), client).branch(mode="diff")
    assert json.loads(server.requests[-1][3]) == {"mode": "diff", "wait": True}


def test_pack_streams_to_a_file_and_unpack_streams_from_one(server: TcpServer, client: Controller, tmp_path: Any) -> None:
    pack = bytes(range(256)) * 3000  # several chunks on the wire

    def pack_route(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/zstd")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for i in range(0, len(pack), 100_000):
            h.chunk(pack[i : i + 100_000])
        h.end_chunked()

    server.routes[("GET", "/v1/snapshots/head/pack")] = pack_route
    out = tmp_path / "head.tar.zst"
    assert client.pack_snapshot("head", out) == len(pack)
    assert out.read_bytes() == pack
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head.tar.zst"]

    # An error leaves nothing behind, not even the partial file.
    server.routes[("GET", "/v1/snapshots/gone/pack")] = _json_reply(404, {"error": "snapshot \"gone\" not found", "code": "not_found"})
    with pytest.raises(NotFound, match="gone"):
        client.pack_snapshot("gone", tmp_path / "gone.tar.zst")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head.tar.zst"]

    server.routes[("POST", "/v1/snapshots/unpack")] = lambda h: (201, {}, json.dumps({**UNPACKED, "pack_bytes": len(h.body)}).encode())
    r = client.unpack_snapshot(str(out))
    assert isinstance(r, UnpackResult)
    assert (r.head, r.imported, r.pack_bytes, r.ms) == ("TAG", ["base", "TAG"], len(pack), 1.5)
    method, path, headers, body = server.requests[-1]
    lower = {k.lower(): v for k, v in headers.items()}
    assert (method, path, lower["content-type"], lower["content-length"]) == ("POST", "/v1/snapshots/unpack", "application/zstd", str(len(pack)))
    assert body == pack

    server.routes[("POST", "/v1/snapshots/unpack")] = _json_reply(400, {"error": "pack is corrupt: bad frame", "code": "bad_request"})
    with pytest.raises(BadRequest, match="corrupt"):
        client.unpack_snapshot(out)
    with pytest.raises(FileNotFoundError):
        client.unpack_snapshot(tmp_path / "none.tar.zst")


def test_snapshot_detail_new_fields_and_older_daemons() -> None:
    d = SnapshotInfoDetail.from_json(
        {**DETAIL, "descendants": ["b", "a"], "bootable": False, "problem": "parent gone", "memory_format": "chunked",
         "content_hash": "ab", "chain_physical_bytes": 9, "chunks": 2}
    )
    assert (d.descendants, d.bootable, d.problem, d.memory_format, d.chunks) == (["b", "a"], False, "parent gone", "chunked", 2)
    old = SnapshotInfoDetail.from_json(DETAIL)
    assert (old.descendants, old.bootable, old.problem, old.chain_physical_bytes) == ([], True, None, 0)
    with pytest.raises(ProtocolError, match="descendants"):
        SnapshotInfoDetail.from_json({**DETAIL, "descendants": [1]})


# --- disk snapshots -------------------------------------------------------------------

DISK_REPORT = {
    "sandbox_id": "sb", "seq": 7, "unchanged": False, "new_layers": 1, "seal_ms": 0.4, "write_ms": 12,
    "written_chunks": 3, "written_bytes": 12288, "stored_bytes": 40960, "retired": 1,
}
DISK_SNAPSHOT = {
    "seq": 7, "created_unix_ms": 1700000000000, "stored_bytes": 40960,
    "disks": [{"id": "forkvm-data", "base_key": "blake3:ab", "size": 1 << 30, "layer_id": "00ff", "blocks": 10, "extents": 2}],
}
CALLS["TakeDiskSnapshot"] = (DISK_REPORT, CALLS["TakeDiskSnapshot"][1])
CALLS["ListDiskSnapshots"] = ([DISK_SNAPSHOT], CALLS["ListDiskSnapshots"][1])


def test_disk_snapshots_over_fake_server(server: TcpServer, client: Controller) -> None:
    server.routes[("POST", "/v1/sandboxes/sb/disk-snapshots")] = _json_reply(201, DISK_REPORT)
    server.routes[("GET", "/v1/sandboxes/sb/disk-snapshots")] = _json_reply(200, [DISK_SNAPSHOT])
    sb = Sandbox(SandboxInfo.from_json({**SANDBOX, "id": "sb"}), client)
    r = sb.disk_snapshot()
    assert (r.seq, r.unchanged, r.written_bytes, r.retired, r.write_ms) == (7, False, 12288, 1, 12.0)
    assert r["stored_bytes"] == 40960
    method, path, _, body = server.requests[-1]
    assert (method, path, json.loads(body)) == ("POST", "/v1/sandboxes/sb/disk-snapshots", {})
    sb.disk_snapshot(keep_last=5, keep_daily=0)
    assert json.loads(server.requests[-1][3]) == {"keep_last": 5, "keep_daily": 0}
    [snap] = sb.disk_snapshots()
    assert (snap.seq, snap.created_unix_ms, snap.stored_bytes) == (7, 1700000000000, 40960)
    assert (snap.disks[0].id, snap.disks[0].blocks, snap.disks[0].size) == ("forkvm-data", 10, 1 << 30)
    assert server.requests[-1][:2] == ("GET", "/v1/sandboxes/sb/disk-snapshots")
    # Errors keep their class: no layered disk is a 400, unknown sandbox a 404.
    server.routes[("POST", "/v1/sandboxes/raw/disk-snapshots")] = _json_reply(
        400, {"error": "sandbox raw has no layered disk to snapshot", "code": "bad_request"}
    )
    with pytest.raises(forkvm.BadRequest, match="no layered disk"):
        client.disk_snapshot("raw")
    with pytest.raises(forkvm.NotFound):
        client.list_disk_snapshots("nope")


def test_disk_snapshot_types() -> None:
    with pytest.raises(ProtocolError, match="missing field 'seq'"):
        forkvm.DiskSnapshotReport.from_json({k: v for k, v in DISK_REPORT.items() if k != "seq"})
    with pytest.raises(ProtocolError, match="DiskSnapshotDisk"):
        forkvm.DiskSnapshotInfo.from_json({**DISK_SNAPSHOT, "disks": [{"id": "x"}]})
    # The sandbox view's last attempt: absent (older daemon), null, a success, a failure.
    assert SandboxInfo.from_json(SANDBOX).last_disk_snapshot is None
    assert SandboxInfo.from_json({**SANDBOX, "last_disk_snapshot": None}).last_disk_snapshot is None
    ok = SandboxInfo.from_json({**SANDBOX, "last_disk_snapshot": {"seq": 3, "at_unix_ms": 5, "error": None}})
    assert ok.last_disk_snapshot == forkvm.LastDiskSnapshot(at_unix_ms=5, seq=3, error=None)
    bad = SandboxInfo.from_json({**SANDBOX, "last_disk_snapshot": {"seq": None, "at_unix_ms": 5, "error": "boom"}})
    assert bad.last_disk_snapshot is not None and bad.last_disk_snapshot.error == "boom"
    with pytest.raises(ProtocolError):
        SandboxInfo.from_json({**SANDBOX, "last_disk_snapshot": 3})


# --- lifecycle ------------------------------------------------------------------

ARCHIVE_REPORT = {
    "sandbox_id": "sb",
    "dir": "/s/archives/sb",
    "disk_snapshot_seq": 3,
    "write_ms": 80.5,
    "total_ms": 120.0,
    "reason": "api",
}
CALLS["ArchiveSandbox"] = (ARCHIVE_REPORT, lambda c: c.archive_sandbox("ID"))
CALLS["RestoreSandbox"] = (SANDBOX, lambda c: c.restore("ID"))
CALLS["DiskFork"] = (SANDBOX, lambda c: c.disk_fork("ID"))
CALLS["SetTtl"] = (SANDBOX, lambda c: c.set_ttl("ID", 5))
CALLS["SetNetwork"] = (SANDBOX, lambda c: c.set_network("ID", {"allow_internet": False}))

CHECKPOINT = {
    "sandbox_id": "ID",
    "seq": 3,
    "tag": "ckpt-ID-3",
    "created_at_unix_ms": 7,
    "trigger": "exec",
    "note": "eval: x = 1",
    "pause_ms": 3.5,
    "pages": 12,
    "bytes_stored": 8192,
    "disk_bytes_stored": 4096,
    "total_ms": 210.0,
}
CHECKPOINTS = {
    "sandbox_id": "ID",
    "policy": {
        "every_seconds": 5,
        "after_exec": True,
        "keep": 8,
        "max_stored_mib": 64,
        "max_age_seconds": 600,
        "thin_after_seconds": 300,
        "thin_every_seconds": 60,
    },
    "base_tag": "py",
    "checkpoints": [CHECKPOINT],
}


def _policy_round_trip(c: Controller) -> None:
    from forkvm import CheckpointPolicy

    policy = CheckpointPolicy(
        every_seconds=5,
        after_exec=True,
        keep=8,
        max_stored_mib=64,
        max_age_seconds=600,
        thin_after_seconds=300,
        thin_every_seconds=60,
    )
    got = c.set_checkpoint_policy("ID", policy)
    assert got.policy == policy
    assert got.checkpoints[0].disk_bytes_stored == 4096
    assert got.checkpoints[0].note == "eval: x = 1" and got.base_tag == "py"


def _rewind_reads_its_report(c: Controller) -> None:
    r = c.rewind("ID", ago_seconds=1.5)
    assert (r.checkpoint.seq, r.checkpoint.tag, r.total_ms) == (3, "ckpt-ID-3", 180.0)


CALLS["ListCheckpoints"] = (CHECKPOINTS, lambda c: c.list_checkpoints("ID"))
CALLS["CreateCheckpoint"] = (CHECKPOINT, lambda c: c.create_checkpoint("ID", note="before rm -rf"))
CALLS["SetCheckpointPolicy"] = (CHECKPOINTS, _policy_round_trip)
CALLS["RewindSandbox"] = ({"sandbox_id": "ID", "checkpoint": CHECKPOINT, "stop_ms": 4.0, "total_ms": 180.0}, _rewind_reads_its_report)


EXPOSED = {"port": 8000, "path": "/v1/sandboxes/sb/ports/8000/", "token": "fvp_" + "ab" * 32, "created_at_unix_ms": 5}


def _connect_tcp_needs_a_101(c: Controller) -> None:
    # The fake daemon answers 204, not 101: no stream is handed out.
    with pytest.raises(ProtocolError, match="expected 101"):
        c.connect_tcp("ID", 8000)


CALLS["ListPorts"] = ([EXPOSED], lambda c: c.list_ports("ID"))
CALLS["ExposePort"] = (EXPOSED, lambda c: c.expose_port("ID", 8000))
CALLS["UnexposePort"] = (None, lambda c: c.unexpose_port("ID", 8000))
CALLS["ConnectTcp"] = (None, _connect_tcp_needs_a_101)


def _attach_needs_a_websocket(c: Controller) -> None:
    # The fake daemon answers 204, not 101: no socket is handed out.
    with pytest.raises(ProtocolError, match="expected 101"):
        c.attach_process("ID", 7, offset=3)


CALLS["AttachProcess"] = (None, _attach_needs_a_websocket)


def test_exposed_ports_carry_their_own_token_and_never_the_daemons(server: TcpServer) -> None:
    server.routes[("POST", "/v1/sandboxes/sb/ports")] = _json_reply(200, EXPOSED)
    server.routes[("GET", "/v1/sandboxes/sb/ports/8000/app/x")] = lambda h: (418, {"Content-Type": "application/json"}, b'{"error": "guest", "code": "teapot"}')
    marked = {"Content-Type": "application/json", "X-Forkvm-Error": "true"}
    server.routes[("GET", "/v1/sandboxes/sb/ports/8000/down")] = lambda h: (502, marked, b'{"error": "nothing listens on port 8000", "code": "bad_gateway"}')
    with Controller(_url(server), token="daemon-secret-token", timeout=20) as c:
        sb = Sandbox(SandboxInfo.from_json({**SANDBOX, "id": "sb"}), c)
        assert sb.expose(8000) == forkvm.ExposedPort.from_json(EXPOSED)
        assert json.loads(server.requests[-1][3]) == {"port": 8000}
        assert server.requests[-1][2].get("Authorization") == "Bearer daemon-secret-token"
        sb.expose(8000, dpop_jkt="k" * 43)
        assert json.loads(server.requests[-1][3]) == {"port": 8000, "dpop_jkt": "k" * 43}
        # The guest's own error is an answer, not an exception.
        r = sb.fetch(8000, "/app/x", params={"q": "1"})
        assert r.status_code == 418
        method, path, headers, _ = server.requests[-1]
        assert (method, path) == ("GET", "/v1/sandboxes/sb/ports/8000/app/x?q=1")
        assert headers.get("X-Forkvm-Port-Token") == EXPOSED["token"]
        assert "Authorization" not in headers, "the daemon's token never goes where a guest answers"
        # The daemon's own refusal is.
        with pytest.raises(forkvm.BadGateway, match="nothing listens"):
            sb.fetch(8000, "down")
        assert c.port_url(forkvm.ExposedPort.from_json(EXPOSED)) == f"{_url(server)}{EXPOSED['path']}?forkvm_token={EXPOSED['token']}"
        # At the port's own origin when it has one this host reaches.
        own = forkvm.ExposedPort.from_json({**EXPOSED, "host": "8000-sb.localhost"})
        assert own.host == "8000-sb.localhost"
        port = httpx.URL(_url(server)).port
        assert c.port_url(own) == f"http://8000-sb.localhost:{port}/?forkvm_token={EXPOSED['token']}"
        for bad in [0, 65536, "80", True]:
            with pytest.raises(ValueError):
                c.expose_port("sb", bad)  # type: ignore[arg-type]
    assert Controller("unix:/nonexistent.sock").port_url(forkvm.ExposedPort.from_json(EXPOSED)) is None
    remote = Controller("https://forkvm.example:8443", token="t")
    own = forkvm.ExposedPort.from_json({**EXPOSED, "host": "8000-sb.localhost"})
    assert remote.port_url(own) == f"https://forkvm.example:8443{EXPOSED['path']}?forkvm_token={EXPOSED['token']}"
    named = forkvm.ExposedPort.from_json({**EXPOSED, "host": "8000-sb.ports.example"})
    assert remote.port_url(named) == f"https://8000-sb.ports.example:8443/?forkvm_token={EXPOSED['token']}"


def test_network_policies_go_in_bodies_and_come_back_typed(server: TcpServer, client: Controller) -> None:
    policy = {"allow_internet": False, "allow": ["pypi.org", "*.pythonhosted.org"]}
    shown = {**SANDBOX, "id": "sb", "network": policy}
    server.routes[("POST", "/v1/sandboxes")] = _json_reply(201, [shown])
    server.routes[("PUT", "/v1/sandboxes/sb/network")] = _json_reply(200, {**SANDBOX, "id": "sb"})
    server.routes[("POST", "/v1/sandboxes/sb/fork")] = _json_reply(201, [shown])
    sb = Sandbox.create("py", controller=client, network=policy)
    assert json.loads(server.requests[-1][3])["network"] == policy
    assert sb.network.policy == forkvm.NetworkPolicy(allow_internet=False, allow=policy["allow"])
    # forkd's option is sent as asked: every sandbox has its own namespace here.
    client.spawn_sandboxes("py", per_child_netns=True)
    assert json.loads(server.requests[-1][3])["per_child_netns"] is True
    assert sb.network.update(deny=["10.0.0.0/8"]) == forkvm.NetworkPolicy()
    assert server.requests[-1][:2] == ("PUT", "/v1/sandboxes/sb/network")
    assert json.loads(server.requests[-1][3]) == {"allow_internet": True, "allow": [], "deny": ["10.0.0.0/8"]}
    sb.fork(network=forkvm.NetworkPolicy(deny=["evil.test"]))
    assert json.loads(server.requests[-1][3])["network"] == {"allow_internet": True, "allow": [], "deny": ["evil.test"]}
    sent = len(server.requests)
    for bad, err in [
        ({"allow": "pypi.org"}, TypeError),
        ({"allow_internet": "no"}, TypeError),
        ({"block": []}, ValueError),
        (["pypi.org"], TypeError),
    ]:
        with pytest.raises(err):
            client.set_network("sb", bad)  # type: ignore[arg-type]
    assert len(server.requests) == sent, "a malformed policy never reaches the daemon"
    with pytest.raises(ProtocolError):
        SandboxInfo.from_json({**SANDBOX, "network": {"allow": "x"}})
    # A tag's default policy goes in its create body and comes back typed.
    snap = {"tag": "closed", "dir": "/s/closed", "created_at_unix": 1, "status": "ready", "bootable": True}
    server.routes[("POST", "/v1/snapshots")] = _json_reply(201, {**snap, "default_network": policy})
    info = client.create_snapshot("closed", "python", network=forkvm.NetworkPolicy(allow_internet=False))
    assert json.loads(server.requests[-1][3])["default_network"] == {"allow_internet": False, "allow": [], "deny": []}
    assert info.default_network == forkvm.NetworkPolicy(allow_internet=False, allow=policy["allow"])
    assert forkvm.SnapshotInfo.from_json(snap).default_network is None


def test_lifecycle_over_fake_server(server: TcpServer, client: Controller) -> None:
    archived = {**SANDBOX, "id": "sb", "state": "archived", "pid": None, "reason": "api", "archived_at_unix_ms": 9}
    running = {**SANDBOX, "id": "sb", "ttl_seconds": 60, "expires_at_unix_ms": 70_000, "last_activity_unix_ms": 10_000}
    server.routes[("POST", "/v1/sandboxes/sb/archive")] = _json_reply(200, ARCHIVE_REPORT)
    server.routes[("GET", "/v1/sandboxes/sb")] = _json_reply(200, archived)
    server.routes[("POST", "/v1/sandboxes/sb/restore")] = _json_reply(200, running)
    server.routes[("POST", "/v1/sandboxes/sb/ttl")] = _json_reply(200, running)
    server.routes[("POST", "/v1/sandboxes/sb/disk-fork")] = _json_reply(201, {**SANDBOX, "id": "new", "forked_from": "sb"})
    sb = Sandbox(SandboxInfo.from_json({**SANDBOX, "id": "sb"}), client)
    r = sb.archive()
    assert (r.sandbox_id, r.disk_snapshot_seq, r.reason, r.write_ms) == ("sb", 3, "api", 80.5)
    assert sb.info.state == "archived" and sb.info.reason == "api" and sb.info.pid is None
    assert sb.info.archived_at_unix_ms == 9
    info = sb.restore(ttl_seconds=60)
    assert json.loads(server.requests[-1][3]) == {"ttl_seconds": 60}
    assert (info.state, info.ttl_seconds, info.expires_at_unix_ms, info.last_activity_unix_ms) == ("running", 60, 70_000, 10_000)
    client.restore("sb")
    assert server.requests[-1][:2] == ("POST", "/v1/sandboxes/sb/restore") and json.loads(server.requests[-1][3]) == {}
    sb.set_ttl(60)
    assert server.requests[-1][:2] == ("POST", "/v1/sandboxes/sb/ttl")
    assert json.loads(server.requests[-1][3]) == {"ttl_seconds": 60}
    child = sb.disk_fork(seq=2)
    assert child.id == "new" and child.info.forked_from == "sb"
    assert json.loads(server.requests[-1][3]) == {"seq": 2}
    sb.disk_fork(restore="eager")
    assert json.loads(server.requests[-1][3]) == {"restore": "eager"}
    server.routes[("POST", "/v1/sandboxes")] = _json_reply(201, [SANDBOX])
    client.spawn_sandboxes("py", ttl_seconds=30)
    assert json.loads(server.requests[-1][3]) == {"snapshot_tag": "py", "n": 1, "ttl_seconds": 30}


def test_lifecycle_errors_keep_their_class(server: TcpServer, client: Controller) -> None:
    server.routes[("POST", "/v1/sandboxes/sb/restore")] = _json_reply(
        409, {"error": "sandbox \"sb\" is running", "code": "conflict", "state": "running"}
    )
    with pytest.raises(forkvm.Conflict) as ei:
        client.restore("sb")
    assert ei.value.state == "running"
    with pytest.raises(forkvm.NotFound):
        client.archive_sandbox("nope")


# --- background processes ---------------------------------------------------------


def test_background_processes_send_their_options_and_read_their_output(server: TcpServer, client: Controller) -> None:
    from forkvm import ForkvmError, ProtocolError, Sandbox

    server.routes[("POST", "/v1/sandboxes/sb/processes")] = _fixed(201, "application/json", json.dumps(PROC).encode())
    p = client.start_process("sb", cmd="make", env={"A": "1"}, pty=(24, 80), tag="t", ring_bytes=64, timeout_secs=5)
    assert (p.pid, p.running, p.exit, p.pty) == (7, True, None, None)
    _, raw, _, body = server.requests[-1]
    assert json.loads(body) == {
        "cmd": "make",
        "tag": "t",
        "env": {"A": "1"},
        "pty": {"rows": 24, "cols": 80},
        "ring_bytes": 64,
        "timeout_secs": 5,
    }
    route = ("GET", "/v1/sandboxes/sb/processes/7/output")
    server.routes[route] = _fixed(200, "application/x-ndjson", PROC_OUTPUT)
    with client.process_output("sb", 7, offset=0, follow=True) as out:
        chunks = list(out)
    assert [(c.stream, c.offset, c.data) for c in chunks] == [("stdout", 0, b"hi"), ("stderr", 2, b"!")]
    assert out.process is not None and out.process.exit is not None and out.process.exit.exit_code == 3
    assert server.requests[-1][1] == "/v1/sandboxes/sb/processes/7/output?offset=0&follow=true"
    server.routes[route] = _fixed(200, "application/x-ndjson", PROC_OUTPUT.split(b"\n")[0] + b'\n{"type":"error","error":"gone"}\n')
    with pytest.raises(ForkvmError, match="gone"):
        client.process_output("sb", 7).read_all()
    server.routes[route] = _fixed(200, "application/x-ndjson", b'{"type":"keepalive"}\n')
    with pytest.raises(ProtocolError, match="first line"):
        client.process_output("sb", 7)

    # The sandbox's view: a background run sends its stdin and waits through the output.
    server.routes[("GET", "/v1/sandboxes/sb")] = _fixed(200, "application/json", json.dumps({**SB, "id": "sb"}).encode())
    server.routes[("POST", "/v1/sandboxes/sb/processes/7/input")] = _fixed(200, "application/json", b'{"bytes":3}')
    server.routes[route] = _fixed(200, "application/x-ndjson", PROC_OUTPUT)
    sb = Sandbox.connect("sb", controller=client)
    proc = sb.commands.run("cat", background=True, stdin="abc")
    assert proc.pid == 7
    assert server.requests[-1][1] == "/v1/sandboxes/sb/processes/7/input"
    assert proc.wait().exit is not None
    with pytest.raises(ValueError, match="kept, not streamed"):
        sb.commands.run("cat", background=True, on_stdout=print)


# --- checked transfers --------------------------------------------------------------


def test_uploads_name_their_sha256_and_a_download_unlike_the_guests_file_is_refused(
    server: TcpServer, client: Controller, tmp_path: Path
) -> None:
    import hashlib
    from urllib.parse import parse_qs, urlsplit

    def query(i: int = -1) -> Dict[str, List[str]]:
        return parse_qs(urlsplit(server.requests[i][1]).query)

    server.routes[("PUT", "/v1/sandboxes/sb/files")] = _json_reply(201, {"path": "/a", "bytes": 2, "sha256": "ab" * 32})
    assert client.write_file("sb", "/a", b"hi").sha256 == "ab" * 32
    assert query()["sha256"] == [hashlib.sha256(b"hi").hexdigest()]
    local = tmp_path / "big.bin"
    local.write_bytes(bytes(range(256)) * 12_000)
    client.upload_file("sb", local, "/big", mode=0o600)
    assert query()["sha256"] == [hashlib.sha256(local.read_bytes()).hexdigest()] and query()["mode"] == ["384"]
    assert len(server.requests[-1][3]) == local.stat().st_size

    body = b"hello"
    server.routes[("GET", "/v1/sandboxes/sb/files")] = _fixed(200, "application/octet-stream", body)
    good = {"path": "/f", "size": 5, "sha256": hashlib.sha256(body).hexdigest()}
    server.routes[("GET", "/v1/sandboxes/sb/files/sha256")] = _json_reply(200, good)
    got = client.download_file("sb", "/f", tmp_path / "f")
    assert (got.size, got.sha256, (tmp_path / "f").read_bytes()) == (5, good["sha256"], body)
    server.routes[("GET", "/v1/sandboxes/sb/files/sha256")] = _json_reply(200, {**good, "sha256": "00" * 32})
    with pytest.raises(ProtocolError, match="sha256"):
        client.download_file("sb", "/f", tmp_path / "g")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.bin", "f"], "a refused download leaves nothing"

    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "x.txt").write_text("x")
    server.routes[("PUT", "/v1/sandboxes/sb/files/tar")] = _json_reply(201, {"path": "/d", "bytes": 1, "sha256": "ab" * 32})
    client.upload_tar("sb", "/d", tree)
    import io
    import tarfile

    sent = server.requests[-1][3]
    assert query()["sha256"] == [hashlib.sha256(sent).hexdigest()]
    assert "./sub/x.txt" in tarfile.open(fileobj=io.BytesIO(sent)).getnames()


# --- a process's socket ------------------------------------------------------------


def test_a_process_socket_reads_output_keeps_what_follows_a_match_and_sends_keys_and_controls(tmp_path: Path) -> None:
    from websockets.sync.server import unix_serve

    got: List[Any] = []
    heard: Dict[str, Any] = {}
    proc = {"pid": 7, "argv": ["sh"], "started_at_unix_ms": 1, "output_end": 20, "output_start": 0,
            "stdin_open": False, "running": False, "exit": {"exit_code": 3, "timed_out": False, "duration_ms": 9}}

    def handler(ws: Any) -> None:
        heard["path"] = ws.request.path
        heard["auth"] = ws.request.headers.get("Authorization")
        ws.send(json.dumps({"type": "from", "offset": 5, "skipped": 2}))
        ws.send(b"\x01hello >>> wor")
        ws.send(json.dumps({"type": "keepalive"}))
        ws.send(b"\x02ld")
        got.append(ws.recv(timeout=10))
        got.append(ws.recv(timeout=10))
        ws.send(json.dumps({"type": "end", "process": proc}))
        ws.close()

    path = str(tmp_path / "d.sock")
    with unix_serve(handler, path) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        with Controller(f"unix:{path}", token="tok") as c:
            with c.attach_process("sb", 7, offset=5) as sock:
                assert (sock.offset, sock.skipped) == (5, 2)
                assert sock.read_until(">>> ") == b"hello >>> "
                assert sock.recv(timeout=10) == forkvm.OutputChunk(stream="stdout", offset=15, data=b"wor")
                assert sock.recv(timeout=10) == forkvm.OutputChunk(stream="stderr", offset=18, data=b"ld")
                sock.send("ls\r")
                sock.resize(40, 100)
                assert sock.recv(timeout=10) is None
                assert sock.process is not None and sock.process.exit is not None and sock.process.exit.exit_code == 3
        server.shutdown()
    assert heard == {"path": "/v1/sandboxes/sb/processes/7/attach?offset=5", "auth": "Bearer tok"}
    assert got == [b"ls\r", json.dumps({"type": "resize", "rows": 40, "cols": 100})]
