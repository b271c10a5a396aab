// api.ts — the daemon's HTTP API as this page uses it: the JSON shapes (a subset of
// crates/forkvm-api) and one fetch wrapper that adds the bearer token, turns the
// daemon's `{"error": ...}` bodies into ApiError and reports a 401 to auth.ts.

import { getToken, onUnauthorized } from "./auth";

export interface SandboxInfo {
  id: string;
  snapshot_tag: string | null;
  state: string;
  created_at_unix: number;
  memory_limit_mib: number | null;
  forked_from: string | null;
  template: string | null;
  vcpus: number | null;
  branch_count: number;
  reason?: string | null;
}

export interface SnapshotInfo {
  tag: string;
  created_at_unix: number;
  branched_from: string | null;
  status: string;
  mode: string | null;
  memory_logical_bytes: number;
  memory_physical_bytes: number;
  template: string | null;
  warning?: string | null;
}

export type NodeKind = "sandbox" | "snapshot";
export type EdgeKind = "spawn" | "fork" | "branch" | "chain";

export interface LineageNode {
  id: string;
  kind: NodeKind;
  name: string;
  state: string;
  memory_bytes: number;
  stored_bytes: number | null;
  created_at_unix: number;
  mode: string | null;
  chain_depth: number;
}

export interface LineageEdge {
  from: string;
  to: string;
  kind: EdgeKind;
}

export interface Lineage {
  nodes: LineageNode[];
  edges: LineageEdge[];
}

export interface Usage {
  at_unix_ms: number;
  memory_bytes: number;
  memory_limit_bytes: number | null;
  cpu_usage_usec: number;
  vcpus: number;
}

export interface FileEntry {
  name: string;
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  mode: number;
  mtime_unix_ns: number;
}

export interface ProcessExit {
  exit_code: number;
  signal?: number | null;
  timed_out: boolean;
  duration_ms: number;
}

export interface ProcessInfo {
  pid: number;
  argv: string[];
  running: boolean;
  exit?: ProcessExit | null;
}

export interface VersionInfo {
  version: string;
  api: string;
}

/** An answer other than 2xx; `message` is the daemon's `error` when it sent one. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly code?: string,
  ) {
    super(message);
  }
}

const enc = encodeURIComponent;

async function request(method: string, path: string, body?: unknown): Promise<Response> {
  const headers: Record<string, string> = {};
  const token = getToken();
  if (token) headers["Authorization"] = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res: Response;
  try {
    res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
    });
  } catch (e) {
    throw new ApiError(`${method} ${path}: ${(e as Error).message || "network error"}`, 0);
  }
  if (res.ok) return res;
  let message = `${method} ${path}: ${res.status} ${res.statusText}`;
  let code: string | undefined;
  const text = await res.text().catch(() => "");
  try {
    const err = JSON.parse(text) as { error?: unknown; code?: unknown; state?: unknown };
    if (typeof err.error === "string") message = err.error;
    if (typeof err.code === "string") code = err.code;
    if (typeof err.state === "string") message += ` (state: ${err.state})`;
  } catch {
    if (text) message += `: ${text.slice(0, 200)}`;
  }
  if (res.status === 401) onUnauthorized();
  throw new ApiError(message, res.status, code);
}

async function json<T>(method: string, path: string, body?: unknown): Promise<T> {
  const res = await request(method, path, body);
  const text = await res.text();
  return (text ? JSON.parse(text) : null) as T;
}

export const api = {
  version: () => json<VersionInfo>("GET", "/version"),
  sandboxes: () => json<SandboxInfo[]>("GET", "/v1/sandboxes"),
  snapshots: () => json<SnapshotInfo[]>("GET", "/v1/snapshots"),
  lineage: () => json<Lineage>("GET", "/v1/lineage"),
  usage: (id: string) => json<Usage>("GET", `/v1/sandboxes/${enc(id)}/usage`),
  console: async (id: string, bytes = 65536) =>
    (await request("GET", `/v1/sandboxes/${enc(id)}/console?bytes=${bytes}`)).text(),
  listFiles: (id: string, path: string) =>
    json<FileEntry[]>("GET", `/v1/sandboxes/${enc(id)}/files/list?path=${enc(path)}`),
  fork: (id: string, n: number) => json<SandboxInfo[]>("POST", `/v1/sandboxes/${enc(id)}/fork`, { n }),
  branch: (id: string, mode: string) => json<SnapshotInfo>("POST", `/v1/sandboxes/${enc(id)}/branch`, { mode }),
  archive: (id: string) => json<unknown>("POST", `/v1/sandboxes/${enc(id)}/archive`),
  kill: (id: string) => json<unknown>("DELETE", `/v1/sandboxes/${enc(id)}`),
  startProcess: (id: string, body: { args: string[]; pty?: { rows: number; cols: number }; tag?: string }) =>
    json<ProcessInfo>("POST", `/v1/sandboxes/${enc(id)}/processes`, body),
};

/** The WebSocket URL of a path on this page's own origin. */
export function wsUrl(path: string): string {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  return `${proto}//${location.host}${path}`;
}

export const paths = {
  attach: (id: string, pid: number, offset = 0) =>
    `/v1/sandboxes/${enc(id)}/processes/${pid}/attach?offset=${offset}`,
};
