"""Acceptance tests for checkpoints and rewind: a real daemon, real python sandboxes.

A python sandbox is checkpointed by the daemon after each of 20 evals, each changing a
variable and a file; rewinding it (in place, same id) to a checkpoint chosen at random
gives exactly that step's variable and file, ten times over, and a fork from a
checkpoint starts there too. Skipped, with the reason, only when the binary is missing.
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Iterator

import pytest

from daemon_proc import FORKVM_BIN, Daemon, serving

from forkvm import BadRequest, CheckpointPolicy, Conflict, Controller, NotFound, Sandbox

if os.environ.get("FORKVM_SDK_REQUIRE_DAEMON") == "1" and not os.path.exists(FORKVM_BIN):
    raise RuntimeError(f"FORKVM_BIN={FORKVM_BIN} does not exist, and FORKVM_SDK_REQUIRE_DAEMON=1")

pytestmark = pytest.mark.skipif(
    not os.path.exists(FORKVM_BIN),
    reason=f"FORKVM_BIN={FORKVM_BIN} does not exist: build it with `cargo build -p forkvm` or set FORKVM_BIN",
)

STEPS = 20
REWINDS = 10


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with serving() as d:
        yield d


@pytest.fixture(scope="module")
def ctl(daemon: Daemon) -> Iterator[Controller]:
    with Controller(daemon.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def py(ctl: Controller) -> str:
    snap = ctl.create_snapshot("py", "python", timeout=900)
    assert snap.status == "ready"
    return snap.tag


def _state(s: Sandbox) -> tuple:
    """The step the sandbox's interpreter and disk say it is at."""
    return (int(s.eval("x")), s.files.read_text("/root/step.txt"))


def test_rewinding_to_any_checkpoint_gives_that_steps_variable_and_file(
    daemon: Daemon, ctl: Controller, py: str
) -> None:
    s = Sandbox.create(py, controller=ctl, checkpoints=CheckpointPolicy(after_exec=True, keep=STEPS + 5))
    try:
        assert s.checkpoints.policy() == CheckpointPolicy(every_seconds=None, after_exec=True, keep=STEPS + 5)
        for k in range(1, STEPS + 1):
            s.eval(f"x = {k}; open('/root/step.txt', 'w').write('step {k}')")
        kept = s.checkpoints.list()
        assert [c.seq for c in kept] == list(range(1, STEPS + 1))
        assert all(c.trigger == "exec" and c.tag == f"ckpt-{s.id}-{c.seq}" for c in kept)
        # Their memory chunks are sealed with the sandbox's key (the chain tests check
        # the chunks themselves), so rewinding below reads them back through it.
        for c in kept:
            with open(os.path.join(daemon.root, "store", "snapshots", c.tag, "snapshot.json")) as f:
                assert json.load(f).get("memory_sealed_by") == s.id, c.tag
        assert kept[4].note == "eval: x = 5; open('/root/step.txt', 'w').write('step 5')", "what ran before it"
        pauses = sorted(c.pause_ms for c in kept)
        print(f"\ncheckpoint pause p50 {pauses[len(pauses) // 2]:.1f} ms, max {pauses[-1]:.1f} ms; "
              f"bytes stored p50 {sorted(c.bytes_stored for c in kept)[len(kept) // 2] // 1024} KiB")
        s.checkpoints.set_policy(after_exec=False, keep=STEPS + 5)

        rng = random.Random(int(os.environ.get("FORKVM_TEST_SEED", "29")))
        took = []
        for k in rng.sample(range(1, STEPS + 1), REWINDS):
            report = s.checkpoints.rewind(k)
            took.append(report.total_ms)
            assert (report.sandbox_id, report.checkpoint.seq) == (s.id, k)
            assert _state(s) == (k, f"step {k}"), f"after a rewind to checkpoint {k}"
            assert s.info.state == "running" and s.info.id == s.id
            # What it does after a rewind is its own again.
            s.eval("x = -1")
        print(f"rewind p50 {sorted(took)[len(took) // 2]:.0f} ms over {len(took)}")

        # By age: the newest at least that old.
        newest = kept[-1]
        age = (time.time() * 1000 - newest.created_at_unix_ms) / 1000
        assert s.checkpoints.rewind(ago_seconds=max(age - 60, 0)).checkpoint.seq == STEPS

        # Children from a checkpoint start there; the sandbox runs on where it was.
        s.eval("x = 99")
        children = s.checkpoints.fork(7, n=2)
        try:
            for c in children:
                assert _state(c) == (7, "step 7")
            assert int(s.eval("x")) == 99
            # Purging the sandbox would shred the key the children's checkpoint is sealed
            # with: refused while they run, and nothing is lost.
            with pytest.raises(Conflict, match="in use by"):
                ctl.kill_sandbox(s.id, purge=True)
            assert int(s.eval("x")) == 99
            # A fork of a running sandbox has no base to diff over: refused, saying so.
            forked = s.fork()[0]
            try:
                with pytest.raises(BadRequest, match="not spawned from a tagged snapshot"):
                    forked.checkpoints.set_policy(after_exec=True)
                with pytest.raises(BadRequest, match="not spawned from a tagged snapshot"):
                    forked.checkpoints.create()
            finally:
                forked.kill()
        finally:
            for c in children:
                c.kill()

        with pytest.raises(NotFound, match="kept: 1, 2"):
            s.checkpoints.rewind(STEPS + 1)
        with pytest.raises(BadRequest, match="exactly one"):
            ctl.rewind(s.id, seq=1, ago_seconds=1)
        with pytest.raises(BadRequest, match="keep"):
            s.checkpoints.set_policy(keep=0)
        with pytest.raises(BadRequest, match="every_seconds"):
            s.checkpoints.set_policy(every_seconds=0)
        with pytest.raises(BadRequest, match="note"):
            s.checkpoints.create("x" * 2000)
        with pytest.raises(BadRequest, match="checkpoints: keep"):
            ctl.spawn_sandboxes(py, checkpoints=CheckpointPolicy(keep=999))
        with pytest.raises(BadRequest, match="max_stored_mib"):
            s.checkpoints.set_policy(max_stored_mib=0)

        # A lower bound thins them at once, oldest first: at most 1 MiB of what they
        # added stays, and the newest always does.
        s.checkpoints.set_policy(keep=STEPS + 5, max_stored_mib=1)
        left = s.checkpoints.list()
        assert left and left[-1].seq == STEPS and len(left) < STEPS, [c.seq for c in left]
        assert len(left) == 1 or sum(c.bytes_stored for c in left) <= 1 << 20, left
        assert [c.seq for c in left] == list(range(left[0].seq, STEPS + 1)), "the oldest went first"

        # A command run collected and one streamed are checkpointed after too.
        s.checkpoints.set_policy(after_exec=True)
        s.commands.run("echo collected > /root/c.txt")
        seen: list = []
        s.commands.run("echo streamed > /root/s.txt", on_stdout=seen.append)
        notes = [c.note for c in s.checkpoints.list()[-2:]]
        assert notes == ["exec: echo collected > /root/c.txt", "exec: echo streamed > /root/s.txt"], notes
    finally:
        s.kill()
    # Its checkpoints go with it.
    with pytest.raises(NotFound):
        ctl.list_checkpoints(s.id)
    assert not [t for t in ctl.list_snapshots() if t.tag.startswith(f"ckpt-{s.id}-")]


