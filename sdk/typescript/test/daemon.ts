/**
 * A real `forkvm daemon` for the tests: a private socket, run root, store and keys in a
 * temp directory, a TCP listener with a token, and a stop that kills what the tests left
 * running (through the API) and removes the directory. The TypeScript twin of the
 * Python SDK's `tests/daemon_proc.py`.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { Controller } from "../src/index.js";

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");
export const FORKVM_BIN = process.env.FORKVM_BIN || path.join(REPO, "target", "debug", "forkvm");
export const TOKEN = "ts-sdk-test-token-0123456789abcdef";
const READY_TIMEOUT_MS = 60_000;

export interface Daemon {
  socket: string;
  /** `http://127.0.0.1:PORT` of its TCP listener. */
  tcp: string;
  root: string;
  proc: ChildProcess;
  stop(): Promise<void>;
}

export function haveDaemonBinary(): boolean {
  if (process.env.FORKVM_SDK_REQUIRE_DAEMON === "1" && !existsSync(FORKVM_BIN)) {
    throw new Error(`FORKVM_BIN=${FORKVM_BIN} does not exist, and FORKVM_SDK_REQUIRE_DAEMON=1`);
  }
  return existsSync(FORKVM_BIN);
}

export async function startDaemon(): Promise<Daemon> {
  const root = mkdtempSync(path.join(tmpdir(), "fkts-"));
  const socket = path.join(root, "forkvmd.sock");
  writeFileSync(path.join(root, "token"), TOKEN + "\n", { mode: 0o600 });
  const env: Record<string, string | undefined> = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith("FORKVMD_") || k === "FORKVM_DAEMON") delete env[k];
  Object.assign(env, {
    FORKVM_RUN: path.join(root, "run"),
    FORKVM_STORE: path.join(root, "store"),
    FORKVM_KEYS: path.join(root, "keys"),
  });
  const args = ["daemon", "--socket", socket, "--bind", "127.0.0.1:0", "--token-file", path.join(root, "token")];
  const proc = spawn(FORKVM_BIN, args, { env, stdio: ["ignore", "pipe", "pipe"] });
  const lines: string[] = [];
  const stderr: string[] = [];
  proc.stderr!.on("data", (c: Buffer) => {
    stderr.push(c.toString());
    if (stderr.length > 200) stderr.shift();
  });
  const tcp = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`forkvmd not ready in ${READY_TIMEOUT_MS} ms: ${lines.join("\n")}\n${stderr.join("")}`)), READY_TIMEOUT_MS);
    let buf = "";
    proc.stdout!.on("data", (c: Buffer) => {
      buf += c.toString();
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        lines.push(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
      }
      const http = lines.find((l) => l.startsWith("forkvmd listening on http://"));
      if (http && lines.some((l) => l.startsWith("forkvmd listening on unix:"))) {
        clearTimeout(timer);
        resolve(http.slice("forkvmd listening on ".length).trim());
      }
    });
    proc.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`forkvmd exited with ${code} before it was ready:\n${stderr.join("")}`));
    });
  });
  proc.stdout!.resume();
  return {
    socket,
    tcp,
    root,
    proc,
    async stop() {
      const c = new Controller({ baseUrl: `unix:${socket}` });
      try {
        for (const s of await c.listSandboxes()) await c.killSandbox(s.id).catch(() => undefined);
      } catch (e) {
        console.error(`cleanup: could not kill sandboxes: ${String(e)}`);
      } finally {
        await c.close();
      }
      const exited = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGTERM");
      const timer = setTimeout(() => proc.kill("SIGKILL"), 30_000);
      await exited;
      clearTimeout(timer);
      rmSync(root, { recursive: true, force: true });
    },
  };
}
