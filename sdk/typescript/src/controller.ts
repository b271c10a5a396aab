/**
 * `Controller`: one method per route of forkvmd's REST API (the route table is
 * `crates/forkvm-api/src/routes.rs`; a test checks every route has its method), over a
 * Unix socket (the daemon's default) or TCP with a bearer token and TLS. Requests and
 * replies are the types generated from docs/openapi.json. Streams stay streams: exec
 * output is an async iterator of events, file and pack bodies are web streams.
 */

import { createHash } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { Duplex } from "node:stream";
import { fetch, upgrade, type Agent } from "undici";
import { ConnectionFailed, ForkvmError, ProtocolError, errorFromResponse } from "./errors.js";
import { ndjson } from "./ndjson.js";
import { ProcessSocket } from "./attach.js";
import {
  type Endpoint,
  type TlsOptions,
  describeEndpoint,
  makeDispatcher,
  quoteSegment,
  resolveEndpoint,
  resolveToken,
} from "./transport.js";
import type * as T from "./types.js";

export interface ControllerOptions {
  /** `unix:/path`, `http://host:port` or `https://host:port`; default `$FORKVM_DAEMON`, else the default socket. */
  baseUrl?: string;
  /** Bearer token for TCP; default `$FORKVM_TOKEN`. */
  token?: string;
  /** Milliseconds a call may take (exec gets its own timeout plus 30 s); default 120000. */
  timeoutMs?: number;
  tls?: TlsOptions;
}

/** An exec request without the sandbox: exactly one of `args` (argv) and `cmd` (a shell command). */
export type ExecOptions = Omit<T.ExecRequest, "args" | "cmd"> & ({ args: string[]; cmd?: never } | { cmd: string; args?: never });

/** What a body may be: bytes, text, a web stream or a Node stream. */
export type BodyLike = Uint8Array | string | ReadableStream<Uint8Array> | NodeJS.ReadableStream;

/** Seconds added to a command's own timeout before the request gives up. */
const EXEC_GRACE_MS = 30_000;
/** A watch has no end of its own: the longest a fetch signal allows (24 days). */
const WATCH_MAX_MS = 2_147_483_647;

const sb = (id: string, ...rest: string[]) => ["/v1/sandboxes", quoteSegment(id), ...rest].join("/");
const snap = (tag: string, ...rest: string[]) => ["/v1/snapshots", quoteSegment(tag), ...rest].join("/");
const ws = (name: string, ...rest: string[]) => ["/v1/workspaces", quoteSegment(name), ...rest].join("/");
const vol = (name: string, ...rest: string[]) => ["/v1/volumes", quoteSegment(name), ...rest].join("/");

interface Call {
  json?: unknown;
  body?: BodyLike;
  query?: Record<string, string | number | boolean | undefined>;
  timeoutMs?: number;
  headers?: Record<string, string>;
}

/** The SHA-256 of bytes or text (a stream's is not known before it is read). */
function sha256Of(b: BodyLike): string | undefined {
  if (typeof b === "string" || b instanceof Uint8Array) return createHash("sha256").update(b).digest("hex");
  return undefined;
}

function toBody(b: BodyLike): { body: unknown; duplex?: "half" } {
  if (typeof b === "string" || b instanceof Uint8Array) return { body: b };
  if (b instanceof ReadableStream) return { body: b, duplex: "half" };
  return { body: Readable.toWeb(Readable.from(b as AsyncIterable<Uint8Array>)), duplex: "half" };
}

export class Controller {
  readonly endpoint: Endpoint;
  readonly timeoutMs: number;
  readonly #token?: string;
  readonly #dispatcher: Agent;
  readonly #tls: TlsOptions;

  constructor(opts: ControllerOptions = {}) {
    this.endpoint = resolveEndpoint(opts.baseUrl);
    this.#token = resolveToken(opts.token);
    this.timeoutMs = opts.timeoutMs ?? 120_000;
    this.#tls = opts.tls ?? {};
    this.#dispatcher = makeDispatcher(this.endpoint, this.#tls);
  }

