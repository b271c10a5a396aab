// The SDK without a daemon: endpoint and token rules, path quoting, error mapping, the
// NDJSON decoder, and every route of routes.rs called through the Controller against a
// fake server that records what it was asked.
import { strict as assert } from "node:assert";
import { createServer, type IncomingMessage, type Server } from "node:http";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";
import {
  BadGateway,
  Conflict,
  ConnectionFailed,
  Controller,
  ForkvmError,
  NotFound,
  ServerError,
  Unauthorized,
  errorFromResponse,
  quoteSegment,
  resolveEndpoint,
  resolveToken,
} from "../src/index.js";
import { ndjson } from "../src/ndjson.js";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");

describe("transport", () => {
  it("finds the daemon as the daemon's own rules do", () => {
    assert.deepEqual(resolveEndpoint(undefined, { FORKVM_RUN: "/r" }), { baseUrl: "http://forkvmd", socketPath: "/r/forkvmd.sock" });
    assert.deepEqual(resolveEndpoint(undefined, { XDG_RUNTIME_DIR: "/x" }, 1000).socketPath, "/x/forkvm/forkvmd.sock");
    assert.equal(resolveEndpoint(undefined, {}, 0).socketPath, "/run/forkvm/forkvmd.sock");
    assert.equal(resolveEndpoint(undefined, {}, 1000).socketPath, "/tmp/forkvm-1000/forkvmd.sock");
    assert.equal(resolveEndpoint(undefined, { FORKVM_DAEMON: "unix:///s.sock" }).socketPath, "/s.sock");
    assert.deepEqual(resolveEndpoint("https://h:8889/", {}), { baseUrl: "https://h:8889" });
    assert.throws(() => resolveEndpoint("ftp://x", {}), /not a daemon address/);
    assert.throws(() => resolveEndpoint("unix:", {}), /names no socket path/);
    assert.equal(resolveToken(undefined, { FORKVM_TOKEN: "t" }), "t");
    assert.equal(resolveToken("", { FORKVM_TOKEN: "t" }), undefined);
  });

  it("keeps every id one path segment", () => {
    assert.equal(quoteSegment("a/b"), "a%2Fb");
    assert.equal(quoteSegment(".."), "%2E%2E");
    assert.equal(quoteSegment("py.v2"), "py.v2");
    assert.throws(() => quoteSegment(""), /must not be empty/);
  });
});

describe("errors", () => {
  it("maps each status to its class, keeping the server's words", () => {
    const e = errorFromResponse(409, '{"error":"tag \\"t\\" exists","code":"conflict","state":"exists"}', "u");
    assert.ok(e instanceof Conflict && e instanceof ForkvmError);
    assert.equal(e.state, "exists");
    assert.match(e.message, /tag "t" exists \(HTTP 409, conflict, state=exists\)/);
    assert.ok(errorFromResponse(404, '{"error":"x","code":"not_found"}') instanceof NotFound);
    assert.ok(errorFromResponse(401, "") instanceof Unauthorized);
    assert.ok(errorFromResponse(502, '{"error":"x","code":"bad_gateway"}') instanceof BadGateway);
    assert.ok(errorFromResponse(502, "<html>proxy</html>") instanceof ServerError, "a proxy's 502 is not the daemon's");
    assert.match(errorFromResponse(500, "").message, /empty body/);
  });
});

describe("ndjson", () => {
  it("parses lines cut anywhere, even inside a character", async () => {
    const bytes = new TextEncoder().encode('{"type":"stdout","data":"é"}\n\n{"type":"exit","exit_code":0}');
    async function* pieces() {
      for (let i = 0; i < bytes.length; i += 3) yield bytes.slice(i, i + 3);
    }
    const got = [];
    for await (const o of ndjson(pieces())) got.push(o);
    assert.deepEqual(got, [{ type: "stdout", data: "é" }, { type: "exit", exit_code: 0 }]);
    await assert.rejects(async () => {
      for await (const _ of ndjson((async function* () { yield new TextEncoder().encode("[1]\n"); })())) void _;
    }, /not a JSON object/);
  });
});

// --- every route ------------------------------------------------------------------------

const SNAP = { tag: "TAG", dir: "/d", created_at_unix: 1, branched_from: null, pause_ms: null, status: "ready", bootable: true,
  warning: null, template: null, mode: null, memory_logical_bytes: 0, memory_physical_bytes: 0, default_limits: null };
