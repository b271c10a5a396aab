"""E2B's own Python SDK (`e2b`, pinned in .ci/run), unmodified, against `forkvm daemon
--e2b-api --e2b-sandbox` with real sandboxes (docs/e2b.md). It is pointed at forkvm the
way a user moves an agent over: E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL. Every
address is loopback.

The E2B template `base` is mapped to the forkvm tag `py` (the python template, which has
E2B's user `user`), and `code-interpreter-v1` (the code interpreter SDK's default) to the
tag `ci` (the code-interpreter template, its server and kernel warm in the snapshot).
Sandboxes are forks of their warm snapshots; the tests share a few.

The code interpreter's tests are in the long tier (FORKVM_LONG_TESTS=1, run by
scripts/test-long): booting its template takes over 35 minutes where the guest kernel
is emulated (every page its ~175 MB of Python touches is an emulated fault). Its server is
tested against real kernels on the host in every run (test_code_interpreter_server.py).
"""

from __future__ import annotations

import datetime
import os
import time
import urllib.error
import urllib.request
from typing import Iterator

import pytest

from daemon_proc import FORKVM_BIN, Daemon, start_daemon

if os.environ.get("FORKVM_SDK_REQUIRE_DAEMON") == "1":
    import e2b  # the test command needs it: a missing SDK fails, never skips
    import e2b_code_interpreter
else:
    e2b = pytest.importorskip("e2b", reason="E2B's SDK is not installed (.ci/run installs e2b==2.63.0)")
    e2b_code_interpreter = pytest.importorskip("e2b_code_interpreter", reason=".ci/run installs it (2.11.5)")

from forkvm import Controller  # noqa: E402

TEMPLATE_TIMEOUT_S = 900
LONG = os.environ.get("FORKVM_LONG_TESTS") == "1"
CODE_TEMPLATE_TIMEOUT_S = 3600
long_tier = pytest.mark.skipif(not LONG, reason="long tier: scripts/test-long (FORKVM_LONG_TESTS=1)")
API_KEY = "e2b_forkvm_test_key_0123456789"

if os.environ.get("FORKVM_SDK_REQUIRE_DAEMON") == "1" and not os.path.exists(FORKVM_BIN):
    raise RuntimeError(f"FORKVM_BIN={FORKVM_BIN} does not exist, and FORKVM_SDK_REQUIRE_DAEMON=1")

pytestmark = pytest.mark.skipif(not os.path.exists(FORKVM_BIN), reason=f"FORKVM_BIN={FORKVM_BIN} does not exist")


def _addr(d: Daemon, what: str) -> str:
    line = d.line_with(what)
    assert line, f"the daemon printed no {what!r} line: {d.lines}"
    return line.rsplit(" ", 1)[-1]


