"""Acceptance tests: the SDK against a real `forkvm daemon` with real sandboxes.

A session fixture starts `$FORKVM_BIN daemon` (default <repo>/target/debug/forkvm) on a
private socket, run root and snapshot store, builds the snapshot tag `py` from the
`python` template (cached after the first build), and at the end kills every sandbox
it made through the API and stops the daemon. Every test here is skipped, with the
reason, only when that binary does not exist.

Restores cost ~1-2 s of guest time each on the CI machine, so the tests share one
sandbox where they can; in all about six sandboxes are spawned.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from daemon_proc import FORKVM_BIN, Daemon, serving

import forkvm
from forkvm import BadRequest, Conflict, Controller, EvalError, ForkvmError, NotFound, Sandbox

TEMPLATE_TIMEOUT_S = 900
#: The session daemon's remote key (32 bytes), shared with the daemon that pulls from it.
REMOTE_KEY = secrets.token_hex(16)

# The test command (scripts/test) sets FORKVM_SDK_REQUIRE_DAEMON=1: there a missing
# binary is a failure, never a silent skip.
if os.environ.get("FORKVM_SDK_REQUIRE_DAEMON") == "1" and not os.path.exists(FORKVM_BIN):
    raise RuntimeError(f"FORKVM_BIN={FORKVM_BIN} does not exist, and FORKVM_SDK_REQUIRE_DAEMON=1")

pytestmark = pytest.mark.skipif(
    not os.path.exists(FORKVM_BIN),
    reason=f"FORKVM_BIN={FORKVM_BIN} does not exist: build it with `cargo build -p forkvm` or set FORKVM_BIN",
)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    remote = ["--remote", "file://{root}/remote", "--remote-key", "{root}/remote.key"]
    with serving(remote, files={"remote.key": REMOTE_KEY}) as d:
        yield d


@pytest.fixture(scope="session")
def ctl(daemon: Daemon) -> Iterator[Controller]:
    with Controller(daemon.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def py(ctl: Controller) -> str:
    """The snapshot tag `py`, built from the python template."""
    snap = ctl.create_snapshot("py", "python", timeout=TEMPLATE_TIMEOUT_S)
    assert (snap.tag, snap.status, snap.bootable) == ("py", "ready", True)
    return snap.tag


@pytest.fixture(scope="module")
def sb(ctl: Controller, py: str) -> Iterator[Sandbox]:
    """One sandbox shared by the tests that do not need their own."""
    with Sandbox.create(py, controller=ctl) as s:
        yield s


# --- daemon ------------------------------------------------------------------


def test_health_version_metrics(ctl: Controller) -> None:
    assert ctl.health() is True
    v = ctl.version()
    assert v.api == "v1" and v.version
    assert "forkvm_http_requests_total" in ctl.metrics()


def test_snapshot_listed_with_info(ctl: Controller, py: str) -> None:
    assert py in [s.tag for s in ctl.list_snapshots()]
    info = ctl.snapshot_info(py)
    assert (info.tag, info.status) == (py, "ready")
    assert info.memory_logical_bytes > 0


# --- commands -------------------------------------------------------------------


def test_run_echo_and_exit_codes(sb: Sandbox) -> None:
    r = sb.commands.run("echo hi")
    assert (r.stdout, r.exit_code, r.timed_out) == ("hi\n", 0, False)
    r = sb.commands.run("echo oops >&2; exit 3")
    assert (r.stderr, r.exit_code, r.timed_out) == ("oops\n", 3, False)
    r = sb.commands.run(["echo", "a  b", "$HOME"])
    assert r.stdout == "a  b $HOME\n"
    r = sb.commands.run("echo $GREETING; pwd; cat", env={"GREETING": "hello"}, cwd="/tmp", stdin="from stdin")
    assert r.stdout == "hello\n/tmp\nfrom stdin"
    # A program that cannot start is exit 127, collected or streamed; a 404 is the sandbox.
    for run in (sb.controller.exec_command, sb.controller.exec_stream):
        r = run(sb.id, ["/no/such/program"])
        assert r.exit_code == 127 and "/no/such/program" in r.stderr, (run.__name__, r)


def test_run_timeout(sb: Sandbox) -> None:
    r = sb.commands.run("sleep 5", timeout=1)
    assert r.timed_out is True
    assert r.exit_code == 124


def test_stream_collects_all_output(sb: Sandbox) -> None:
    out: List[str] = []
    err: List[str] = []
    r = sb.commands.run(
        "for i in 1 2 3; do echo $i; sleep 0.2; done; echo done >&2",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == "1\n2\n3\n" == r.stdout
    assert "".join(err) == "done\n" == r.stderr
    assert r.exit_code == 0


def test_stream_delivers_chunks_before_exit(sb: Sandbox) -> None:
    """The command prints 1, then waits for a file that only the on_stdout callback
    creates (over another request) on seeing the 1. Without streaming the callback
    would run only after the exit, and the command would give up without printing 2."""
    assert sb.commands.run("rm -f /tmp/go").exit_code == 0
    created: List[str] = []

    def on_out(chunk: str) -> None:
        if "1" in chunk and not created:
            sb.files.write("/tmp/go", b"")
            created.append(chunk)

    script = "echo 1; i=0; while [ ! -e /tmp/go ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; [ -e /tmp/go ] && echo 2"
    r = sb.commands.run(script, timeout=30, on_stdout=on_out)
    assert created, "on_stdout was never called"
    assert (r.stdout, r.exit_code) == ("1\n2\n", 0), r


def test_exec_bad_request_names_the_problem(sb: Sandbox, ctl: Controller) -> None:
    with pytest.raises(BadRequest) as ei:
        ctl.exec_command(sb.id, [])
    assert ei.value.code == "bad_request" and ei.value.message


# --- files --------------------------------------------------------------------------


def test_files_round_trip(sb: Sandbox) -> None:
    every_byte = bytes(range(256))
    w = sb.files.write("/tmp/sdk/all.bin", every_byte)
    assert (w.path, w.bytes) == ("/tmp/sdk/all.bin", 256)
    assert sb.files.read("/tmp/sdk/all.bin") == every_byte

    big = os.urandom(1 << 20)
    sb.files.write("/tmp/sdk/big.bin", big, mode=0o600)
    assert sb.files.read("/tmp/sdk/big.bin") == big
    entries = {e.name: e for e in sb.files.list("/tmp/sdk")}
    assert entries["big.bin"].type == "file" and entries["big.bin"].size == 1 << 20
    assert entries["big.bin"].mode & 0o777 == 0o600
    assert entries["all.bin"].size == 256

    sb.files.write("/tmp/sdk/t.txt", "héllo")
    assert sb.files.read_text("/tmp/sdk/t.txt") == "héllo"
    assert sb.commands.run("cat /tmp/sdk/t.txt").stdout == "héllo"

    sb.files.remove("/tmp/sdk/big.bin")
    with pytest.raises(NotFound):
        sb.files.read("/tmp/sdk/big.bin")
    sb.files.remove("/tmp/sdk", recursive=True)
    with pytest.raises(NotFound):
        sb.files.list("/tmp/sdk")


#: The file streamed through the daemon. Small by default: the guest kernel is emulated
#: here and moves ~0.3 MiB/s (48 MiB up and down takes 6 minutes); the daemon's memory is
#: checked from 32 MiB on (`FORKVM_SDK_BIG_MIB=48`, and `forkvm bench files`).
BIG_MIB = int(os.environ.get("FORKVM_SDK_BIG_MIB", "4"))


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_large_files_stream_checked_both_ways_and_trees_go_out_and_in_as_tar(
    sb: Sandbox, daemon: Daemon, tmp_path: Path
) -> None:
    import hashlib
    import tarfile
    import threading

    local = tmp_path / "big.bin"
    with open(local, "wb") as f:
        for _ in range(BIG_MIB):
            f.write(os.urandom(1 << 20))
    digest = hashlib.sha256(local.read_bytes()).hexdigest()
    # The daemon's memory while the file goes up and comes back: it streams, it never
    # holds the file.
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_kib(daemon.proc.pid))
            done.wait(0.05)

    before = _rss_kib(daemon.proc.pid)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        up = sb.files.upload(local, "/tmp/big/in.bin")
        down = sb.files.download("/tmp/big/in.bin", tmp_path / "back.bin")
    finally:
        done.set()
        sampler.join()
    assert (up.bytes, up.sha256) == (BIG_MIB << 20, digest)
    assert (down.size, down.sha256) == (BIG_MIB << 20, digest)
    assert hashlib.sha256((tmp_path / "back.bin").read_bytes()).hexdigest() == digest
    grew_mib = (peak[0] - before) / 1024
    print(f"{BIG_MIB} MiB up and down: the daemon's RSS grew {grew_mib:.1f} MiB at most")
    if BIG_MIB >= 32:
        assert grew_mib < BIG_MIB / 2, f"the daemon's RSS grew {grew_mib:.1f} MiB for a {BIG_MIB} MiB file"

    # A body unlike the digest it names is refused, and nothing is written.
    with pytest.raises(BadRequest, match="nothing was written"):
        sb.controller._request(
            "PUT", f"/v1/sandboxes/{sb.id}/files", params={"path": "/tmp/big/bad.bin", "sha256": "00" * 32}, content=b"x"
        )
    assert sb.commands.run("ls /tmp/big").stdout.split() == ["in.bin"]

    # A tree out as tar (links stay links) and in again elsewhere.
    sb.commands.run("mkdir -p /tmp/tree/sub && echo a > /tmp/tree/a && echo b > /tmp/tree/sub/b && ln -s /etc/hostname /tmp/tree/link")
    archive = tmp_path / "tree.tar"
    assert sb.files.download_dir("/tmp/tree", archive) == archive.stat().st_size
    with tarfile.open(archive) as t:
        members = {m.name: m for m in t.getmembers()}
        assert sorted(members) == ["a", "link", "sub", "sub/b"]
        assert members["link"].issym() and members["link"].linkname == "/etc/hostname"
        t.extractall(tmp_path / "tree", filter="tar")
    assert sb.files.upload_dir(tmp_path / "tree", "/tmp/tree2").sha256
    assert sb.commands.run("cat /tmp/tree2/a /tmp/tree2/sub/b; readlink /tmp/tree2/link").stdout == "a\nb\n/etc/hostname\n"
    with pytest.raises(BadRequest):
        sb.files.download_dir("/tmp/tree/a", tmp_path / "not-a-dir.tar")
    sb.commands.run("rm -rf /tmp/big /tmp/tree /tmp/tree2")


def test_watch_reports_exactly_the_changes_in_order(sb: Sandbox) -> None:
    sb.files.write("/tmp/watched/sub/keep", b"")
    with sb.files.watch("/tmp/watched", recursive=True) as w:
        assert w.directories == 2
        # One command makes every change, so the order is the guest's.
        sb.commands.run(
            "cd /tmp/watched && for f in a b c; do : > $f; done && for f in a b c; do echo x >> $f; done"
            " && rm a b c && mv sub/keep sub/kept && chmod 600 sub/kept"
        )
        changes = []
        for change in w:
            changes.append((change.kind, change.path))
            if len(changes) == 12:
                break
    assert changes == [
        ("create", "a"), ("create", "b"), ("create", "c"),
        ("write", "a"), ("write", "b"), ("write", "c"),
        ("remove", "a"), ("remove", "b"), ("remove", "c"),
        ("rename", "sub/keep"), ("create", "sub/kept"), ("chmod", "sub/kept"),
    ]
    # The watch ended with the connection: the agent answers at once.
    assert sb.commands.run("true").exit_code == 0
    with pytest.raises(NotFound):
        sb.files.watch("/tmp/no-such-dir")
    with pytest.raises(BadRequest):
        sb.files.watch("/tmp/watched/sub/kept")


# --- background processes ----------------------------------------------------------


def test_a_background_process_runs_on_and_is_read_fed_and_waited_for(sb: Sandbox) -> None:
    from forkvm import Process

    proc = sb.commands.run("read x; echo \"got $x\"; echo err >&2; exit 3", background=True, timeout=60)
    assert isinstance(proc, Process) and proc.info.running
    assert any(p.pid == proc.pid for p in sb.commands.list())
    proc.send_stdin("hello\n", close=True)
    ended = proc.wait()
    assert ended.exit is not None and ended.exit.exit_code == 3 and not ended.running
    with proc.output() as out:
        chunks = list(out)
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"got hello\n"
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"err\n"
    assert out.process is not None and out.process.output_end == 14
    # From an offset: the rest. (Which of stdout's and stderr's writes the agent read
    # first is the guest's race: the offsets count them in the order they were read.)
    assert proc.output(4).read_all() == b"".join(c.data for c in chunks)[4:]
    with pytest.raises(BadRequest):
        proc.output(99)
    with pytest.raises(NotFound):
        sb.commands.connect(999999)

    # A terminal: its own, of its size, resized on request; Ctrl-C reaches its job.
    term = sb.pty.create(24, 80, cmd="stty size; read x; stty size; sleep 600")
    assert term.info.pty == (24, 80)
    with term.output(follow=True) as out:
        chunks = iter(out)
        seen = b""
        while b"24 80" not in seen:
            seen += next(chunks).data
        term.resize(40, 120)
        term.send_stdin("\r")
        while b"40 120" not in seen:
            seen += next(chunks).data
    term.send_stdin("\x03")
    assert term.wait().exit is not None
    sleeper = sb.commands.run(["sleep", "600"], background=True, timeout=0)
    sleeper.kill()
    assert sleeper.wait().exit.exit_code == 137  # type: ignore[union-attr]


def test_a_terminal_on_a_websocket_resizes_types_interrupts_and_is_attached_again(sb: Sandbox) -> None:
    term = sb.pty.create(24, 80, cmd="sh")
    with term.attach() as sock:
        sock.resize(50, 132)
        sock.send("stty size; echo size-$((6*7))\r")
        assert b"50 132" in sock.read_until("size-42")
        sock.send("python3 -i; echo after-$((2+3))\r")
        sock.read_until(">>> ", timeout=120)
        sock.send("x = 6 * 7\r")
        sock.read_until(">>> ")
        sock.send("while True: pass\r\r")
        time.sleep(1)
        sock.send("\x03")
        sock.read_until("KeyboardInterrupt", timeout=60)
        sock.read_until(">>> ")
    # Detached: the interpreter runs on, and keeps its state for the next attachment.
    with term.attach(offset=term.refresh().output_end) as sock:
        sock.send("print(x + 1)\r")
        sock.read_until("43")
        sock.send("exit()\r")
        sock.read_until("after-5")
        sock.send("exit 7\r")
        for _ in sock:
            pass
        assert sock.process is not None and sock.process.exit is not None and sock.process.exit.exit_code == 7
    # Controls the daemon cannot take close the socket with an error; a pid it does not
    # know is an HTTP error before any socket.
    idle = sb.pty.create(24, 80, cmd="sleep 600")
    with idle.attach() as sock:
        sock.resize(0, 80)
        with pytest.raises(ForkvmError, match="0x80"):
            sock.recv(timeout=30)
    assert idle.refresh().running
    idle.kill()
    with pytest.raises(NotFound):
        sb.controller.attach_process(sb.id, 999999)


# --- eval ------------------------------------------------------------------------------


def test_eval(sb: Sandbox) -> None:
    assert sb.eval("1 + 1") == "2"
    assert sb.eval("'a' * 3") == "'aaa'"
    assert sb.eval("z = [1, 2]") is None
    assert sb.eval("z") == "[1, 2]"
    with pytest.raises(EvalError) as ei:
        sb.eval("1/0")
    assert "ZeroDivisionError" in str(ei.value)
    assert "ZeroDivisionError" in ei.value.traceback


def test_ping(sb: Sandbox) -> None:
    pong = sb.ping()
    assert pong.eval_available is True
    assert pong.sandbox_id == sb.id


def test_connect_attaches(sb: Sandbox, ctl: Controller) -> None:
    other = Sandbox.connect(sb.id, controller=ctl)
    assert other.info.id == sb.id
    assert other.commands.run("echo attached").stdout == "attached\n"


def test_get_sandbox_shows_the_vmm_jail(sb: Sandbox, ctl: Controller) -> None:
    jail = ctl.get_sandbox(sb.id).jail
    assert jail is not None
    assert jail.seccomp == "filter" and jail.seccomp_filtered_threads == jail.threads > 1
    assert jail.no_capabilities and jail.no_new_privs
    if os.geteuid() == 0:
        # A root daemon's VMM: a uid of its own and namespaces of its own (its root,
        # pivoted inside its mount namespace, reads "/"; daemon_secrets.rs looks in it).
        assert jail.uid != 0 and jail.gid != 0
        assert {"mnt", "pid", "ipc", "uts", "net"} <= set(jail.own_namespaces), jail.own_namespaces
    assert all(s.jail is None for s in ctl.list_sandboxes())


# --- disk snapshots -----------------------------------------------------------------------


def test_disk_snapshot_then_list(sb: Sandbox) -> None:
    # Random bytes from the host (the guest kernel's /dev/urandom is emulated here: seconds
    # per 100 KiB), synced to the disk. A generous timeout: this test is about the snapshot.
    # The daemon also takes one of every sandbox every minute, so one may land between the
    # write and ours: then ours writes little, and the check is that the two together hold
    # the new bytes (random, so no chunk of them is shared with what was there).
    before = sb.disk_snapshot()
    sb.files.write("/root/disk-snap", os.urandom(262144))
    assert sb.commands.run("sync", timeout=180).exit_code == 0
    r = sb.disk_snapshot()
    assert r.sandbox_id == sb.id and r.seq > before.seq and not r.unchanged, (before, r)
    if r.seq == before.seq + 1:
        assert r.written_bytes >= 262144 and r.new_layers >= 1, r
    assert r.stored_bytes - before.stored_bytes >= 262144 // 2, (before, r)
    snaps = sb.disk_snapshots()
    assert snaps and snaps[-1].seq == r.seq, snaps
    data = snaps[-1].disks[0]
    assert data.id == "forkvm-data" and data.blocks >= 64 and data.base_key.startswith("blake3:"), data
    info = sb.refresh()
    assert info.last_disk_snapshot is not None and info.last_disk_snapshot.seq == r.seq
    assert info.last_disk_snapshot.error is None


# --- fork and branch ----------------------------------------------------------------------


def test_fork_children_share_parent_state_not_each_other(sb: Sandbox) -> None:
    assert sb.eval("x = 41") is None
    kids = sb.fork(2)
    try:
        assert len(kids) == 2 and kids[0].id != kids[1].id and sb.id not in (kids[0].id, kids[1].id)
        assert [k.eval("x") for k in kids] == ["41", "41"]
        kids[0].eval("x = 100")
        assert kids[0].eval("x") == "100"
        assert kids[1].eval("x") == "41"
        assert sb.eval("x") == "41"
        assert kids[0].info.forked_from == sb.id
    finally:
        for k in kids:
            k.kill()


def test_the_readmes_agent_example_keeps_the_best_of_ten_forks(daemon: Daemon, ctl: Controller, py: str) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from best_of_ten import best_of_ten

    before = {s.id for s in ctl.list_sandboxes()}
    best, scores = best_of_ten(py, base_url=daemon.url)
    try:
        assert len(scores) == 10 and len(set(scores)) == 10, scores  # each fork its own entropy
        assert scores == sorted(scores)
        assert best.ping().eval_available
    finally:
        best.kill()
    assert {s.id for s in ctl.list_sandboxes()} == before, "the example kills what it does not keep"


def test_branch_live_then_spawn_sees_state(sb: Sandbox, ctl: Controller) -> None:
    sb.eval("y = 'branched'")
    snap = sb.branch(mode="live")
    assert snap.status == "ready" and snap.mode == "live" and snap.bootable
    assert snap.tag in [s.tag for s in ctl.list_snapshots()]
    with Sandbox.create(snap.tag, controller=ctl) as child:
        assert child.id != sb.id
        assert child.eval("y") == "'branched'"
    assert sb.commands.run("echo still").stdout == "still\n"
    ctl.delete_snapshot(snap.tag)
    assert snap.tag not in [s.tag for s in ctl.list_snapshots()]


def test_diff_branch_chain_round_trip(ctl: Controller, tmp_path: Path) -> None:
    """A diff branch stores what changed since the snapshot the sandbox came from; a
    sandbox spawned from it sees the state; the chain shows in info, guards its parent
    on delete, and travels as a pack. Its own base tag, so `py` stays as it is."""
    base = ctl.create_snapshot("chain-base", "python", timeout=TEMPLATE_TIMEOUT_S).tag
    try:
        with Sandbox.create(base, controller=ctl) as s:
            s.eval("z = 'diffed'")
            with pytest.raises(BadRequest):
                s.branch(mode="diff", wait=False)
            with pytest.raises(BadRequest) as ei:
                s.branch(mode="diff", parent_tag="py")
            assert "chain-base" in ei.value.message
            snap = s.branch(tag="chain-d1", mode="diff", parent_tag=base)
            assert (snap.tag, snap.mode, snap.status, snap.bootable) == ("chain-d1", "diff", "ready", True)
            assert snap.pause_ms is not None and snap.pause_ms > 0
            assert s.eval("z") == "'diffed'", "the source runs on"
        info = ctl.snapshot_info("chain-d1")
        assert (info.parent_tag, info.chain_depth, info.ancestors) == (base, 1, [base])
        assert (info.memory_format, info.bootable) == ("chunked", True)
        base_info = ctl.snapshot_info(base)
        assert base_info.dependents == ["chain-d1"] and base_info.content_hash == info.parent_content_hash
        assert info.memory_physical_bytes < base_info.memory_physical_bytes, "a diff stores less than its base"
        with Sandbox.create("chain-d1", controller=ctl) as child:
            assert child.eval("z") == "'diffed'"

        flat = ctl.compact_snapshot("chain-d1", "chain-flat")
        assert (flat.branched_from, ctl.snapshot_info("chain-flat").chain_depth) == ("compact:chain-d1", 0)
        ctl.delete_snapshot("chain-flat")

        pack = tmp_path / "chain.tar.zst"
        assert ctl.pack_snapshot("chain-d1", pack) == pack.stat().st_size > 0
        with pytest.raises(Conflict) as ci:
            ctl.delete_snapshot(base)
        assert ci.value.state == "has_dependents" and "chain-d1" in ci.value.message
        ctl.delete_snapshot(base, cascade=True)
        assert not {base, "chain-d1"} & {x.tag for x in ctl.list_snapshots()}
        r = ctl.unpack_snapshot(pack)
        assert (r.head, r.imported, r.reused) == ("chain-d1", [base, "chain-d1"], [])
        with Sandbox.create("chain-d1", controller=ctl) as again:
            assert again.eval("z") == "'diffed'"
    finally:
        try:
            ctl.delete_snapshot(base, cascade=True)
        except NotFound:
            pass


# --- the daemon's remote -------------------------------------------------------------------


def test_a_tag_pushed_by_one_daemon_is_pulled_and_spawned_by_another(daemon: Daemon, ctl: Controller, py: str) -> None:
    """`py` goes to the session daemon's remote (a directory, through the object-store
    client); a second daemon with its own store and the same key pulls it and spawns
    from it; the tag is removed and its blocks collected. No request names a URL."""
    info = ctl.remote_info()
    assert info.url == f"file://{daemon.root}/remote" and py not in info.tags
    pushed = ctl.push_tag(py, timeout=600)
    assert pushed.tag == py and pushed.blocks_uploaded > 0, pushed
    assert pushed.blocks_uploaded + pushed.blocks_repeated == pushed.blocks, pushed
    again = ctl.push_tag(py, timeout=600)
    assert (again.blocks_uploaded, again.blocks_present) == (0, pushed.blocks_uploaded), "only what the remote lacks travels"
    assert py in ctl.remote_info().tags and ctl.remote_locks() == []
    with pytest.raises(NotFound):
        ctl.push_tag("no-such-tag")
    with pytest.raises(BadRequest):
        ctl.pull_tag("../py")
    with pytest.raises(BadRequest):
        ctl.break_remote_lock("../tags/py")

    other_args = ["--remote", f"file://{daemon.root}/remote", "--remote-key", "{root}/remote.key"]
    with serving(other_args, files={"remote.key": REMOTE_KEY}, env_extra={"FORKVM_REMOTE_CACHE": "{root}/blocks"}) as other:
        with Controller(other.url, timeout=120) as c2:
            assert py not in {s.tag for s in c2.list_snapshots()}
            pulled = c2.pull_tag(py, timeout=600)
            assert pulled.imported == [py] and pulled.blocks == pushed.blocks and pulled.blocks_fetched > 0, pulled
            assert c2.snapshot_info(py).bootable
            with Sandbox.create(py, controller=c2) as s:
                assert s.eval("6 * 7") == "42"
            assert c2.pull_tag(py).imported == [], "pulled again: nothing new"

    dry = ctl.collect_remote(min_age_s=0, dry_run=True)
    assert (dry.blocks_deleted, dry.blocks_referenced) == (0, pushed.blocks_uploaded), "every block is named"
    ctl.remove_remote_tag(py)
    with pytest.raises(NotFound):
        ctl.remove_remote_tag(py)
    gc = ctl.collect_remote(min_age_s=0)
    assert (gc.dry_run, gc.blocks_deleted, gc.tags) == (False, pushed.blocks_uploaded, 0), gc
    assert ctl.remote_info().tags == []


# --- errors ---------------------------------------------------------------------------------


def test_unknown_sandbox_is_not_found(ctl: Controller) -> None:
    with pytest.raises(NotFound) as ei:
        ctl.get_sandbox("nope")
    e = ei.value
    assert (e.status, e.code) == (404, "not_found")
    assert e.message and e.message in str(e)


@pytest.mark.parametrize("bad", ["..", "../sandboxes", "a/b", "%2E%2E"])
def test_ids_cannot_traverse(ctl: Controller, bad: str) -> None:
    with pytest.raises((NotFound, BadRequest)):
        ctl.get_sandbox(bad)


def test_tags_cannot_traverse(ctl: Controller, py: str) -> None:
    with pytest.raises((NotFound, BadRequest)):
        ctl.snapshot_info(f"x/../{py}")


def test_spawn_unknown_tag_is_not_found(ctl: Controller) -> None:
    with pytest.raises(NotFound):
        ctl.spawn_sandboxes("no-such-tag")


def test_bad_tag_is_bad_request(ctl: Controller) -> None:
    with pytest.raises(BadRequest) as ei:
        ctl.create_snapshot("../x", "python")
    assert ei.value.message


def test_duplicate_snapshot_is_conflict(ctl: Controller, py: str) -> None:
    with pytest.raises(Conflict):
        ctl.create_snapshot(py, "python", timeout=TEMPLATE_TIMEOUT_S)


def test_a_network_policy_is_checked_kept_and_inherited(ctl: Controller, py: str) -> None:
    # The daemon under test has no uplink (FORKVM_UPLINK=none: no sandbox leaves its
    # namespace), so a policy is kept but has nothing to act on: a change is refused
    # as `no_network`, and nothing is recorded. Enforcement is tested with a fake
    # internet in crates/forkvm/tests/daemon_network.rs.
    with pytest.raises(BadRequest) as ei:
        Sandbox.create(py, controller=ctl, network={"deny": ["10.0.0.1/8"]})
    assert "network.deny" in str(ei.value)
    policy = forkvm.NetworkPolicy(allow_internet=False, allow=["pypi.org"])
    s = Sandbox.create(py, controller=ctl, network=policy)
    try:
        assert s.network.policy == policy and ctl.get_sandbox(s.id).network == policy
        (child,) = s.fork()
        assert child.info.network == policy, "a fork keeps its source's policy"
        child.kill()
        with pytest.raises(Conflict) as ce:
            s.network.update(allow_internet=True)
        assert ce.value.state == "no_network"
        assert ctl.get_sandbox(s.id).network == policy
    finally:
        s.kill()


def test_a_tags_network_policy_is_what_its_spawns_take_unless_they_ask(ctl: Controller, py: str) -> None:
    with pytest.raises(BadRequest) as ei:
        ctl.create_snapshot("py-bad-policy", "python", network={"allow": ["10.0.0.1/8"]})
    assert "default network policy" in ei.value.message and "network.allow" in ei.value.message
    assert "py-bad-policy" not in [s.tag for s in ctl.list_snapshots()], "refused before anything is written"
    closed = forkvm.NetworkPolicy(allow_internet=False, allow=["pypi.org"])
    tag = ctl.create_snapshot("py-closed", "python", network=closed, timeout=TEMPLATE_TIMEOUT_S)
    asked = forkvm.NetworkPolicy(deny=["evil.test"])
    made = []
    try:
        assert tag.default_network == closed
        assert [s.default_network for s in ctl.list_snapshots() if s.tag in (py, tag.tag)] == [None, closed]
        made.append(Sandbox.create(tag.tag, controller=ctl))
        made.append(Sandbox.create(tag.tag, controller=ctl, network=asked))
        assert [s.info.network for s in made] == [closed, asked]
        assert ctl.get_sandbox(made[0].id).network == closed
    finally:
        for s in made:
            s.kill()
        ctl.delete_snapshot(tag.tag)


#: Started in a sandbox's warm interpreter: answers GET with ``MARK:path`` (MARK is a
#: global of that interpreter, so a fork can change its own).
PORT_SERVER = """
import http.server, threading
MARK = "parent"
class _H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{MARK}:{self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
_srv = http.server.ThreadingHTTPServer(("0.0.0.0", 8000), _H)
threading.Thread(target=_srv.serve_forever, daemon=True).start()
"""


def test_exposed_ports_reach_the_guest_under_their_own_tokens(ctl: Controller, py: str) -> None:
    s = Sandbox.create(py, controller=ctl)
    child = None
    try:
        s.eval(PORT_SERVER)
        port = s.expose(8000)
        assert port.path == f"/v1/sandboxes/{s.id}/ports/8000/" and port.token.startswith("fvp_")
        assert s.expose(8000).token == port.token and s.ports() == [port]
        r = s.fetch(8000, "/hi?q=1")
        assert (r.status_code, r.text) == (200, "parent:/hi?q=1")
        # A fork serves the port under a token of its own; neither routes to the other.
        (child,) = s.fork()
        child.eval("MARK = 'child'")
        [child_port] = child.ports()
        assert child_port.port == 8000 and child_port.token != port.token
        assert child.fetch(8000, "/x").text == "child:/x"
        assert s.fetch(8000, "/x").text == "parent:/x"
        stolen = forkvm.ExposedPort(port=8000, path=child_port.path, token=port.token, created_at_unix_ms=0)
        with pytest.raises(forkvm.Forbidden):
            ctl.port_request(stolen)
        # Raw TCP, and a port nothing listens on.
        with ctl.connect_tcp(s.id, 8000) as raw:
            raw.sendall(b"GET /raw HTTP/1.0\r\n\r\n")
            got = b""
            while chunk := raw.recv(4096):
                got += chunk
        assert got.endswith(b"parent:/raw"), got
        with pytest.raises(forkvm.BadGateway):
            ctl.connect_tcp(s.id, 8999)
        s.unexpose(8000)
        with pytest.raises(NotFound):
            ctl.port_request(port)
        assert s.ports() == []
    finally:
        if child is not None:
            child.kill()
        s.kill()


def test_vcpus_are_the_snapshots_and_checked(ctl: Controller, py: str) -> None:
    with pytest.raises(BadRequest) as ei:
        ctl.create_snapshot("tiny-zero", "tiny", vcpus=0)
    assert "1 to 16 vCPUs" in ei.value.message
    assert [s.vcpus for s in ctl.list_snapshots() if s.tag == py] == [1]
    # A sandbox keeps its snapshot's vCPUs: asking for another count is refused.
    with pytest.raises(BadRequest) as ei:
        ctl.spawn_sandboxes(py, vcpus=2)
    assert "1 vCPU(s), not 2" in ei.value.message
    tag = ctl.create_snapshot("tiny-two", "tiny", vcpus=2, timeout=TEMPLATE_TIMEOUT_S)
    assert tag.vcpus == 2
    (info,) = ctl.spawn_sandboxes("tiny-two", vcpus=2)
    try:
        assert info.vcpus == 2
        assert info.cpu_limit_millis in (None, 3000), "the default CPU: one per vCPU and one for the VMM"
        assert Sandbox.connect(info.id, controller=ctl).commands.run("nproc").stdout.strip() == "2"
    finally:
        ctl.kill_sandbox(info.id)
    ctl.delete_snapshot("tiny-two")


def test_kill_then_get_is_not_found(ctl: Controller, py: str) -> None:
    s = Sandbox.create(py, controller=ctl)
    assert ctl.get_sandbox(s.id).state == "running"
    s.kill()
    s.kill()
    with pytest.raises(NotFound):
        ctl.get_sandbox(s.id)
    with pytest.raises(NotFound):
        ctl.kill_sandbox(s.id)
    assert s.id not in [x.id for x in ctl.list_sandboxes()]


def test_a_volume_keeps_a_killed_writers_files_for_the_next_sandbox(ctl: Controller, py: str) -> None:
    vol = ctl.create_volume("sdk-vol", size_mib=32)
    assert (vol.name, vol.size_bytes, vol.layers, vol.writer) == ("sdk-vol", 32 << 20, 0, None)
    with pytest.raises(Conflict):
        ctl.create_volume("sdk-vol")
    with pytest.raises(BadRequest):
        ctl.create_volume("../x")
    with pytest.raises(BadRequest):
        ctl.spawn_sandboxes(py, 2, volumes=["sdk-vol:/data"])
    with pytest.raises(NotFound):
        ctl.spawn_sandboxes(py, volumes=["nope:/data"])
    [w] = ctl.spawn_sandboxes(py, volumes=[{"name": "sdk-vol", "mount": "/data"}])
    try:
        assert ctl.get_volume("sdk-vol").writer == w.id
        with pytest.raises(Conflict):
            ctl.spawn_sandboxes(py, volumes=["sdk-vol:/data"])
        r = ctl.exec_command(w.id, ["sh", "-c", "echo kept > /data/f"])
        assert r.exit_code == 0, r
    finally:
        ctl.kill_sandbox(w.id)
    after = ctl.get_volume("sdk-vol")
    assert after.writer is None and after.layers >= 1, after
    [r] = ctl.spawn_sandboxes(py, volumes=["sdk-vol:/data:ro"])
    try:
        assert ctl.get_volume("sdk-vol").readers == [r.id]
        assert ctl.exec_command(r.id, ["cat", "/data/f"]).stdout == "kept\n"
        assert ctl.exec_command(r.id, ["sh", "-c", "echo x > /data/g"]).exit_code != 0
        with pytest.raises(Conflict):
            ctl.delete_volume("sdk-vol")
        copy = ctl.snapshot_volume("sdk-vol", "sdk-vol-2")
        assert (copy.snapshot_of, copy.layers) == ("sdk-vol", after.layers)
    finally:
        ctl.kill_sandbox(r.id)
    assert {v.name for v in ctl.list_volumes()} >= {"sdk-vol", "sdk-vol-2"}
    ctl.delete_volume("sdk-vol")
    ctl.delete_volume("sdk-vol-2")
    with pytest.raises(NotFound):
        ctl.get_volume("sdk-vol")


def test_a_dockerfile_builds_in_sandboxes_and_rebuilds_only_what_changed(
    ctl: Controller, py: str, tmp_path: Path
) -> None:
    ctx = tmp_path / "ctx"
    (ctx / "app").mkdir(parents=True)
    (ctx / "app" / "main.py").write_text("print(6 * 7)\n")
    (ctx / "Dockerfile").write_text(
        f"FROM {py}\nARG N=1\nCOPY app/ /srv/\n"
        "RUN python3 /srv/main.py > /srv/out && echo n$N >> /srv/out\nWORKDIR /srv\nENV GREETING=hi\n"
    )
    built = ctl.build_template(ctx, "sdk-built", build_args={"N": "2"})
    assert (built.ran, built.cached, built.finish_cached, built.replaced) == (2, 0, False, False), built
    assert (built.workdir, built.env, built.base) == ("/srv", ["GREETING=hi"], py)
    [s] = ctl.spawn_sandboxes("sdk-built")
    try:
        r = ctl.exec_command(s.id, ["sh", "-c", "pwd; cat out; echo $GREETING"])
        assert r.stdout == "/srv\n42\nn2\nhi\n", r
    finally:
        ctl.kill_sandbox(s.id)
    again = ctl.build_template(ctx, "sdk-built", build_args={"N": "2"})
    assert (again.ran, again.cached, again.finish_cached, again.replaced) == (0, 2, True, True), again
    (ctx / "Dockerfile.bad").write_text(f"FROM {py}\nVOLUME /x\n")
    with pytest.raises(BadRequest, match="line 2: VOLUME"):
        ctl.build_template(ctx, "sdk-built", dockerfile="Dockerfile.bad")
    with pytest.raises(Conflict):
        ctl.build_template(ctx, py)

    # Two stages through the daemon: the copy's source sandbox comes from its spawner too.
    (ctx / "Dockerfile.staged").write_text(
        f"FROM {py} AS b\nRUN mkdir -p /o && echo staged > /o/f\nFROM {py}\nCOPY --from=b /o/f /srv/f\n"
    )
    staged = ctl.build_template(ctx, "sdk-staged", dockerfile="Dockerfile.staged")
    assert (staged.ran, staged.cached) == (2, 0), staged
    [s] = ctl.spawn_sandboxes("sdk-staged")
    try:
        assert ctl.exec_command(s.id, ["cat", "/srv/f"]).stdout == "staged\n"
    finally:
        ctl.kill_sandbox(s.id)
    # The build stage's step is under no tag: a prune takes it, and nothing under a tag.
    stage_step, copy_step = (st["snapshot"] for st in staged.steps)
    dry = ctl.prune_builds(dry_run=True)
    assert stage_step in dry.removed and copy_step not in dry.removed and dry.dry_run, dry
    assert stage_step in {x.tag for x in ctl.list_snapshots()}, "a dry run removes nothing"
    done = ctl.prune_builds()
    assert (done.removed, done.dry_run) == (dry.removed, False) and done.freed_bytes > 0, done
    left = {x.tag for x in ctl.list_snapshots()}
    assert stage_step not in left and {copy_step, "sdk-staged", "sdk-built"} <= left


def test_archive_then_restore_keeps_files_and_delete_removes_it(ctl: Controller, py: str) -> None:
    s = Sandbox.create(py, controller=ctl)
    try:
        s.files.write("/root/kept.txt", "still here\n")
        report = s.archive()
        assert (report.sandbox_id, report.reason) == (s.id, "api")
        assert s.info.state == "archived" and s.info.pid is None
        assert s.id in [x.id for x in ctl.list_sandboxes() if x.state == "archived"]
        with pytest.raises(Conflict) as ei:
            s.commands.run("true")
        assert ei.value.state == "archived"
        info = s.restore()
        assert (info.id, info.state) == (s.id, "running")
        assert s.files.read_text("/root/kept.txt") == "still here\n"
        with pytest.raises(Conflict):
            ctl.restore(s.id)
        s.archive()
    finally:
        s.kill()
    with pytest.raises(NotFound):
        ctl.get_sandbox(s.id)


# --- templates from OCI images --------------------------------------------------------


def _docker_save(path: Path, marker: str) -> Path:
    """A one-layer `docker save` archive: busybox, `sh`, a user, `marker` in a file."""
    import hashlib
    import io
    import json
    import tarfile

    def add(t: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        t.addfile(info, io.BytesIO(data))

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        with open("/bin/busybox", "rb") as f:
            add(t, "bin/busybox", f.read(), 0o755)
        link = tarfile.TarInfo("bin/sh")
        link.type, link.linkname = tarfile.SYMTYPE, "busybox"
        t.addfile(link)
        add(t, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        add(t, "etc/marker", marker.encode())
    layer_bytes = layer.getvalue()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": []},
            "config": {"Env": ["PATH=/bin"], "Cmd": ["sh"]},
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = hashlib.sha256(layer_bytes).hexdigest() + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": ["t:1"], "Layers": [layer_name]}]).encode()
    with tarfile.open(path, "w") as t:
        add(t, config_name, config)
        add(t, layer_name, layer_bytes)
        add(t, "manifest.json", manifest)
    return path


@pytest.mark.skipif(not os.path.exists("/bin/busybox"), reason="needs busybox-static at /bin/busybox")
def test_an_oci_archive_becomes_a_template_and_refusals_name_the_reason(tmp_path: Path) -> None:
    """A daemon of its own, so the templates it writes stay in its temp directory."""
    with serving(env_extra={"FORKVM_TEMPLATES": "{root}/templates"}) as d, Controller(d.url, timeout=300) as c:
        archive = _docker_save(tmp_path / "app.tar", "python sdk")
        t = c.import_oci_template(archive, "sdk-oci")
        assert (t.template, t.layers, t.command, t.snapshot_seconds) == ("sdk-oci", 1, ["sh"], None)
        assert t.manifest.startswith("sha256:") and t.image_bytes > 0 and t.new_bytes > 0
        assert [e["type"] for e in t.events] == ["imported", "built", "done"]
        text = (Path(d.root) / "templates" / "sdk-oci.toml").read_text()
        assert f'base = "oci:{t.manifest}"' in text
        # The same image again: every blob is in the store already.
        again = c.import_oci_template(archive, "sdk-oci", force=True)
        assert (again.manifest, again.new_bytes, again.shared_bytes) == (t.manifest, 0, t.new_bytes)
        with pytest.raises(Conflict, match="exists already"):
            c.import_oci_template(archive, "sdk-oci")
        with pytest.raises(Conflict, match="built-in"):
            c.import_oci_template(archive, "tiny")
        junk = tmp_path / "junk.tar"
        junk.write_bytes(b"not an image")
        with pytest.raises(BadRequest, match="not a usable image"):
            c.import_oci_template(junk, "sdk-junk")
        assert not (Path(d.root) / "templates" / "sdk-junk.toml").exists()