const SB = { id: "ID", snapshot_tag: "TAG", guest_addr: "", created_at_unix: 1 };
const CHECKPOINT = {
  sandbox_id: "ID",
  seq: 3,
  tag: "ckpt-ID-3",
  created_at_unix_ms: 7,
  trigger: "exec",
  note: "eval: x = 1",
  pause_ms: 3.5,
  pages: 12,
  bytes_stored: 8192,
  disk_bytes_stored: 4096,
  total_ms: 210,
};
const CHECKPOINTS = { sandbox_id: "ID", policy: { every_seconds: 5, after_exec: true, keep: 8 }, base_tag: "py", checkpoints: [CHECKPOINT] };
const WS = { id: "ws-ID", name: "NAME", source_snapshot_tag: "TAG", status: "running", created_at_unix: 1, last_active_unix: 1, sandbox_id: "ID" };
const VOL = { name: "data", size_bytes: 1, created_at_unix_ms: 2, layers: 0, stored_bytes: 3, writer: null, readers: [], snapshot_of: null };
const PROC = { pid: 7, argv: ["sleep", "9"], tag: null, pty: null, started_at_unix_ms: 1, output_end: 0, output_start: 0, stdin_open: true, running: true, exit: null };
const EXIT = '{"type":"exit","exit_code":0,"signal":null,"timed_out":false,"duration_ms":1}\n';