@pytest.fixture(scope="module")
def forkvm_e2b() -> Iterator[Daemon]:
    try:
        d = start_daemon(
            [
                "--e2b-api", "127.0.0.1:0",
                "--e2b-sandbox", "127.0.0.1:0",
                "--e2b-api-keys", "{root}/e2b-keys",
                "--e2b-template", "base=py",
                "--e2b-template", "code-interpreter-v1=ci",
            ],
            wait_for=["forkvmd listening", "E2B API listening", "E2B sandbox front listening"],
            files={"e2b-keys": f"# the test's key\n{API_KEY}\n"},
        )
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    saved = {k: os.environ.get(k) for k in ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DOMAIN", "E2B_DEBUG")}
    try:
        with Controller(d.url, timeout=120) as c:
            snap = c.create_snapshot("py", "python", timeout=TEMPLATE_TIMEOUT_S)
            assert snap.status == "ready"
            if LONG:
                snap = c.create_snapshot("ci", "code-interpreter", timeout=CODE_TEMPLATE_TIMEOUT_S)
                assert snap.status == "ready"
        os.environ.pop("E2B_DEBUG", None)
        os.environ.pop("E2B_DOMAIN", None)
        os.environ.update(
            E2B_API_KEY=API_KEY,
            E2B_API_URL=_addr(d, "E2B API listening"),
            E2B_SANDBOX_URL=_addr(d, "E2B sandbox front listening"),
        )
        yield d
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        d.stop()


@pytest.fixture(scope="module")
def sbx(forkvm_e2b: Daemon) -> Iterator["e2b.Sandbox"]:
    s = e2b.Sandbox.create("base", timeout=600, metadata={"suite": "forkvm"})
    try:
        yield s
    finally:
        s.kill()


def test_commands_files_info_list_and_kill(forkvm_e2b: Daemon) -> None:
    t = time.monotonic()
    s = e2b.Sandbox.create("base", timeout=120, metadata={"case": "lifecycle"}, envs={"SANDBOX_WIDE": "yes"})
    print(f"Sandbox.create: {(time.monotonic() - t) * 1e3:.0f} ms")
    try:
        assert len(s.sandbox_id) >= 16 and s.sandbox_id.isalnum()
        # One command for several checks: each exec costs seconds where the guest kernel
        # is emulated. As E2B's user, at home, with sandbox and per-call envs, and
        # passwordless sudo.
        r = s.commands.run("echo hi; whoami; pwd; echo $SANDBOX_WIDE $ASKED; sudo -n whoami", envs={"ASKED": "too"})
        assert (r.stdout, r.exit_code) == ("hi\nuser\n/home/user\nyes too\nroot\n", 0), r.stderr

        s.files.write("notes/a.txt", "hello from e2b\n")
        assert s.files.read("notes/a.txt") == "hello from e2b\n"
        assert s.files.read("/home/user/notes/a.txt") == "hello from e2b\n"
        entries = s.files.list("/home/user/notes")
        assert [(e.name, e.path, e.type.value, e.size, e.owner, e.group) for e in entries] == [
            ("a.txt", "/home/user/notes/a.txt", "file", 15, "user", "user")
        ]
        assert s.commands.run("stat -c %U notes/a.txt notes").stdout == "user\nuser\n", "owned by the user"
        assert s.files.exists("notes/a.txt") and not s.files.exists("notes/nope")
        assert s.files.make_dir("notes/sub") is True and s.files.make_dir("notes/sub") is False
        s.files.rename("notes/a.txt", "notes/sub/b.txt")
        assert s.files.read("notes/sub/b.txt") == "hello from e2b\n"
        s.files.remove("notes")
        assert not s.files.exists("notes")
        with pytest.raises(e2b.NotFoundException):
            s.files.read("no/such/file")

        info = s.get_info()
        assert (info.sandbox_id, info.template_id, info.state.value) == (s.sandbox_id, "base", "running")
        assert info.metadata == {"case": "lifecycle"}
        assert info.cpu_count >= 1 and info.memory_mb > 0
        # Metrics every 5 s while it runs: CPU as a share of its vCPUs since the sample
        # before, the memory its VMM uses; a range picks samples by their time.
        deadline = time.monotonic() + 20
        while len(m := s.get_metrics()) < 2 and time.monotonic() < deadline:
            time.sleep(1)
        assert len(m) >= 2, m
        for x in m:
            assert 0 <= x.cpu_used_pct <= 100 and 0 < x.mem_used <= x.mem_total, x
            assert (x.cpu_count, x.mem_total) == (info.cpu_count, info.memory_mb << 20), x
        assert any(x.cpu_used_pct > 0 for x in m), "its commands used CPU"
        assert [x.timestamp for x in m] == sorted(x.timestamp for x in m)
        newest = s.get_metrics(start=m[-1].timestamp)
        assert newest and newest[0].timestamp == m[-1].timestamp, (m, newest)
        assert s.get_metrics(start=m[0].timestamp, end=m[0].timestamp) == [m[0]]
        assert s.get_metrics(end=m[0].timestamp - datetime.timedelta(hours=1)) == []
        listed = {x.sandbox_id: x for x in e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"case": "lifecycle"})).next_items()}
        assert list(listed) == [s.sandbox_id]
        assert s.is_running() is True
    finally:
        assert s.kill() is True
    assert s.is_running() is False
    assert e2b.Sandbox.kill(s.sandbox_id) is False, "a second kill finds nothing"
    ids = [x.sandbox_id for x in e2b.Sandbox.list().next_items()]
    assert s.sandbox_id not in ids


def test_a_failing_command_and_a_missing_program_raise_the_sdks_own_exceptions(sbx: "e2b.Sandbox") -> None:
    with pytest.raises(e2b.CommandExitException) as err:
        sbx.commands.run("echo out; echo err >&2; exit 3")
    assert (err.value.exit_code, err.value.stdout, err.value.stderr) == (3, "out\n", "err\n")
    with pytest.raises(e2b.CommandExitException) as err:
        sbx.commands.run("no-such-program-here")
    assert err.value.exit_code == 127 and "not found" in err.value.stderr


def test_a_background_command_has_a_pid_and_dies_by_kill(sbx: "e2b.Sandbox") -> None:
    h = sbx.commands.run("echo started; sleep 120", background=True)
    assert h.pid > 1
    procs = sbx.commands.list()
    assert h.pid in [p.pid for p in procs]
    assert sbx.commands.run(f"kill -0 {h.pid} && echo alive").stdout == "alive\n"
    assert h.kill() is True
    with pytest.raises(e2b.CommandExitException) as err:
        h.wait()
    assert err.value.exit_code == -1, "killed by a signal, as envd reports it"
    assert h.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(h.pid) is False, "a process that is gone is not found"


