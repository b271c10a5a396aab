/**
 * Background processes as objects: `sandbox.commands.run(cmd, { background: true })`,
 * `sandbox.commands.connect(pid)` and `sandbox.pty.create()` give a `ProcessHandle`, whose
 * `attach()` is the process's WebSocket (output out, keys and controls in) and whose
 * `wait()` follows it to its end. The process belongs to the sandbox's agent: dropping a
 * handle or a socket leaves it running.
 */

import type { Controller } from "./controller.js";
import type { ProcessSocket } from "./attach.js";
import type * as T from "./types.js";

export interface StartOptions {
  env?: Record<string, string>;
  cwd?: string;
  /** A guest user (name or uid). */
  user?: string;
  /** Kill its process group after this many seconds; it runs until it ends without. */
  timeoutSecs?: number;
  /** A name listed with it. */
  tag?: string;
  /** Output bytes kept for readers (1 MiB by default, at most 16 MiB). */
  ringBytes?: number;
}

export class ProcessHandle {
  constructor(
    private readonly controller: Controller,
    readonly sandboxId: string,
    /** The process as it stood when this handle was made or last refreshed. */
    public info: T.ProcessInfo,
  ) {}

  get pid(): number {
    return this.info.pid;
  }

  /** Its output from `offset` (the oldest byte kept by default) and its input, on one socket. */
  attach(opts: { offset?: number } = {}): Promise<ProcessSocket> {
    return this.controller.attachProcess(this.sandboxId, this.pid, opts);
  }

  /** Waits until it ended; how it stands then. */
  async wait(): Promise<T.ProcessInfo> {
    const sock = await this.attach({ offset: this.info.output_end });
    for await (const _ of sock) void _;
    if (!sock.process) throw new Error(`process ${this.pid}: its socket ended without its end`);
    this.info = sock.process;
    return sock.process;
  }

  /** Its current state. */
  async refresh(): Promise<T.ProcessInfo> {
    const found = (await this.controller.listProcesses(this.sandboxId)).find((p) => p.pid === this.pid);
    if (!found) throw new Error(`sandbox ${this.sandboxId} keeps no process ${this.pid}`);
    this.info = found;
    return found;
  }

  /** Writes to its stdin; `close` ends its input after. */
  sendStdin(data: string | Uint8Array, opts: { close?: boolean } = {}): Promise<T.ProcessInputWritten> {
    return this.controller.processInput(this.sandboxId, this.pid, data, opts);
  }

  /** A signal (KILL by default) to its process group. */
  kill(signal = 9): Promise<void> {
    return this.controller.signalProcess(this.sandboxId, this.pid, signal);
  }

  /** Its terminal's new size. */
  resize(rows: number, cols: number): Promise<void> {
    return this.controller.resizeProcess(this.sandboxId, this.pid, { rows, cols });
  }
}

/** The request for a background start of `cmd` (a string through `/bin/sh -c`, an array as argv). */
export function startRequest(cmd: string | string[], opts: StartOptions, pty?: T.TerminalSize): T.StartProcessRequest {
  return {
    ...(typeof cmd === "string" ? { cmd } : { args: cmd }),
    env: opts.env,
    cwd: opts.cwd,
    user: opts.user,
    timeout_secs: opts.timeoutSecs === undefined ? undefined : Math.ceil(opts.timeoutSecs),
    tag: opts.tag,
    ring_bytes: opts.ringBytes,
    pty,
  } as T.StartProcessRequest;
}