def test_a_timer_keeps_the_newest_checkpoints_and_an_idle_sandbox_stores_almost_nothing(
    ctl: Controller, py: str
) -> None:
    s = Sandbox.create(py, controller=ctl)
    try:
        first = s.checkpoints.create(note="before the timer")
        assert (first.seq, first.trigger, first.note) == (1, "api", "before the timer")
        s.checkpoints.set_policy(every_seconds=1, keep=3)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and max(c.seq for c in s.checkpoints.list()) < 6:
            time.sleep(0.5)
        s.checkpoints.set_policy(keep=3)
        kept = s.checkpoints.list()
        assert len(kept) == 3 and kept[-1].seq >= 6, kept
        assert all(c.trigger == "interval" for c in kept)
        idle = [c.bytes_stored for c in kept]
        print(f"\nidle checkpoints stored {[b // 1024 for b in idle]} KiB")
        assert max(idle) < 4 << 20, f"an idle sandbox's checkpoint stored {max(idle)} bytes"
        tags = {t.tag for t in ctl.list_snapshots()}
        assert f"ckpt-{s.id}-1" not in tags, "the oldest past keep is removed"
        assert {c.tag for c in kept} <= tags

        # A time window instead of a count: what is kept is recent.
        s.checkpoints.set_policy(every_seconds=1, keep=32, max_age_seconds=2)
        start = max(c.seq for c in s.checkpoints.list())
        while time.monotonic() < deadline and max(c.seq for c in s.checkpoints.list()) < start + 4:
            time.sleep(0.5)
        s.checkpoints.set_policy(keep=32, max_age_seconds=2)
        window = s.checkpoints.list()
        newest = window[-1].created_at_unix_ms
        assert window[-1].seq >= start + 4, [c.seq for c in window]
        assert all(newest - c.created_at_unix_ms <= 2000 + 1500 for c in window), [
            (c.seq, newest - c.created_at_unix_ms) for c in window
        ]
    finally:
        s.kill()
