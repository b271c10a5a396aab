// The SDK against a real daemon with real sandboxes (the python template's tag `py`):
// Sandbox's E2B-shaped calls, streaming exec, files as bytes and streams, eval, branch,
// fork, the README's agent example, TCP with a token, and the errors a user meets.
// Skipped, with the reason, only when the forkvm binary is missing (and then not
// under FORKVM_SDK_REQUIRE_DAEMON=1, as ./scripts/test runs it).
import { strict as assert } from "node:assert";
import { after, before, describe, it } from "node:test";
import { BadRequest, Controller, EvalError, NotFound, Sandbox, Unauthorized } from "../src/index.js";
import { bestOfTen } from "../examples/best_of_ten.js";
import { type Daemon, TOKEN, haveDaemonBinary, startDaemon } from "./daemon.js";

const TEMPLATE_TIMEOUT_MS = 900_000;

describe("against a real daemon", { skip: haveDaemonBinary() ? false : "no forkvm binary (cargo build -p forkvm)" }, () => {
  let daemon: Daemon;
  let ctl: Controller;
  let sb: Sandbox;

  before(async () => {
    daemon = await startDaemon();
    ctl = new Controller({ baseUrl: `unix:${daemon.socket}` });
    const snap = await ctl.createSnapshot({ tag: "py", template: "python" }, TEMPLATE_TIMEOUT_MS);
    assert.equal(snap.status, "ready");
    sb = await Sandbox.create("py", { controller: ctl });
  });

  after(async () => {
    await sb?.kill();
    await ctl?.close();
    await daemon?.stop();
  });

  it("runs commands collected and streamed", async () => {
    const r = await sb.commands.run("echo out; echo err >&2; exit 3");
    assert.deepEqual([r.stdout, r.stderr, r.exit_code, r.timed_out], ["out\n", "err\n", 3, false]);
    const seen: string[] = [];
    const s = await sb.commands.run(["sh", "-c", "for i in 1 2 3; do echo $i; done"], { onStdout: (c) => seen.push(c), env: { A: "b" } });
    assert.equal(s.exit_code, 0);
    assert.equal(seen.join(""), "1\n2\n3\n");
    assert.equal(s.stdout, "1\n2\n3\n");
    const events = [];
    for await (const ev of ctl.execStream(sb.id, { cmd: "echo $A", env: { A: "streamed" } })) events.push(ev);
    assert.deepEqual(events.map((e) => e.type), ["stdout", "exit"]);
    const missing = await sb.commands.run(["no-such-program"]);
    assert.equal(missing.exit_code, 127);
  });

  it("reads and writes files as bytes, text and streams", async () => {
    const bytes = new Uint8Array(300_000).map((_, i) => i % 251);
    assert.equal((await sb.files.write("/tmp/ts/a.bin", bytes)).bytes, bytes.length);
    assert.deepEqual(await sb.files.read("/tmp/ts/a.bin"), bytes);
    const streamed = new Blob([bytes]).stream();
    await sb.files.write("/tmp/ts/b.bin", streamed);
    const back = new Uint8Array(await new Response(await sb.files.readStream("/tmp/ts/b.bin")).arrayBuffer());
    assert.deepEqual(back, bytes);
    await sb.files.write("/tmp/ts/t.txt", "héllo");
    assert.equal(await sb.files.readText("/tmp/ts/t.txt"), "héllo");
    assert.deepEqual((await sb.files.list("/tmp/ts")).map((e) => e.name).sort(), ["a.bin", "b.bin", "t.txt"]);
    await sb.files.remove("/tmp/ts", { recursive: true });
    await assert.rejects(sb.files.read("/tmp/ts/t.txt"), NotFound);
  });

  it("watches a directory: armed first, then exactly its changes in order", async () => {
    await sb.files.write("/tmp/tsw/keep", "");
    const watch = sb.files.watch("/tmp/tsw");
    const first = await watch.next();
    assert.deepEqual(first.value, { type: "armed", directories: 1 });
    await sb.commands.run("cd /tmp/tsw && : > n && echo x >> n && rm n keep");
    const changes: string[] = [];
    for await (const ev of watch) {
      if (ev.type === "change") changes.push(`${ev.kind} ${ev.path}`);
      if (changes.length === 4) break;
    }
    assert.deepEqual(changes, ["create n", "write n", "remove n", "remove keep"]);
    await assert.rejects(async () => { for await (const _ of sb.files.watch("/tmp/no-such-dir")) void _; }, NotFound);
  });

  it("drives a terminal over a WebSocket: resized, typed into, attached again, its exit delivered", async () => {
    const term = await ctl.startProcess(sb.id, { cmd: "sh", pty: { rows: 24, cols: 80 }, env: { TERM: "xterm" } });
    const readUntil = async (sock: Awaited<ReturnType<Controller["attachProcess"]>>, wanted: string): Promise<string> => {
      let seen = "";
      for await (const chunk of sock) {
        seen += new TextDecoder().decode(chunk.data);
        if (seen.includes(wanted)) return seen;
      }
      throw new Error(`the process ended before ${JSON.stringify(wanted)}: ${seen}`);
    };
    const first = await ctl.attachProcess(sb.id, term.pid);
    first.resize(40, 100);
    first.send("stty size; echo mark-$((6*7))\r");
    assert.match(await readUntil(first, "mark-42"), /40 100/);
    first.close();
    const again = await ctl.attachProcess(sb.id, term.pid, { offset: first.offset });
    again.send("echo back-$((1+1)); exit 5\r");
    await readUntil(again, "back-2");
    for await (const _ of again) void _;
    assert.equal(again.process?.exit?.exit_code, 5);
    await assert.rejects(ctl.attachProcess(sb.id, 999_999));
    // The Sandbox's handles: a background command waited for, a terminal through `pty`.
    const bg = await sb.commands.run("sleep 1; exit 4", { background: true });
    assert.ok((await sb.commands.list()).some((p) => p.pid === bg.pid));
    assert.equal((await bg.wait()).exit?.exit_code, 4);
    const pty = await sb.pty.create({ rows: 30, cols: 90, cmd: "stty size" });
    const sock = await pty.attach({ offset: 0 });
    assert.match(await readUntil(sock, "30 90"), /30 90/);
    assert.equal((await pty.wait()).exit?.exit_code, 0);
  });

  it("checks files by their SHA-256 and moves directories as tar", async () => {
    const data = new TextEncoder().encode("checked\n");
    const w = await sb.files.write("/tmp/ts-tar/d/a.txt", data);
    const sum = await sb.files.checksum("/tmp/ts-tar/d/a.txt");
    assert.deepEqual([sum.size, sum.sha256], [data.length, w.sha256]);
    const chunks: Uint8Array[] = [];
    for await (const c of await sb.files.readDir("/tmp/ts-tar")) chunks.push(c);
    const tar = Buffer.concat(chunks);
    assert.ok(tar.includes("d/a.txt"), "the archive names its entries relative to the directory");
    const back = await sb.files.writeDir("/tmp/ts-tar2", tar);
    assert.equal(back.bytes, tar.length);
    assert.equal(await sb.files.readText("/tmp/ts-tar2/d/a.txt"), "checked\n");
    await assert.rejects(ctl.writeFile(sb.id, "/tmp/ts-tar/bad", "x", { sha256: "00".repeat(32) }), BadRequest);
  });

  it("evals in the warm interpreter and throws the guest's exception", async () => {
    assert.equal(await sb.eval("int(np.arange(4).sum())"), "6");
    await assert.rejects(sb.eval("1/0"), (e: unknown) => e instanceof EvalError && /ZeroDivisionError/.test(e.message) && /Traceback/.test(e.traceback));
  });

  it("branches, spawns from the branch, and forks", async () => {
    await sb.eval("marker = 41");
    const branch = await sb.branch({ tag: "ts-branch", mode: "live" });
    assert.equal(branch.tag, "ts-branch");
    assert.ok(Number.isInteger(branch.pause_ms) && (branch.pause_us ?? 0) > 0);
    const [child] = await ctl.spawnSandboxes({ snapshot_tag: "ts-branch" });
    const fromBranch = await Sandbox.connect(child!.id, { controller: ctl });
    assert.equal(await fromBranch.eval("marker + 1"), "42");
    await fromBranch.kill();
    const copies = await sb.fork(2);
    assert.equal(copies.length, 2);
    for (const c of copies) {
      assert.equal(await c.eval("marker"), "41");
      await c.kill();
      await c.kill(); // again: nothing
    }
  });

  it("checkpoints, rewinds in place and forks from a checkpoint", async () => {
    const s = await Sandbox.create("py", { controller: ctl });
    try {
      await s.eval("v = 'first'");
      await s.files.write("/root/ck.txt", "first");
      const first = await s.checkpoints.create("first");
      assert.deepEqual([first.seq, first.trigger, first.note], [1, "api", "first"]);
      await s.eval("v = 'second'");
      await s.files.write("/root/ck.txt", "second");
      const report = await s.checkpoints.rewind({ seq: 1 });
      assert.deepEqual([report.sandbox_id, report.checkpoint.tag], [s.id, first.tag]);
      assert.equal(await s.eval("v"), "'first'");
      assert.equal(await s.files.readText("/root/ck.txt"), "first");
      const [child] = await s.checkpoints.fork(1);
      assert.equal(await child!.files.readText("/root/ck.txt"), "first");
      await child!.kill();
      await assert.rejects(s.checkpoints.rewind({ seq: 9 }), NotFound);
      await assert.rejects(s.checkpoints.setPolicy({ keep: 0 }), BadRequest);
    } finally {
      await s.kill();
    }
  });

  it("runs the README's agent example: ten forks of a warmed parent, the best kept", async () => {
    const { best, scores } = await bestOfTen("py", { baseUrl: `unix:${daemon.socket}` });
    try {
      assert.equal(scores.length, 10);
      assert.equal(new Set(scores).size, 10, "every fork has its own entropy");
      assert.equal(scores[0], [...scores].sort()[0]);
      assert.ok((await best.ping()).eval_available);
    } finally {
      await best.kill();
    }
    const left = (await ctl.listSandboxes()).map((s) => s.id);
    assert.deepEqual(left, [sb.id], "the example kills what it does not keep");
  });

  it("talks TCP with the bearer token, and refuses without it", async () => {
    const tcp = new Controller({ baseUrl: daemon.tcp, token: TOKEN });
    assert.ok((await tcp.listSandboxes()).some((s) => s.id === sb.id));
    await tcp.close();
    const anonymous = new Controller({ baseUrl: daemon.tcp, token: "" });
    await assert.rejects(anonymous.listSandboxes(), Unauthorized);
    await anonymous.close();
  });

  it("says what was wrong", async () => {
    await assert.rejects(Sandbox.connect("nope", { controller: ctl }), (e: unknown) => e instanceof NotFound && /nope/.test(e.message));
    await assert.rejects(ctl.spawnSandboxes({ snapshot_tag: "py", n: 0 }), BadRequest);
    await assert.rejects(Sandbox.create("no-such-tag", { baseUrl: `unix:${daemon.socket}` }), NotFound);
  });
});