  /** A Controller to the same daemon with its own connections. */
  clone(): Controller {
    return new Controller({ baseUrl: describeEndpoint(this.endpoint), token: this.#token ?? "", timeoutMs: this.timeoutMs, tls: this.#tls });
  }

  /** Closes the connections (the daemon and its sandboxes are not touched). */
  async close(): Promise<void> {
    await this.#dispatcher.close();
  }

  toString(): string {
    return `Controller(${describeEndpoint(this.endpoint)})`;
  }

  // --- plumbing ---------------------------------------------------------------------

  async #request(method: string, path: string, call: Call = {}): Promise<Response> {
    const url = new URL(this.endpoint.baseUrl + path);
    for (const [k, v] of Object.entries(call.query ?? {})) {
      if (v !== undefined) url.searchParams.set(k, String(v));
    }
    const headers: Record<string, string> = { ...call.headers };
    if (this.#token) headers.authorization = `Bearer ${this.#token}`;
    let init: { body?: unknown; duplex?: "half" } = {};
    if (call.json !== undefined) {
      headers["content-type"] = "application/json";
      init = { body: JSON.stringify(call.json) };
    } else if (call.body !== undefined) {
      headers["content-type"] ??= "application/octet-stream";
      init = toBody(call.body);
    }
    let resp: Response;
    try {
      resp = (await fetch(url, {
        method,
        headers,
        ...init,
        dispatcher: this.#dispatcher,
        signal: AbortSignal.timeout(call.timeoutMs ?? this.timeoutMs),
      } as Parameters<typeof fetch>[1])) as unknown as Response;
    } catch (e) {
      const why = e instanceof Error ? `${e.name}: ${e.message}${e.cause instanceof Error ? ` (${e.cause.message})` : ""}` : String(e);
      throw new ConnectionFailed(
        `cannot talk to forkvmd at ${describeEndpoint(this.endpoint)} (${method} ${path}): ${why}. Is \`forkvm daemon\` running there?`,
        { url: url.toString() },
        { cause: e },
      );
    }
    if (resp.status >= 300) throw errorFromResponse(resp.status, await resp.text(), url.toString());
    return resp;
  }

  async #json<R>(method: string, path: string, call: Call = {}): Promise<R> {
    const resp = await this.#request(method, path, call);
    const text = await resp.text();
    try {
      return JSON.parse(text) as R;
    } catch {
      throw new ProtocolError(`expected JSON from ${method} ${path}, got ${JSON.stringify(text.slice(0, 200))}`, { status: resp.status });
    }
  }

  async #none(method: string, path: string, call: Call = {}): Promise<void> {
    const resp = await this.#request(method, path, call);
    await resp.arrayBuffer();
  }

  // --- daemon -----------------------------------------------------------------------