// route name in routes.rs -> [reply body, the call]
const CALLS: Record<string, [unknown, (c: Controller) => Promise<unknown>]> = {
  Health: [{ ok: true }, (c) => c.health()],
  Version: [{ version: "0.1.0", api: "v1" }, (c) => c.version()],
  Metrics: ["# text", (c) => c.metrics()],
  ListSnapshots: [[SNAP], (c) => c.listSnapshots()],
  CreateSnapshot: [SNAP, (c) => c.createSnapshot({ tag: "TAG", template: "python" })],
  DeleteSnapshot: [null, (c) => c.deleteSnapshot("TAG", { cascade: true })],
  SnapshotInfo: [{}, (c) => c.snapshotInfo("TAG")],
  CompactSnapshot: [SNAP, (c) => c.compactSnapshot("TAG", "flat")],
  PackSnapshot: ["pack", async (c) => new Response(await c.packSnapshot("TAG")).text()],
  UnpackSnapshot: [{}, (c) => c.unpackSnapshot(new Uint8Array([1, 2]))],
  ListSandboxes: [[SB], (c) => c.listSandboxes()],
  CreateSandboxes: [[SB], (c) => c.spawnSandboxes({ snapshot_tag: "TAG" })],
  GetSandbox: [SB, (c) => c.getSandbox("ID")],
  DeleteSandbox: [null, (c) => c.killSandbox("ID")],
  ReadConsole: ["[    0.000000] Linux", (c) => c.console("ID", { bytes: 100 })],
  Ping: [{}, (c) => c.pingSandbox("ID")],
  Exec: [{}, (c) => c.execCommand("ID", { args: ["true"] })],
  ExecStream: [EXIT, async (c) => { for await (const _ of c.execStream("ID", { cmd: "true" })) void _; }],
  Eval: [{ result: "1", error: null, exit_code: 0 }, (c) => c.evalCode("ID", "1")],
  Branch: [SNAP, (c) => c.branchSandbox("ID", { mode: "live" })],
  Fork: [[SB], (c) => c.forkSandbox("ID", { n: 2 })],
  ReadFile: ["x", (c) => c.readFile("ID", "/a")],
  WriteFile: [{ path: "/a", bytes: 1 }, (c) => c.writeFile("ID", "/a", "x")],
  RemoveFile: [null, (c) => c.removeFile("ID", "/a")],
  ListFiles: [[], (c) => c.listFiles("ID", "/")],
  WatchFiles: [{ type: "end", reason: "gone" }, async (c) => { for await (const _ of c.watchFiles("ID", "/")) void _; }],
  FileChecksum: [{ path: "/a", size: 1, sha256: "ab".repeat(32) }, (c) => c.fileChecksum("ID", "/a")],
  ReadTar: ["tar", async (c) => { for await (const _ of await c.readTar("ID", "/d")) void _; }],
  WriteTar: [{ path: "/d", bytes: 3, sha256: "ab".repeat(32) }, (c) => c.writeTar("ID", "/d", new Uint8Array([1, 2, 3]))],
  TakeDiskSnapshot: [{}, (c) => c.diskSnapshot("ID")],
  ListDiskSnapshots: [[], (c) => c.listDiskSnapshots("ID")],
  ArchiveSandbox: [{}, (c) => c.archiveSandbox("ID")],
  RestoreSandbox: [SB, (c) => c.restoreSandbox("ID")],
  ListCheckpoints: [CHECKPOINTS, (c) => c.listCheckpoints("ID")],
  CreateCheckpoint: [CHECKPOINT, (c) => c.createCheckpoint("ID", { note: "before rm -rf" })],
  SetCheckpointPolicy: [CHECKPOINTS, (c) => c.setCheckpointPolicy("ID", { every_seconds: 5, after_exec: true, keep: 8 })],
  RewindSandbox: [{ sandbox_id: "ID", checkpoint: CHECKPOINT, stop_ms: 4, total_ms: 180 }, (c) => c.rewindSandbox("ID", { seq: 3 })],
  DiskFork: [SB, (c) => c.diskFork("ID")],
  SetTtl: [SB, (c) => c.setTtl("ID", 5)],
  SetNetwork: [SB, (c) => c.setNetwork("ID", { allow_internet: false })],
  ListPorts: [[], (c) => c.listPorts("ID")],
  ExposePort: [{}, (c) => c.exposePort("ID", 8000)],
  UnexposePort: [null, (c) => c.unexposePort("ID", 8000)],
  ConnectTcp: [null, async (c) => (await c.connectTcp("ID", 8000)).destroy()],
  ListWorkspaces: [[WS], (c) => c.listWorkspaces()],
  CreateWorkspace: [WS, (c) => c.createWorkspace({ name: "NAME", snapshot_tag: "TAG" })],
  GetWorkspace: [WS, (c) => c.getWorkspace("NAME")],
  DeleteWorkspace: [null, (c) => c.deleteWorkspace("NAME")],
  SuspendWorkspace: [WS, (c) => c.suspendWorkspace("NAME")],
  ResumeWorkspace: [WS, (c) => c.resumeWorkspace("NAME")],
  ListProcesses: [[PROC], (c) => c.listProcesses("ID")],
  StartProcess: [PROC, (c) => c.startProcess("ID", { args: ["sleep", "9"] })],
  ProcessOutput: [{ type: "end", process: PROC }, async (c) => { for await (const _ of c.processOutput("ID", 7, { follow: true })) void _; }],
  ProcessInput: [{ bytes: 2 }, (c) => c.processInput("ID", 7, "hi", { close: true })],
  SignalProcess: [null, (c) => c.signalProcess("ID", 7, 9)],
  ResizeProcess: [null, (c) => c.resizeProcess("ID", 7, { rows: 24, cols: 80 })],
  SandboxUsage: [{ at_unix_ms: 1, memory_bytes: 2, memory_limit_bytes: null, cpu_usage_usec: 3, vcpus: 1 }, (c) => c.sandboxUsage("ID")],
  Lineage: [{ nodes: [], edges: [] }, (c) => c.lineage()],
  PruneBuilds: [{ removed: [], kept: 0, freed_bytes: 0, dry_run: true }, (c) => c.pruneBuilds({ dry_run: true })],
  // The fake answers the upgrade without a WebSocket's accept key: no socket is handed out.
  AttachProcess: [null, async (c) => { await assert.rejects(c.attachProcess("ID", 7, { offset: 3 }), ConnectionFailed); }],
  ListVolumes: [[VOL], (c) => c.listVolumes()],
  CreateVolume: [VOL, (c) => c.createVolume({ name: "data", size_mib: 64 })],
  GetVolume: [VOL, (c) => c.getVolume("NAME")],
  DeleteVolume: [null, (c) => c.deleteVolume("NAME")],
  SnapshotVolume: [VOL, (c) => c.snapshotVolume("NAME", "data2")],
  RemoteInfo: [{ url: "file:///r", tags: ["py"] }, (c) => c.remoteInfo()],
  PushTag: [{ tag: "py" }, (c) => c.pushTag("py")],
  PullTag: [{ tag: "py" }, (c) => c.pullTag("py")],
  RemoveRemoteTag: [null, (c) => c.removeRemoteTag("TAG")],
  CollectRemote: [{ dry_run: true }, (c) => c.collectRemote({ min_age_s: 0, dry_run: true })],
  ListRemoteLocks: [[], (c) => c.remoteLocks()],
  BreakRemoteLock: [{ name: "NAME" }, (c) => c.breakRemoteLock("NAME")],
  ImportOciTemplate: [{ type: "done", template: "app" }, async (c) => {
    for await (const _ of c.importOciTemplate(new Uint8Array([1, 2]), { name: "app", force: true })) void _;
  }],
  BuildTemplate: [{ type: "error", error: "x" }, async (c) => {
    for await (const _ of c.buildTemplate(new Uint8Array([1, 2]), { tag: "app", build_args: '{"V":"2"}' })) void _;
  }],
};

