/**
 * `Sandbox`: one sandbox, E2B-shaped (`create`, `connect`, `commands.run`, `files`,
 * `kill`) with forkvm's verbs beside it (`eval`, `branch`, `fork`, `expose`).
 */

import { Controller, type ControllerOptions } from "./controller.js";
import { EvalError, ForkvmError, NotFound } from "./errors.js";
import { ProcessHandle, startRequest, type StartOptions } from "./process_handle.js";
import type * as T from "./types.js";

/** Called with each chunk of output text, in order. */
export type OutputCallback = (chunk: string) => void;

export interface RunOptions {
  /** Seconds before the command is killed (exit code 124, `timed_out`); default 30. */
  timeoutSecs?: number;
  env?: Record<string, string>;
  cwd?: string;
  /** Text given to its standard input. */
  stdin?: string;
  /** With either callback the output is streamed to it as it comes (and still collected). */
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
}

/** A finished command: its output, exit code and how it ended. */
export type CommandResult = T.ExecResponse;

export interface SandboxOptions extends ControllerOptions {
  /** A Controller to use (and not close); otherwise one is made from the options and owned. */
  controller?: Controller;
}

export type CreateOptions = SandboxOptions & Omit<T.CreateSandboxRequest, "snapshot_tag" | "n">;

/** The first line of an eval error that says what was raised. */
function headline(error: string, exitCode: number): string {
  const lines = error.trim().split("\n").filter((l) => l.trim());
  if (!lines.length) return `exit code ${exitCode}`;
  return (lines[0] ?? "").startsWith("Traceback") ? (lines[lines.length - 1] ?? "") : (lines[0] ?? "");
}

export class Commands {
  constructor(private readonly sb: Sandbox) {}

  /**
   * Runs `cmd` and waits: a string goes through `/bin/sh -c`, an array is argv. With
   * `background: true` it is started and left running: a `ProcessHandle` comes back.
   */
  run(cmd: string | string[], opts: StartOptions & { background: true }): Promise<ProcessHandle>;
  run(cmd: string | string[], opts?: RunOptions & { background?: false }): Promise<CommandResult>;
  async run(cmd: string | string[], opts: (RunOptions | StartOptions) & { background?: boolean } = {}): Promise<CommandResult | ProcessHandle> {
    if (opts.background) {
      const info = await this.sb.controller.startProcess(this.sb.id, startRequest(cmd, opts as StartOptions));
      return new ProcessHandle(this.sb.controller, this.sb.id, info);
    }
    return this.#wait(cmd, opts as RunOptions);
  }

  /** The background processes the sandbox keeps (running and ended). */
  async list(): Promise<T.ProcessInfo[]> {
    return this.sb.controller.listProcesses(this.sb.id);
  }

  /** The background process `pid` (NotFound when the sandbox keeps none). */
  async connect(pid: number): Promise<ProcessHandle> {
    const found = (await this.list()).find((p) => p.pid === pid);
    if (!found) throw new NotFound(`sandbox ${this.sb.id} keeps no process ${pid}`);
    return new ProcessHandle(this.sb.controller, this.sb.id, found);
  }

  async #wait(cmd: string | string[], opts: RunOptions): Promise<CommandResult> {
    const req = {
      ...(typeof cmd === "string" ? { cmd } : { args: cmd }),
      timeout_secs: Math.ceil(opts.timeoutSecs ?? 30),
      env: opts.env,
      cwd: opts.cwd,
      stdin: opts.stdin,
    } as Parameters<Controller["execCommand"]>[1];
    const c = this.sb.controller;
    if (!opts.onStdout && !opts.onStderr) return c.execCommand(this.sb.id, req);
    const out: string[] = [];
    const err: string[] = [];
    for await (const ev of c.execStream(this.sb.id, req)) {
      if (ev.type === "stdout") {
        out.push(ev.data);
        opts.onStdout?.(ev.data);
      } else if (ev.type === "stderr") {
        err.push(ev.data);
        opts.onStderr?.(ev.data);
      } else if (ev.type === "exit") {
        const [stdout, stderr] = [out.join(""), err.join("")];
        const bytes = (s: string) => Buffer.byteLength(s, "utf8");
        return {
          stdout,
          stderr,
          exit_code: ev.exit_code,
          signal: ev.signal,
          timed_out: ev.timed_out,
          duration_ms: ev.duration_ms,
          truncated: false,
          stdout_bytes: bytes(stdout),
          stderr_bytes: bytes(stderr),
        };
      } else if (ev.type === "error") {
        throw new ForkvmError(`exec in ${this.sb.id}: ${ev.error}`);
      }
    }
    throw new ForkvmError(`exec in ${this.sb.id}: the stream ended without an exit line`);
  }
}