  /** `GET /healthz`. */
  async health(): Promise<boolean> {
    return (await this.#json<T.Health>("GET", "/healthz")).ok === true;
  }

  /** `GET /version`. */
  version(): Promise<T.VersionInfo> {
    return this.#json("GET", "/version");
  }

  /** `GET /metrics`: Prometheus text. */
  async metrics(): Promise<string> {
    return (await this.#request("GET", "/metrics")).text();
  }

  // --- snapshots --------------------------------------------------------------------

  /** `GET /v1/snapshots`. */
  listSnapshots(): Promise<T.SnapshotInfo[]> {
    return this.#json("GET", "/v1/snapshots");
  }

  /** `POST /v1/snapshots`: tag `req.tag` from template `req.template` (its first build takes minutes). */
  createSnapshot(req: T.CreateSnapshotRequest, timeoutMs = 1_800_000): Promise<T.SnapshotInfo> {
    return this.#json("POST", "/v1/snapshots", { json: req, timeoutMs });
  }

  /** `DELETE /v1/snapshots/{tag}`; `cascade` removes what depends on it, `force` ignores that. */
  deleteSnapshot(tag: string, opts: { cascade?: boolean; force?: boolean } = {}): Promise<void> {
    return this.#none("DELETE", snap(tag), { query: { cascade: opts.cascade || undefined, force: opts.force || undefined } });
  }

  /** `GET /v1/snapshots/{tag}/info`. */
  snapshotInfo(tag: string): Promise<T.SnapshotInfoDetail> {
    return this.#json("GET", snap(tag, "info"));
  }

  /** `POST /v1/snapshots/{tag}/compact`: the chain flattened into `to`. */
  compactSnapshot(tag: string, to: string): Promise<T.SnapshotInfo> {
    return this.#json("POST", snap(tag, "compact"), { json: { to } satisfies T.CompactSnapshotRequest });
  }

  /** `GET /v1/snapshots/{tag}/pack`: the chain as one `.tar.zst`, streamed. */
  async packSnapshot(tag: string, timeoutMs = 1_800_000): Promise<ReadableStream<Uint8Array>> {
    const resp = await this.#request("GET", snap(tag, "pack"), { timeoutMs });
    if (!resp.body) throw new ProtocolError(`the pack of ${tag} has no body`);
    return resp.body as ReadableStream<Uint8Array>;
  }

  /** `packSnapshot` into the file `path`; the bytes written. */
  async packSnapshotToFile(tag: string, path: string, timeoutMs?: number): Promise<number> {
    const body = await this.packSnapshot(tag, timeoutMs);
    let n = 0;
    const counted = Readable.fromWeb(body as import("node:stream/web").ReadableStream<Uint8Array>).on("data", (c: Buffer) => {
      n += c.length;
    });
    await pipeline(counted, createWriteStream(path));
    return n;
  }

  /** `POST /v1/snapshots/unpack`: a pack (bytes, a stream, or `{ path }` of a file) into the store. */
  unpackSnapshot(pack: BodyLike | { path: string }, timeoutMs = 1_800_000): Promise<T.UnpackResponse> {
    const body = typeof pack === "object" && pack !== null && "path" in pack ? createReadStream(pack.path) : (pack as BodyLike);
    return this.#json("POST", "/v1/snapshots/unpack", { body, timeoutMs, headers: { "content-type": "application/zstd" } });
  }

  // --- templates --------------------------------------------------------------------

  /**
   * `POST /v1/templates/oci`: makes the template `q.name` from an image archive (an OCI
   * archive or a `docker save`, gzip-compressed or not; bytes, a stream, or `{ path }`,
   * streamed). The daemon imports it before answering (not an image: `BadRequest`; a
   * built-in name or one taken without `force`: `Conflict`), then the build's progress
   * comes as events: `imported`, `built`, `snapshot` (when asked), `done` or `error` last.
   */
  async *importOciTemplate(
    image: BodyLike | { path: string },
    q: T.ImportOciQuery,
    timeoutMs = 3_600_000,
  ): AsyncGenerator<T.TemplateImportEvent> {
    for await (const e of this.#tarUpload("/v1/templates/oci", image, { ...q }, timeoutMs, "template import")) {
      yield e as T.TemplateImportEvent;
    }
  }

  /** `POST /v1/templates/prune`: removes the build cache's step snapshots nothing needs (or lists them: `dry_run`). */
  pruneBuilds(req: T.PruneBuildsRequest = {}): Promise<T.PruneBuildsReport> {
    return this.#json("POST", "/v1/templates/prune", { json: req });
  }

  /**
   * `POST /v1/templates/build`: builds a Dockerfile into the tag `q.tag`, every step in a
   * sandbox on the daemon (docs/dockerfile.md). `context` is the build context as a tar
   * archive (gzip-compressed or not; bytes, a stream, or `{ path }`, streamed) with the
   * Dockerfile in it. A Dockerfile that does not check out is a `BadRequest`, a tag no
   * build made a `Conflict` (without `replace`), before any event; then the progress
   * comes as events: `planned`, `base`, `step`, `output`, `step_done`, `finished`, then
   * `done` (with the report) or `error` last.
   */
  async *buildTemplate(
    context: BodyLike | { path: string },
    q: T.BuildTemplateQuery,
    timeoutMs = 3_600_000,
  ): AsyncGenerator<T.TemplateBuildEvent> {
    for await (const e of this.#tarUpload("/v1/templates/build", context, { ...q }, timeoutMs, "template build")) {
      yield e as T.TemplateBuildEvent;
    }
  }

  /** A tar archive (bytes, a stream, or `{ path }`, streamed) posted to `path`; the NDJSON lines of the reply. */
  async *#tarUpload(
    path: string,
    src: BodyLike | { path: string },
    query: Call["query"],
    timeoutMs: number,
    what: string,
  ): AsyncGenerator<unknown> {
    const body = typeof src === "object" && src !== null && "path" in src ? createReadStream(src.path) : (src as BodyLike);
    const resp = await this.#request("POST", path, { body, query, timeoutMs, headers: { "content-type": "application/x-tar" } });
    if (!resp.body) throw new ProtocolError(`the ${what} has no body`);
    yield* ndjson(resp.body as ReadableStream<Uint8Array>);
  }

  // --- sandboxes --------------------------------------------------------------------

  /** `GET /v1/sandboxes`. */
  listSandboxes(): Promise<T.SandboxInfo[]> {
    return this.#json("GET", "/v1/sandboxes");
  }

  /** `POST /v1/sandboxes`: `req.n` (1) sandboxes from `req.snapshot_tag`, each ready when this returns. */
  spawnSandboxes(req: T.CreateSandboxRequest): Promise<T.SandboxInfo[]> {
    return this.#json("POST", "/v1/sandboxes", { json: req });
  }

  /** `GET /v1/sandboxes/{id}`. */
  getSandbox(id: string): Promise<T.SandboxInfo> {
    return this.#json("GET", sb(id));
  }

  /** `DELETE /v1/sandboxes/{id}`; `purge` also destroys its disk snapshots. */
  killSandbox(id: string, opts: { purge?: boolean } = {}): Promise<void> {
    return this.#none("DELETE", sb(id), { query: { purge: opts.purge || undefined } });
  }

  /** `GET /v1/sandboxes/{id}/console`: the end of its serial console log as text (the
   * daemon's default 64 KiB unless `bytes`, at most 1 MiB). */
  async console(id: string, opts: { bytes?: number } = {}): Promise<string> {
    return (await this.#request("GET", sb(id, "console"), { query: { bytes: opts.bytes } })).text();
  }

  /** `GET /v1/sandboxes/{id}/usage`: what its VMM uses of the host now (memory, cumulative CPU time). */
  sandboxUsage(id: string): Promise<T.SandboxUsage> {
    return this.#json("GET", sb(id, "usage"));
  }

  /** `GET /v1/lineage`: every sandbox and snapshot, and who came from what. */
  lineage(): Promise<T.Lineage> {
    return this.#json("GET", "/v1/lineage");
  }

  /** `POST /v1/sandboxes/{id}/ping`. */
  pingSandbox(id: string): Promise<T.Pong> {
    return this.#json("POST", sb(id, "ping"));
  }

  /** `POST /v1/sandboxes/{id}/exec`: runs and waits; a non-zero exit is a result, not an error. */
  execCommand(id: string, req: ExecOptions): Promise<T.ExecResponse> {
    const timeoutMs = Math.max(this.timeoutMs, (req.timeout_secs ?? 30) * 1000 + EXEC_GRACE_MS);
    return this.#json("POST", sb(id, "exec"), { json: req, timeoutMs });
  }

  /**
   * `POST /v1/sandboxes/{id}/exec/stream`: the events as they come (`stdout`/`stderr`
   * chunks, then one `exit` or `error`).
   */
  async *execStream(id: string, req: ExecOptions): AsyncGenerator<T.ExecEvent> {
    const timeoutMs = Math.max(this.timeoutMs, (req.timeout_secs ?? 30) * 1000 + EXEC_GRACE_MS);
    const resp = await this.#request("POST", sb(id, "exec", "stream"), { json: req, timeoutMs });
    if (!resp.body) throw new ProtocolError("the exec stream has no body");
    for await (const event of ndjson(resp.body as ReadableStream<Uint8Array>)) yield event as T.ExecEvent;
  }

  /** `POST /v1/sandboxes/{id}/eval`: does not throw when the code raised (see `error`). */
  evalCode(id: string, code: string): Promise<T.EvalResponse> {
    return this.#json("POST", sb(id, "eval"), { json: { code } satisfies T.EvalRequest });
  }

  /** `POST /v1/sandboxes/{id}/branch`: a snapshot of the running sandbox (full, live or diff). */
  branchSandbox(id: string, req: T.BranchSandboxRequest = {}): Promise<T.SnapshotInfo> {
    return this.#json("POST", sb(id, "branch"), { json: req });
  }

  /** `POST /v1/sandboxes/{id}/fork`: `req.n` running copies (memory and all), no disk. */
  forkSandbox(id: string, req: T.ForkSandboxRequest = {}): Promise<T.SandboxInfo[]> {
    return this.#json("POST", sb(id, "fork"), { json: req });
  }

  // --- files ------------------------------------------------------------------------

  /** `GET /v1/sandboxes/{id}/files`: the file's bytes. */
  async readFile(id: string, path: string): Promise<Uint8Array> {
    return new Uint8Array(await (await this.#request("GET", sb(id, "files"), { query: { path } })).arrayBuffer());
  }

  /** `GET /v1/sandboxes/{id}/files`, streamed. */
  async readFileStream(id: string, path: string): Promise<ReadableStream<Uint8Array>> {
    const resp = await this.#request("GET", sb(id, "files"), { query: { path } });
    if (!resp.body) throw new ProtocolError(`reading ${path}: no body`);
    return resp.body as ReadableStream<Uint8Array>;
  }

  /**
   * `PUT /v1/sandboxes/{id}/files`: writes `data` (bytes, text or a stream) to `path`. The
   * SHA-256 of bytes or text is computed here and checked by the daemon before the file is
   * replaced; give `sha256` for a stream whose digest you know.
   */
  writeFile(id: string, path: string, data: BodyLike, opts: { mode?: number; createParents?: boolean; sha256?: string } = {}): Promise<T.FileWritten> {
    const query = { path, mode: opts.mode?.toString(), create_parents: opts.createParents || undefined, sha256: opts.sha256 ?? sha256Of(data) };
    return this.#json("PUT", sb(id, "files"), { body: data, query });
  }

  /** `GET /v1/sandboxes/{id}/files/sha256`: a file's size and SHA-256, computed in the guest (to check a download against). */
  fileChecksum(id: string, path: string): Promise<T.FileChecksum> {
    return this.#json("GET", sb(id, "files", "sha256"), { query: { path } });
  }

  /** `GET /v1/sandboxes/{id}/files/tar`: a tar archive of the guest directory `path`, streamed. */
  async readTar(id: string, path: string): Promise<ReadableStream<Uint8Array>> {
    const resp = await this.#request("GET", sb(id, "files", "tar"), { query: { path }, timeoutMs: WATCH_MAX_MS });
    if (!resp.body) throw new ProtocolError(`reading ${path} as a tar archive: no body`);
    return resp.body as ReadableStream<Uint8Array>;
  }

  /** `PUT /v1/sandboxes/{id}/files/tar`: the tar archive `data` unpacked into the guest directory `path` (checked by its SHA-256 as `writeFile`). */
  writeTar(id: string, path: string, data: BodyLike, opts: { sha256?: string } = {}): Promise<T.FileWritten> {
    const query = { path, sha256: opts.sha256 ?? sha256Of(data) };
    return this.#json("PUT", sb(id, "files", "tar"), { body: data, query, headers: { "content-type": "application/x-tar" } });
  }

  /** `DELETE /v1/sandboxes/{id}/files`. */
  removeFile(id: string, path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    return this.#none("DELETE", sb(id, "files"), { query: { path, recursive: opts.recursive || undefined } });
  }

  /** `GET /v1/sandboxes/{id}/files/list`. */
  listFiles(id: string, path: string): Promise<T.FileEntry[]> {
    return this.#json("GET", sb(id, "files", "list"), { query: { path } });
  }

  /**
   * `GET /v1/sandboxes/{id}/files/watch`: the changes below the directory `path` as they
   * happen. The first event is `armed`: every change made after it is reported. Then
   * `change` events, a `keepalive` after 5 s without one, and `end` or `error` last.
   * Stopping the iteration (`break`) closes the connection, which ends the watch.
   */
  async *watchFiles(id: string, path: string, opts: { recursive?: boolean } = {}): AsyncGenerator<T.WatchEvent> {
    const query = { path, recursive: opts.recursive || undefined };
    const resp = await this.#request("GET", sb(id, "files", "watch"), { query, timeoutMs: WATCH_MAX_MS });
    if (!resp.body) throw new ProtocolError(`watching ${path}: no body`);
    for await (const event of ndjson(resp.body as ReadableStream<Uint8Array>)) yield event as T.WatchEvent;
  }

  // --- background processes ---------------------------------------------------------

  /** `GET /v1/sandboxes/{id}/processes`: running and ended, oldest pid first. */
  listProcesses(id: string): Promise<T.ProcessInfo[]> {
    return this.#json("GET", sb(id, "processes"));
  }

  /**
   * `POST /v1/sandboxes/{id}/processes`: `args` (or the shell line `cmd`) in the
   * background, its output kept to read from any offset; resolves once it runs.
   */
  startProcess(id: string, req: T.StartProcessRequest): Promise<T.ProcessInfo> {
    return this.#json("POST", sb(id, "processes"), { json: req });
  }

  /**
   * `GET /v1/sandboxes/{id}/processes/{pid}/output`: its output from `offset` (the
   * oldest byte kept by default) as `from`, `output` (base64 `data`) and `keepalive`
   * events, `end` (or `error`) last; with `follow`, until the process ends. Stopping
   * the iteration detaches; the process runs on.
   */
  async *processOutput(id: string, pid: number, opts: { offset?: number; follow?: boolean } = {}): AsyncGenerator<T.ProcessOutputEvent> {
    const query = { offset: opts.offset?.toString(), follow: opts.follow || undefined };
    const resp = await this.#request("GET", sb(id, "processes", String(pid), "output"), { query, timeoutMs: WATCH_MAX_MS });
    if (!resp.body) throw new ProtocolError(`reading process ${pid}: no body`);
    for await (const event of ndjson(resp.body as ReadableStream<Uint8Array>)) yield event as T.ProcessOutputEvent;
  }

  /** `POST /v1/sandboxes/{id}/processes/{pid}/input`: `data` to its stdin (`close`: then its end). */
  processInput(id: string, pid: number, data: BodyLike, opts: { close?: boolean } = {}): Promise<T.ProcessInputWritten> {
    return this.#json("POST", sb(id, "processes", String(pid), "input"), { body: data, query: { close: opts.close || undefined } });
  }

  /** `POST /v1/sandboxes/{id}/processes/{pid}/signal`: to its process group. */
  signalProcess(id: string, pid: number, signal = 15): Promise<void> {
    return this.#none("POST", sb(id, "processes", String(pid), "signal"), { json: { signal } });
  }

  /** `POST /v1/sandboxes/{id}/processes/{pid}/resize`: its terminal's new size. */
  resizeProcess(id: string, pid: number, size: T.TerminalSize): Promise<void> {
    return this.#none("POST", sb(id, "processes", String(pid), "resize"), { json: size });
  }

  /**
   * `GET /v1/sandboxes/{id}/processes/{pid}/attach`, a WebSocket: its output from `offset`
   * (the oldest byte kept by default) as it comes, its input and controls the other way.
   * `close()` detaches; the process runs on.
   */
  attachProcess(id: string, pid: number, opts: { offset?: number; timeoutMs?: number } = {}): Promise<ProcessSocket> {
    const base = this.endpoint.baseUrl.replace(/^http/, "ws");
    const query = opts.offset === undefined ? "" : `?offset=${Math.trunc(opts.offset)}`;
    return ProcessSocket.open(base + sb(id, "processes", String(pid), "attach") + query, this.#dispatcher, this.#token, opts.timeoutMs ?? 30_000);
  }

  // --- disks and lifecycle ----------------------------------------------------------

  /** `POST /v1/sandboxes/{id}/disk-snapshots`. */
  diskSnapshot(id: string, req: T.DiskSnapshotRequest = {}): Promise<T.DiskSnapshotReport> {
    return this.#json("POST", sb(id, "disk-snapshots"), { json: req });
  }

  /** `GET /v1/sandboxes/{id}/disk-snapshots`. */
  listDiskSnapshots(id: string): Promise<T.DiskSnapshotInfo[]> {
    return this.#json("GET", sb(id, "disk-snapshots"));
  }

  /** `POST /v1/sandboxes/{id}/archive`: to the store, its VMM stopped (reversible). */
  archiveSandbox(id: string): Promise<T.ArchiveReport> {
    return this.#json("POST", sb(id, "archive"));
  }

  /** `POST /v1/sandboxes/{id}/restore`: an archived sandbox runs again, same id. */
  restoreSandbox(id: string, req: T.RestoreRequest = {}): Promise<T.SandboxInfo> {
    return this.#json("POST", sb(id, "restore"), { json: req });
  }

  /** `GET /v1/sandboxes/{id}/checkpoints`: its checkpoints, oldest first, and its policy. */
  listCheckpoints(id: string): Promise<T.CheckpointList> {
    return this.#json("GET", sb(id, "checkpoints"));
  }

  /** `POST /v1/sandboxes/{id}/checkpoints`: its memory and disks now, as a snapshot tag of their own. */
  createCheckpoint(id: string, req: T.CreateCheckpointRequest = {}): Promise<T.CheckpointInfo> {
    return this.#json("POST", sb(id, "checkpoints"), { json: req });
  }

  /** `PUT /v1/sandboxes/{id}/checkpoints`: a checkpoint every `every_seconds` and/or after every exec/eval; `keep` kept. */
  setCheckpointPolicy(id: string, policy: T.CheckpointPolicy): Promise<T.CheckpointList> {
    return this.#json("PUT", sb(id, "checkpoints"), { json: policy });
  }

  /** `POST /v1/sandboxes/{id}/rewind`: the sandbox back at a checkpoint (`seq`, or the newest `ago_seconds` old), in place. */
  rewindSandbox(id: string, req: T.RewindRequest): Promise<T.RewindReport> {
    return this.#json("POST", sb(id, "rewind"), { json: req });
  }

  /** `POST /v1/sandboxes/{id}/disk-fork`: a new sandbox booted from one of its disk snapshots. */
  diskFork(id: string, req: T.DiskForkRequest = {}): Promise<T.SandboxInfo> {
    return this.#json("POST", sb(id, "disk-fork"), { json: req });
  }

  /** `POST /v1/sandboxes/{id}/ttl`: archive it `ttlSeconds` from now (0: never). */
  setTtl(id: string, ttlSeconds: number): Promise<T.SandboxInfo> {
    return this.#json("POST", sb(id, "ttl"), { json: { ttl_seconds: ttlSeconds } satisfies T.SetTtlRequest });
  }

  /** `PUT /v1/sandboxes/{id}/network`: where it may connect to. */
  setNetwork(id: string, policy: T.NetworkPolicy): Promise<T.SandboxInfo> {
    return this.#json("PUT", sb(id, "network"), { json: policy });
  }

  // --- ports ------------------------------------------------------------------------

  /** `GET /v1/sandboxes/{id}/ports`. */
  listPorts(id: string): Promise<T.ExposedPort[]> {
    return this.#json("GET", sb(id, "ports"));
  }

  /** `POST /v1/sandboxes/{id}/ports`: guest `port` reachable through the daemon under a token of its own. */
  exposePort(id: string, port: number, opts: { dpopJkt?: string } = {}): Promise<T.ExposedPort> {
    return this.#json("POST", sb(id, "ports"), { json: { port, dpop_jkt: opts.dpopJkt } satisfies T.ExposeRequest });
  }

  /** `DELETE /v1/sandboxes/{id}/ports/{port}`. */
  unexposePort(id: string, port: number): Promise<void> {
    return this.#none("DELETE", sb(id, "ports", String(port)));
  }

  /** `GET /v1/sandboxes/{id}/tcp/{port}` upgraded: a raw TCP stream to the guest's port. */
  async connectTcp(id: string, port: number, timeoutMs = 30_000): Promise<Duplex> {
    const url = this.endpoint.baseUrl + sb(id, "tcp", String(port));
    const headers: Record<string, string> = {};
    if (this.#token) headers.authorization = `Bearer ${this.#token}`;
    try {
      const { socket } = await upgrade(url, {
        dispatcher: this.#dispatcher,
        protocol: "tcp",
        headers,
        signal: AbortSignal.timeout(timeoutMs),
      });
      return socket;
    } catch (e) {
      if (e instanceof ForkvmError) throw e;
      const err = e as { statusCode?: number; body?: string; message?: string };
      if (typeof err.statusCode === "number") throw errorFromResponse(err.statusCode, err.body ?? "", url);
      throw new ConnectionFailed(`connecting to port ${port} of ${id}: ${err.message ?? String(e)}`, { url }, { cause: e });
    }
  }

  // --- workspaces (forkd's named sandboxes) -----------------------------------------

  /** `GET /v1/workspaces`. */
  listWorkspaces(): Promise<T.WorkspaceInfo[]> {
    return this.#json("GET", "/v1/workspaces");
  }

  /** `POST /v1/workspaces`: one sandbox from `req.snapshot_tag`, named `req.name`. */
  createWorkspace(req: T.CreateWorkspaceRequest): Promise<T.WorkspaceInfo> {
    return this.#json("POST", "/v1/workspaces", { json: req });
  }

  /** `GET /v1/workspaces/{name}`. */
  getWorkspace(name: string): Promise<T.WorkspaceInfo> {
    return this.#json("GET", ws(name));
  }

  /** `DELETE /v1/workspaces/{name}`: its sandbox too. */
  deleteWorkspace(name: string): Promise<void> {
    return this.#none("DELETE", ws(name));
  }

  /** `POST /v1/workspaces/{name}/suspend`: its sandbox archived. */
  suspendWorkspace(name: string): Promise<T.WorkspaceInfo> {
    return this.#json("POST", ws(name, "suspend"), { json: {} satisfies T.SuspendWorkspaceRequest });
  }

  /** `POST /v1/workspaces/{name}/resume`: the same sandbox restored. */
  resumeWorkspace(name: string): Promise<T.WorkspaceInfo> {
    return this.#json("POST", ws(name, "resume"));
  }

  // --- volumes: named ext4 disks that outlive sandboxes ---------------------------

  /** `GET /v1/volumes`. */
  listVolumes(): Promise<T.VolumeInfo[]> {
    return this.#json("GET", "/v1/volumes");
  }

  /** `POST /v1/volumes`: a blank ext4 volume (absent size: 4096 MiB, sparse). */
  createVolume(req: T.CreateVolumeRequest): Promise<T.VolumeInfo> {
    return this.#json("POST", "/v1/volumes", { json: req });
  }

  /** `GET /v1/volumes/{name}`. */
  getVolume(name: string): Promise<T.VolumeInfo> {
    return this.#json("GET", vol(name));
  }

  /** `DELETE /v1/volumes/{name}`: refused (409) while a sandbox has it attached. */
  deleteVolume(name: string): Promise<void> {
    return this.#none("DELETE", vol(name));
  }

  /** `POST /v1/volumes/{name}/snapshot`: a new volume `to` with its data as of now. */
  snapshotVolume(name: string, to: string): Promise<T.VolumeInfo> {
    return this.#json("POST", vol(name, "snapshot"), { json: { to } satisfies T.SnapshotVolumeRequest });
  }

  // --- the daemon's remote (`forkvm daemon --remote URL`): tags, never URLs ---------

  /** `GET /v1/remote`: the daemon's remote and the tags pushed there (409 without one). */
  remoteInfo(): Promise<T.RemoteInfo> {
    return this.#json("GET", "/v1/remote");
  }

  /** `POST /v1/remote/push`: the tag's chain, only the blocks the remote lacks. */
  pushTag(tag: string): Promise<T.PushReport> {
    return this.#json("POST", "/v1/remote/push", { json: { tag } satisfies T.PushRequest });
  }

  /** `POST /v1/remote/pull`: the links of the tag's chain the daemon's store lacks. */
  pullTag(tag: string): Promise<T.PullReport> {
    return this.#json("POST", "/v1/remote/pull", { json: { tag } satisfies T.PullRequest });
  }

  /** `DELETE /v1/remote/tags/{tag}`: the manifest; its blocks go at the next collection. */
  removeRemoteTag(tag: string): Promise<void> {
    return this.#none("DELETE", ["/v1/remote/tags", quoteSegment(tag)].join("/"));
  }

  /** `POST /v1/remote/gc`: deletes the blocks no tag names (absent `min_age_s`: a day). */
  collectRemote(req: T.CollectRequest = {}): Promise<T.GcReport> {
    return this.#json("POST", "/v1/remote/gc", { json: req });
  }

  /** `GET /v1/remote/locks`: who holds the remote's locks, oldest first. */
  remoteLocks(): Promise<T.LockInfo[]> {
    return this.#json("GET", "/v1/remote/locks");
  }

  /** `DELETE /v1/remote/locks/{name}`: removes a lock a dead holder left. */
  breakRemoteLock(name: string): Promise<T.LockInfo> {
    return this.#json("DELETE", ["/v1/remote/locks", quoteSegment(name)].join("/"));
  }
}