function routesRs(): [string, string, string][] {
  const text = readFileSync(path.join(REPO, "crates/forkvm-api/src/routes.rs"), "utf8");
  return [...text.matchAll(/r\("([A-Z]+)", "([^"]+)", RouteName::(\w+)\)/g)].map((m) => [m[1]!, m[2]!, m[3]!]);
}

describe("every route", () => {
  let server: Server;
  let dir: string;
  const seen: { method: string; url: string; auth?: string; body: string }[] = [];
  let reply: unknown = null;

  before(async () => {
    dir = mkdtempSync(path.join(tmpdir(), "fkts-unit-"));
    server = createServer((req: IncomingMessage, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        seen.push({ method: req.method!, url: req.url!, auth: req.headers.authorization, body: Buffer.concat(chunks).toString() });
        if (reply === null) {
          res.writeHead(204).end();
        } else if (typeof reply === "string") {
          res.writeHead(200, { "content-type": "application/octet-stream" }).end(reply);
        } else {
          res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(reply));
        }
      });
    });
    server.on("upgrade", (req, socket) => {
      seen.push({ method: req.method!, url: req.url!, auth: req.headers.authorization, body: "" });
      socket.end("HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: tcp\r\n\r\n");
    });
    await new Promise<void>((r) => server.listen(path.join(dir, "s.sock"), r));
  });

  after(async () => {
    await new Promise((r) => server.close(r));
    rmSync(dir, { recursive: true, force: true });
  });

  it("has a Controller method for each route of routes.rs, calling that method and path", async () => {
    const routes = routesRs();
    assert.ok(routes.length >= 40, `${routes.length} routes`);
    assert.deepEqual(new Set(routes.map((r) => r[2])), new Set(Object.keys(CALLS)), "routes.rs and the SDK's table differ");
    const c = new Controller({ baseUrl: `unix:${path.join(dir, "s.sock")}`, token: "tok" });
    try {
      for (const [method, template, name] of routes) {
        const [body, call] = CALLS[name]!;
        reply = body;
        seen.length = 0;
        await call(c);
        const want = template.replace("{id}", "ID").replace("{tag}", "TAG").replace("{name}", "NAME").replace("{port}", "8000").replace("{pid}", "7");
        assert.equal(seen.length, 1, `${name}: ${seen.length} requests`);
        const got = seen[0]!;
        assert.equal(`${got.method} ${got.url.split("?")[0]}`, `${method} ${want}`, name);
        assert.equal(got.auth, "Bearer tok", name);
        if (name === "WriteFile") {
          // The digest of "x", and no octal digits in a decimal field.
          assert.match(got.url, /sha256=2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881/);
        }
      }
      seen.length = 0;
      reply = { path: "/a", bytes: 1, sha256: "" };
      await c.writeFile("ID", "/a", "x", { mode: 0o644 });
      assert.match(seen[0]!.url, /mode=420(&|$)/, "mode goes in decimal, as the daemon reads it");
    } finally {
      await c.close();
    }
  });

  it("says where it looked when the daemon is not there", async () => {
    const c = new Controller({ baseUrl: `unix:${path.join(dir, "nothing.sock")}` });
    await assert.rejects(c.health(), (e: unknown) => e instanceof ConnectionFailed && /nothing\.sock/.test(e.message) && /forkvm daemon/.test(e.message));
    await c.close();
  });
});