/** `sandbox.pty`: terminals in the sandbox. */
export class Pty {
  constructor(private readonly sb: Sandbox) {}

  /** A command (a login shell by default) on a new terminal: `attach()` it for the screen and the keys. */
  async create(opts: StartOptions & { rows?: number; cols?: number; cmd?: string } = {}): Promise<ProcessHandle> {
    const shell = opts.cmd ?? "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi";
    const env = { TERM: "xterm-256color", ...opts.env };
    const req = startRequest(shell, { ...opts, env, tag: opts.tag ?? "pty" }, { rows: opts.rows ?? 24, cols: opts.cols ?? 80 });
    return new ProcessHandle(this.sb.controller, this.sb.id, await this.sb.controller.startProcess(this.sb.id, req));
  }
}

export class Files {
  constructor(private readonly sb: Sandbox) {}

  read(path: string): Promise<Uint8Array> {
    return this.sb.controller.readFile(this.sb.id, path);
  }

  async readText(path: string): Promise<string> {
    return new TextDecoder().decode(await this.read(path));
  }

  /** The file as a web stream. */
  readStream(path: string): Promise<ReadableStream<Uint8Array>> {
    return this.sb.controller.readFileStream(this.sb.id, path);
  }

  /** Writes bytes, text or a stream; parents are made. */
  write(path: string, data: Parameters<Controller["writeFile"]>[2], opts: { mode?: number } = {}): Promise<T.FileWritten> {
    return this.sb.controller.writeFile(this.sb.id, path, data, { ...opts, createParents: true });
  }

  list(path: string): Promise<T.FileEntry[]> {
    return this.sb.controller.listFiles(this.sb.id, path);
  }

  remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    return this.sb.controller.removeFile(this.sb.id, path, opts);
  }

  /** A file's size and SHA-256, computed in the guest. */
  checksum(path: string): Promise<T.FileChecksum> {
    return this.sb.controller.fileChecksum(this.sb.id, path);
  }

  /** The directory `path` as a tar archive, streamed. */
  readDir(path: string): Promise<ReadableStream<Uint8Array>> {
    return this.sb.controller.readTar(this.sb.id, path);
  }

  /** A tar archive (bytes or a stream) unpacked into the directory `path`. */
  writeDir(path: string, tar: Parameters<Controller["writeTar"]>[2]): Promise<T.FileWritten> {
    return this.sb.controller.writeTar(this.sb.id, path, tar);
  }

  /** The changes below the directory `path` (`armed` first; `break` to stop): see `Controller.watchFiles`. */
  watch(path: string, opts: { recursive?: boolean } = {}): AsyncGenerator<T.WatchEvent> {
    return this.sb.controller.watchFiles(this.sb.id, path, opts);
  }
}

/** `sandbox.checkpoints`: take, list, rewind to and fork from checkpoints. */
export class Checkpoints {
  constructor(private readonly sb: Sandbox) {}

  /** A checkpoint now (the guest pauses for a few milliseconds). */
  create(note?: string): Promise<T.CheckpointInfo> {
    return this.sb.controller.createCheckpoint(this.sb.id, note === undefined ? {} : { note });
  }

  /** The kept checkpoints, oldest first. */
  async list(): Promise<T.CheckpointInfo[]> {
    return (await this.sb.controller.listCheckpoints(this.sb.id)).checkpoints;
  }

  /** Replaces when the daemon checkpoints this sandbox by itself. */
  async setPolicy(policy: T.CheckpointPolicy): Promise<T.CheckpointPolicy> {
    return (await this.sb.controller.setCheckpointPolicy(this.sb.id, policy)).policy;
  }

  /** This sandbox back at checkpoint `seq` (or the newest `agoSeconds` old), in place. */
  async rewind(to: { seq: number } | { agoSeconds: number }): Promise<T.RewindReport> {
    const req = "seq" in to ? { seq: to.seq } : { ago_seconds: to.agoSeconds };
    const report = await this.sb.controller.rewindSandbox(this.sb.id, req);
    await this.sb.refresh();
    return report;
  }

