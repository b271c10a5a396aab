"""The code-interpreter template's server (templates/code-interpreter.toml), run on the
host with real IPython: E2B's `/execute` stream and `/contexts`, the cases the SDK tests
in a sandbox do not reach (contexts made, restarted and removed, a client that leaves
mid-run, bad requests). Seconds here, where each guest-side start costs minutes.

It needs Debian's python3-ipython, python3-matplotlib-inline and python3-matplotlib for
/usr/bin/python3 (the guest's packages; .ci/run installs them). The server is read out of
the template, so what is tested is what the image holds.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - CI's Python is 3.11
    tomllib = None

REPO = Path(__file__).resolve().parents[3]
TEMPLATE = REPO / "templates" / "code-interpreter.toml"
SERVER_PATH = "/usr/local/lib/forkvm/code-interpreter.py"
GUEST_PYTHON = "/usr/bin/python3"


def _has_kernel_packages() -> bool:
    probe = [GUEST_PYTHON, "-c", "import IPython, matplotlib_inline, matplotlib"]
    return os.path.exists(GUEST_PYTHON) and subprocess.run(probe, capture_output=True).returncode == 0


if os.environ.get("FORKVM_SDK_REQUIRE_DAEMON") == "1":
    assert tomllib is not None and _has_kernel_packages(), (
        f"{GUEST_PYTHON} needs python3-ipython, python3-matplotlib-inline and python3-matplotlib (.ci/run)"
    )
elif tomllib is None or not _has_kernel_packages():
    pytest.skip("needs Python 3.11 and Debian's IPython for /usr/bin/python3", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, port: int) -> None:
        self.port = port

    def request(self, method: str, path: str, body: object = None, timeout: float = 60) -> Tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body)
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.read().decode()
        finally:
            conn.close()

    def execute(self, code: str, **fields: object) -> List[dict]:
        status, text = self.request("POST", "/execute", {"code": code, **fields})
        assert status == 200, text
        assert "\n\n" not in text and text.endswith("\n"), repr(text)
        return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    source = tomllib.loads(TEMPLATE.read_text())["files"][SERVER_PATH]
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "code-interpreter.py"
        script.write_text(source)
        ready = Path(tmp) / "ready"
        port = _free_port()
        env = dict(os.environ, FORKVM_CODE_PORT=str(port), FORKVM_CODE_READY=str(ready), HOME=tmp,
                   MPLCONFIGDIR=str(Path(tmp) / "mpl"))
        log = open(Path(tmp) / "log", "wb")
        proc = subprocess.Popen([GUEST_PYTHON, str(script)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not ready.exists():
                assert proc.poll() is None, (Path(tmp) / "log").read_text()
                assert time.monotonic() < deadline, "the server did not get ready in 120 s"
                time.sleep(0.2)
            yield Server(port)
        finally:
            os.killpg(proc.pid, 9)  # the server, its zygote and its contexts
            proc.wait()
            log.close()


def test_state_results_and_the_line_order(server: Server) -> None:
    assert server.request("GET", "/health")[0] == 200
    assert server.execute("x = 1", context_id=None, language=None, env_vars=None) == [
        {"type": "number_of_executions", "execution_count": 1},
        {"type": "end_of_execution"},
    ]
    lines = server.execute("print('out'); x + 1")
    assert [l["type"] for l in lines] == ["number_of_executions", "stdout", "result", "end_of_execution"]
    assert lines[1]["text"] == "out\n" and lines[1]["timestamp"].startswith("20")
    assert {k: lines[2][k] for k in ("text", "is_main_result", "extra")} == {"text": "2", "is_main_result": True,
                                                                           "extra": {}}
    assert server.execute("'quoted'")[1]["text"] == "quoted"
    html = server.execute("from IPython.display import HTML, display\ndisplay(HTML('<b>b</b>'))")[1]
    assert (html["html"], html["is_main_result"]) == ("<b>b</b>", False)


def test_an_exception_is_one_error_line_without_colours(server: Server) -> None:
    lines = server.execute("def f():\n    raise KeyError('k')\nf()")
    errors = [l for l in lines if l["type"] == "error"]
    assert len(errors) == 1 and lines[-1] == {"type": "end_of_execution"}
    assert (errors[0]["name"], errors[0]["value"]) == ("KeyError", "'k'")
    assert "Traceback" in errors[0]["traceback"] and "\x1b[" not in errors[0]["traceback"]


def test_env_vars_hold_for_one_run(server: Server) -> None:
    lines = server.execute("import os; os.environ['FORKVM_T']", env_vars={"FORKVM_T": "v"})
    assert lines[1]["text"] == "v"
    assert [l["type"] for l in server.execute("os.environ.get('FORKVM_T')")] == [
        "number_of_executions", "end_of_execution"]
    assert server.request("POST", "/execute", {"code": "1", "env_vars": {"A": 1}})[0] == 400


def test_contexts_are_separate_kernels_that_restart_and_go(server: Server) -> None:
    status, text = server.request("POST", "/contexts", {"language": " Python", "cwd": "/tmp"}, timeout=120)
    assert status == 200, text
    ctx = json.loads(text)
    assert (ctx["language"], ctx["cwd"]) == ("python", "/tmp") and len(ctx["id"]) == 32
    assert server.execute("import os; os.getcwd()", context_id=ctx["id"])[1]["text"] == "/tmp"
    assert server.execute("z = 5", context_id=ctx["id"])[0]["execution_count"] == 2
    assert server.execute("z", language="python")[1]["name"] == "NameError", "the default kernel has no z"
    assert ctx["id"] in [c["id"] for c in json.loads(server.request("GET", "/contexts")[1])]
    assert server.request("POST", f"/contexts/{ctx['id']}/restart", timeout=120)[0] == 200
    assert server.execute("z", context_id=ctx["id"])[1]["name"] == "NameError", "a restart forgets"
    assert server.request("DELETE", f"/contexts/{ctx['id']}")[0] == 200
    assert server.request("POST", "/execute", {"code": "1", "context_id": ctx["id"]}) == (
        404, f"Context {ctx['id']} not found")


def test_bad_requests_are_refused_with_the_reason(server: Server) -> None:
    assert server.request("POST", "/execute", {"code": "1", "context_id": "a", "language": "python"}) == (
        400, "give context_id or language, not both")
    status, text = server.request("POST", "/execute", {"code": "1", "language": "cobol"})
    assert status == 400 and "'cobol' is not served" in text
    assert server.request("POST", "/execute", {"code": 1})[0] == 400
    assert server.request("POST", "/contexts", {"cwd": "relative"})[0] == 400
    status, text = server.request("POST", "/execute", None)
    assert status == 400, text
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.putrequest("POST", "/execute")
    conn.putheader("Content-Length", str(64 << 20))
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()
    assert server.request("GET", "/nope")[0] == 404


def test_a_client_that_leaves_interrupts_its_run_and_idle_runs_keep_alive(server: Server) -> None:
    lines = server.execute("import time; time.sleep(6); 'slept'")
    assert {"type": "keepalive"} in lines and lines[-2]["text"] == "slept"
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/execute", body=json.dumps({"code": "import time; time.sleep(600)"}))
    r = conn.getresponse()
    assert json.loads(r.readline())["type"] == "number_of_executions"
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    started = time.monotonic()
    lines = server.execute("'after'")
    assert lines[-2]["text"] == "after"
    # The next keepalive write finds the client gone (within ~5 s) and interrupts the kernel.
    assert time.monotonic() - started < 30, "the abandoned run was not interrupted"


def test_a_plot_is_a_png_and_a_context_that_dies_comes_back_empty(server: Server) -> None:
    import base64

    lines = server.execute("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    plots = [l for l in lines if l["type"] == "result" and "png" in l]
    assert len(plots) == 1 and plots[0]["is_main_result"] is False, lines
    assert base64.b64decode(plots[0]["png"]).startswith(b"\x89PNG\r\n\x1a\n")
    assert server.execute("w = 7; w")[1]["text"] == "7"
    lines = server.execute("import os; os._exit(3)")
    assert [l["type"] for l in lines][-2:] == ["error", "end_of_execution"] and lines[-2]["name"] == "ContextDied"
    lines = server.execute("w")
    assert lines[1]["name"] == "NameError", "a fresh context after the old one died"
    assert server.execute("1 + 1")[1]["text"] == "2"