def test_stdin_and_a_terminal_reach_a_started_process(sbx: "e2b.Sandbox") -> None:
    from e2b.sandbox.commands.command_handle import PtySize

    h = sbx.commands.run('read a; read b; echo "$a+$b"', background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "1\n")
    sbx.commands.stream_input(h.pid, ["2", "\n"])
    assert h.wait().stdout == "1+2\n"
    # close_stdin (envd 0.5.2): the end of input reaches the process, which ends.
    counted = sbx.commands.run("wc -l", background=True, stdin=True)
    sbx.commands.send_stdin(counted.pid, "a\nb\nc\n")
    sbx.commands.close_stdin(counted.pid)
    assert counted.wait().stdout.strip() == "3"
    # Without stdin, a read sees the end at once (as from /dev/null).
    assert sbx.commands.run("cat; echo done").stdout == "done\n"

    term = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.resize(term.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(term.pid, b"stty size; exit 3\n")
    screen = bytearray()
    try:
        result = term.wait(on_pty=lambda data: screen.extend(data))
        code = result.exit_code
    except e2b.CommandExitException as e:
        code = e.exit_code
    assert code == 3
    assert b"30 100" in screen, screen


def test_watch_dir_reports_the_changes_in_order(sbx: "e2b.Sandbox") -> None:
    from e2b.sandbox.filesystem.watch_handle import FilesystemEventType as T

    sbx.files.make_dir("watched/sub")
    h = sbx.files.watch_dir("watched", recursive=True)
    try:
        # One command for all of them: the order is the guest's.
        sbx.commands.run(
            "cd watched && for f in a b c; do : > $f; done && for f in a b c; do echo x >> $f; done && rm a b c"
            " && : > sub/deep"
        )
        events = []
        deadline = time.monotonic() + 60
        while len(events) < 10 and time.monotonic() < deadline:
            events += [(e.type, e.name) for e in h.get_new_events()]
            time.sleep(0.2)
        assert events == [
            (T.CREATE, "a"), (T.CREATE, "b"), (T.CREATE, "c"),
            (T.WRITE, "a"), (T.WRITE, "b"), (T.WRITE, "c"),
            (T.REMOVE, "a"), (T.REMOVE, "b"), (T.REMOVE, "c"),
            (T.CREATE, "sub/deep"),
        ]
    finally:
        h.stop()
    with pytest.raises(e2b.SandboxException):
        h.get_new_events()
    with pytest.raises(e2b.NotFoundException):
        sbx.files.watch_dir("no/such/dir")


def test_pause_then_connect_keeps_processes_and_files(forkvm_e2b: Daemon) -> None:
    s = e2b.Sandbox.create("base", timeout=120)
    try:
        s.files.write("state.txt", "kept")
        h = s.commands.run("sleep 300", background=True, timeout=0)
        token = s._envd_access_token
        assert s.pause() is True
        assert s.is_running() is False
        assert e2b.Sandbox.get_info(s.sandbox_id).state.value == "paused"
        assert s.pause() is False, "paused already (409)"
        t = time.monotonic()
        again = e2b.Sandbox.connect(s.sandbox_id)
        print(f"Sandbox.connect (resume): {(time.monotonic() - t) * 1e3:.0f} ms")
        assert again._envd_access_token == token, "the same envd token after a resume"
        assert again.is_running() is True
        assert again.files.read("state.txt") == "kept"
        assert again.commands.run(f"kill -0 {h.pid} && echo alive").stdout == "alive\n"
        assert e2b.Sandbox.get_info(s.sandbox_id).state.value == "running"
    finally:
        e2b.Sandbox.kill(s.sandbox_id)


def test_timeouts_end_a_sandbox(forkvm_e2b: Daemon) -> None:
    s = e2b.Sandbox.create("base", timeout=120)
    before = s.get_info().end_at
    s.set_timeout(2)
    assert s.get_info().end_at < before
    deadline = time.monotonic() + 30
    while s.is_running() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert s.is_running() is False, "the sandbox outlived its timeout"
    with pytest.raises(e2b.NotFoundException):
        e2b.Sandbox.get_info(s.sandbox_id)


def test_keys_tokens_and_unknown_sandboxes_are_refused(forkvm_e2b: Daemon, sbx: "e2b.Sandbox") -> None:
    with pytest.raises(e2b.AuthenticationException):
        e2b.Sandbox.list(api_key="e2b_not_the_operators_key_000").next_items()
    with pytest.raises(e2b.SandboxException):
        e2b.Sandbox.create("no-such-template-here")
    front = os.environ["E2B_SANDBOX_URL"]

    def get(headers: dict) -> "tuple[int, str]":
        req = urllib.request.Request(front + "/health", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    status, body = get({"E2b-Sandbox-Id": "0123456789abcdef", "E2b-Sandbox-Port": "49983"})
    assert status == 502 and "The sandbox was not found" in body
    assert get({"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"})[0] == 204
    req = urllib.request.Request(
        front + "/files?path=/etc/hostname",
        headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": "wrong"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 401
    # The traffic token (E2B's SDKs send it, not X-Access-Token, on the code
    # interpreter's context calls) opens the guest's other ports, never envd.
    token = sbx.traffic_access_token
    assert token, "create replies with a trafficAccessToken: no port of a sandbox is public"
    envd = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983", "E2B-Traffic-Access-Token": token}
    req = urllib.request.Request(front + "/files?path=/etc/hostname", headers=envd)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 401
    port = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"}
    assert get(port)[0] == 401
    status, body = get({**port, "E2B-Traffic-Access-Token": token})
    assert status == 502 and "401" not in body, (status, body)  # past the check; nothing listens there
    assert get({**port, "E2B-Traffic-Access-Token": "wrong"})[0] == 401


JS_DIR = os.path.join(os.path.dirname(__file__), "e2b_js")


def _run_node(script: str, package: str) -> None:
    """Runs `script` (in e2b_js, installed by .ci/run with `npm ci`) with node."""
    import shutil
    import subprocess

    node = shutil.which("node")
    installed = os.path.isdir(os.path.join(JS_DIR, "node_modules", *package.split("/")))
    if os.environ.get("FORKVM_SDK_REQUIRE_DAEMON") == "1":
        assert node and installed, f"node and {package} (npm ci --prefix sdk/python/tests/e2b_js)"
    elif not node or not installed:
        pytest.skip(f"node or {package} is missing: npm ci --prefix sdk/python/tests/e2b_js")
    r = subprocess.run([node, script], cwd=JS_DIR, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("ok"), f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"


def test_the_js_sdk_too(forkvm_e2b: Daemon) -> None:
    """E2B's JS SDK (e2b@2.51.0) through the same flows, as a node script against this
    daemon."""
    _run_node("e2b_check.mjs", "e2b")


@long_tier
def test_the_js_code_interpreter_sdk_too(forkvm_e2b: Daemon) -> None:
    """E2B's code interpreter JS SDK (@e2b/code-interpreter@2.8.0): runCode's state,
    errors, plots and streamed output."""
    _run_node("e2b_code_check.mjs", "@e2b/code-interpreter")


@long_tier
def test_run_code_keeps_state_and_returns_errors_plots_and_contexts(forkvm_e2b: Daemon) -> None:
    """E2B's code interpreter SDK (`e2b-code-interpreter==2.11.5`), unmodified: its
    `run_code` reaches the template's server on port 49999 through the front."""
    import base64

    t = time.monotonic()
    s = e2b_code_interpreter.Sandbox.create(timeout=600, envs={"WIDE": "sandbox", "BOTH": "sandbox"})
    print(f"code interpreter Sandbox.create: {(time.monotonic() - t) * 1e3:.0f} ms")
    try:
        t = time.monotonic()
        first = s.run_code("x = 1")
        print(f"first run_code: {(time.monotonic() - t) * 1e3:.0f} ms")
        assert (first.error, first.results, first.execution_count) == (None, [], 1)
        second = s.run_code("x + 1")
        assert (second.text, second.execution_count) == ("2", 2)
        assert s.run_code("'a string'").text == "a string", "E2B gives a string's value without quotes"

        failed = s.run_code("print('before'); 1 / 0")
        assert failed.logs.stdout == ["before\n"]
        assert (failed.error.name, failed.error.value) == ("ZeroDivisionError", "division by zero")
        assert "Traceback" in failed.error.traceback and "\x1b[" not in failed.error.traceback, "no colours"

        plot = s.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()")
        pngs = [r.png for r in plot.results if r.png]
        assert len(pngs) == 1 and base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n"), plot
        assert plot.results[0].is_main_result is False

        streamed: list = []
        env = s.run_code("import os, sys\nprint(os.environ['ASKED'])\nos.getcwd()", envs={"ASKED": "yes"},
                         on_stdout=lambda m: streamed.append(m.line))
        assert (env.text, streamed) == ("/home/user", ["yes\n"])
        assert s.run_code("os.environ.get('ASKED')").text is None, "a run's envs end with it"
        # The sandbox's envs reach every cell; a run's own of the same name wins.
        both = s.run_code("os.environ['WIDE'] + ' ' + os.environ['BOTH']", envs={"BOTH": "run"})
        assert both.text == "sandbox run", both
        assert s.run_code("os.environ['BOTH']").text == "sandbox"

        with pytest.raises(e2b.NotFoundException):
            s.run_code("1", context=e2b_code_interpreter.Context(context_id="nope", language="python", cwd="/"))
        assert [c.language for c in s.list_code_contexts()] == ["python"]
    finally:
        s.kill()