  /** `n` new sandboxes started at checkpoint `seq` (this one runs on); they share its controller. */
  async fork(seq: number, n = 1): Promise<Sandbox[]> {
    const c = (await this.list()).find((x) => x.seq === seq);
    if (!c) throw new ForkvmError(`sandbox ${this.sb.id} has no checkpoint ${seq}`);
    const infos = await this.sb.controller.spawnSandboxes({ snapshot_tag: c.tag, n });
    return Promise.all(infos.map((i) => Sandbox.connect(i.id, { controller: this.sb.controller })));
  }
}

export class Sandbox {
  readonly commands = new Commands(this);
  readonly files = new Files(this);
  readonly pty = new Pty(this);
  readonly checkpoints = new Checkpoints(this);
  #info: T.SandboxInfo;
  #killed = false;

  private constructor(
    info: T.SandboxInfo,
    readonly controller: Controller,
    private readonly ownsController: boolean,
  ) {
    this.#info = info;
  }

  /** One sandbox spawned from the snapshot tagged `tag` (milliseconds: a restore, not a boot). */
  static async create(tag: string, opts: CreateOptions = {}): Promise<Sandbox> {
    const { controller, baseUrl, token, timeoutMs, tls, ...req } = opts;
    const own = controller === undefined;
    const c = controller ?? new Controller({ baseUrl, token, timeoutMs, tls });
    try {
      const [info] = await c.spawnSandboxes({ ...req, snapshot_tag: tag, n: 1 });
      if (!info) throw new ForkvmError("the spawn returned no sandbox");
      return new Sandbox(info, c, own);
    } catch (e) {
      if (own) await c.close();
      throw e;
    }
  }

  /** The existing sandbox `id` (`NotFound` if none). */
  static async connect(id: string, opts: SandboxOptions = {}): Promise<Sandbox> {
    const { controller, ...copts } = opts;
    const own = controller === undefined;
    const c = controller ?? new Controller(copts);
    try {
      return new Sandbox(await c.getSandbox(id), c, own);
    } catch (e) {
      if (own) await c.close();
      throw e;
    }
  }

  get id(): string {
    return this.#info.id;
  }

  /** What the daemon said last (see `refresh`). */
  get info(): T.SandboxInfo {
    return this.#info;
  }

  async refresh(): Promise<T.SandboxInfo> {
    this.#info = await this.controller.getSandbox(this.id);
    return this.#info;
  }

  ping(): Promise<T.Pong> {
    return this.controller.pingSandbox(this.id);
  }

  /** Runs Python in the sandbox's warm interpreter: the last expression's `repr`. Throws `EvalError` when the code raised. */
  async eval(code: string): Promise<string | null> {
    const r = await this.controller.evalCode(this.id, code);
    if (r.error) throw new EvalError(headline(r.error, r.exit_code), r.error);
    return r.result ?? null;
  }

  /** A snapshot of this running sandbox (full, live or diff); spawn from its tag. */
  branch(req: T.BranchSandboxRequest = {}): Promise<T.SnapshotInfo> {
    return this.controller.branchSandbox(this.id, req);
  }

  /** `n` running copies of this sandbox (memory, processes and all). */
  async fork(n = 1, req: Omit<T.ForkSandboxRequest, "n"> = {}): Promise<Sandbox[]> {
    const infos = await this.controller.forkSandbox(this.id, { ...req, n });
    return infos.map((info) => (this.ownsController ? new Sandbox(info, this.controller.clone(), true) : new Sandbox(info, this.controller, false)));
  }

  /** Guest `port` reachable through the daemon, under a token of its own. */
  expose(port: number): Promise<T.ExposedPort> {
    return this.controller.exposePort(this.id, port);
  }

  /** Deletes the sandbox (again: nothing); closes its own Controller. */
  async kill(opts: { purge?: boolean } = {}): Promise<void> {
    if (!this.#killed) {
      try {
        await this.controller.killSandbox(this.id, opts);
      } catch (e) {
        if (!(e instanceof NotFound)) throw e;
      }
      this.#killed = true;
    }
    if (this.ownsController) await this.controller.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
  }
}
