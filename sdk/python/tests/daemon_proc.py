"""Starting a real `forkvm daemon` for the acceptance tests: a private socket, run root,
snapshot store and keys in a temp directory, the settings given and no others, and a
stop that kills what the tests left running (through the API) and removes the directory.
Used by test_daemon.py (forkvm's SDK) and test_e2b_sdk.py (E2B's SDK against forkvm)."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[3]
FORKVM_BIN = os.environ.get("FORKVM_BIN") or str(REPO / "target" / "debug" / "forkvm")
READY_LINE = "forkvmd listening"
READY_TIMEOUT_S = 60


class Daemon:
    def __init__(self, proc: "subprocess.Popen[bytes]", socket: str, root: str, stderr_path: str) -> None:
        self.proc = proc
        self.socket = socket
        self.root = root
        self.stderr_path = stderr_path
        self.lines: List[str] = []

    @property
    def url(self) -> str:
        return f"unix:{self.socket}"

    def stderr_tail(self, n: int = 40) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return "(no stderr)"

    def line_with(self, text: str) -> Optional[str]:
        """The first line the daemon printed on stdout that holds `text`."""
        return next((line for line in self.lines if text in line), None)

    def stop(self) -> None:
        from forkvm import Controller, ForkvmError, NotFound

        try:
            with Controller(self.url, timeout=60) as c:
                for sb in c.list_sandboxes():
                    try:
                        c.kill_sandbox(sb.id)
                    except NotFound:
                        pass
        except ForkvmError as e:
            print(f"cleanup: could not kill sandboxes: {e}")
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def start_daemon(
    args: Sequence[str] = (),
    wait_for: Sequence[str] = (READY_LINE,),
    files: Dict[str, str] = {},
    env_extra: Dict[str, str] = {},
) -> Daemon:
    """Starts the daemon with `args` (`{root}` in one is the temp directory, also in a
    value of `env_extra`, set in its environment) after writing `files` (name → text)
    there, and returns once it printed a line holding each of `wait_for`; raises
    RuntimeError with its stderr otherwise."""
    root = tempfile.mkdtemp(prefix="fkpy-")
    for name, text in files.items():
        path = os.path.join(root, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o600)
    sock = os.path.join(root, "forkvmd.sock")
    env = dict(os.environ)
    for k in [k for k in env if k.startswith("FORKVMD_")] + ["FORKVM_DAEMON"]:
        env.pop(k, None)  # only the settings below
    env.update(
        FORKVM_RUN=os.path.join(root, "run"),
        FORKVM_STORE=os.path.join(root, "store"),
        FORKVM_KEYS=os.path.join(root, "keys"),  # disk snapshot keys: not the user's
    )
    env.update({k: v.replace("{root}", root) for k, v in env_extra.items()})
    stderr_path = os.path.join(root, "forkvmd.stderr")
    argv = [FORKVM_BIN, "daemon", "--socket", sock] + [a.replace("{root}", root) for a in args]
    with open(stderr_path, "wb") as errf:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errf, env=env)
    d = Daemon(proc, sock, root, stderr_path)
    lines: "queue.Queue[str]" = queue.Queue()

    def pump() -> None:  # keeps reading so the daemon never blocks on a full pipe
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw.decode("utf-8", "replace"))
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    failure = None
    try:
        while not all(d.line_with(w) for w in wait_for):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"not all of {list(wait_for)} within {READY_TIMEOUT_S} s; stdout: {d.lines}")
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                continue
            if line == "":
                raise RuntimeError(f"forkvmd exited with {proc.wait()} before it was ready; stdout: {d.lines}")
            d.lines.append(line.rstrip())
    except RuntimeError as e:
        failure = str(e)
    if failure is not None:
        proc.kill()
        proc.wait()
        tail = d.stderr_tail()
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"{failure}\nstderr:\n{tail}")
    return d


@contextlib.contextmanager
def serving(*args: object, **kwargs: object) -> Iterator[Daemon]:
    """`start_daemon(...)` for a fixture: a daemon that does not start fails the test with
    its words (not a traceback of this file); it is stopped when the block ends."""
    import pytest

    try:
        d = start_daemon(*args, **kwargs)  # type: ignore[arg-type]
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield d
    finally:
        d.stop()
