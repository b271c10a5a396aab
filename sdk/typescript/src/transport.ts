/**
 * Where the daemon is and how to reach it: endpoint resolution, the token, path quoting,
 * and an undici dispatcher (a Unix socket, or TCP with TLS options).
 *
 * The rules match the daemon's own (`forkvm daemon` listens on `$FORKVM_RUN/forkvmd.sock`
 * by default, with the run root falling back as the sandbox registry's), so a client
 * with no configuration finds a daemon started with none. The same rules as the Python
 * SDK's `forkvm.transport`.
 */

import * as os from "node:os";
import * as path from "node:path";
import { Agent } from "undici";

/** File name of the daemon's socket in the run root. */
export const SOCKET_NAME = "forkvmd.sock";
/** Base URL of requests over a Unix socket (the host is never resolved). */
export const UDS_BASE_URL = "http://forkvmd";

/** A resolved daemon address: `socketPath` set when it is a Unix socket. */
export interface Endpoint {
  baseUrl: string;
  socketPath?: string;
}

export function describeEndpoint(e: Endpoint): string {
  return e.socketPath !== undefined ? `unix:${e.socketPath}` : e.baseUrl;
}

type Env = Record<string, string | undefined>;

/** `$FORKVM_RUN`, `$XDG_RUNTIME_DIR/forkvm`, `/run/forkvm` for root, else `$TMPDIR/forkvm-<uid>`. */
export function defaultRunRoot(env: Env = process.env, uid: number = os.userInfo().uid): string {
  if (env.FORKVM_RUN) return env.FORKVM_RUN;
  if (env.XDG_RUNTIME_DIR) return path.join(env.XDG_RUNTIME_DIR, "forkvm");
  if (uid === 0) return "/run/forkvm";
  return path.join(env.TMPDIR || "/tmp", `forkvm-${uid}`);
}

export function defaultSocketPath(env: Env = process.env, uid?: number): string {
  return path.join(defaultRunRoot(env, uid), SOCKET_NAME);
}

function parse(spec: string, source: string): Endpoint {
  const s = spec.trim();
  if (s.startsWith("unix:")) {
    let p = s.slice("unix:".length);
    if (p.startsWith("//")) p = p.slice(2);
    if (!p) throw new TypeError(`${source}: ${JSON.stringify(spec)} names no socket path`);
    return { baseUrl: UDS_BASE_URL, socketPath: p };
  }
  if (s.startsWith("/")) return { baseUrl: UDS_BASE_URL, socketPath: s };
  if (s.startsWith("http://") || s.startsWith("https://")) {
    const rest = s.split("://", 2)[1] ?? "";
    if (!rest || rest.startsWith("/")) throw new TypeError(`${source}: ${JSON.stringify(spec)} names no host`);
    return { baseUrl: s.replace(/\/+$/, "") };
  }
  throw new TypeError(
    `${source}: ${JSON.stringify(spec)} is not a daemon address (use unix:/path/to/forkvmd.sock, http://host:port or https://host:port)`,
  );
}

/** `baseUrl` if given, else `$FORKVM_DAEMON`, else the default Unix socket. */
export function resolveEndpoint(baseUrl?: string, env: Env = process.env, uid?: number): Endpoint {
  if (baseUrl) return parse(baseUrl, "baseUrl");
  if (env.FORKVM_DAEMON) return parse(env.FORKVM_DAEMON, "FORKVM_DAEMON");
  return { baseUrl: UDS_BASE_URL, socketPath: defaultSocketPath(env, uid) };
}

/** `token` if given (an empty string: none), else `$FORKVM_TOKEN`, else none. */
export function resolveToken(token?: string, env: Env = process.env): string | undefined {
  if (token !== undefined) return token || undefined;
  return env.FORKVM_TOKEN || undefined;
}

/**
 * One path parameter, kept one segment: `/` becomes `%2F`, and a segment of only dots
 * (`.`, `..`) gets them encoded, so an id can never walk to another route.
 */
export function quoteSegment(value: string): string {
  if (typeof value !== "string") throw new TypeError(`a path parameter must be a string, got ${typeof value}`);
  if (value === "") throw new TypeError("a path parameter (sandbox id, tag or name) must not be empty");
  const q = encodeURIComponent(value);
  return /^\.+$/.test(q) ? q.replace(/\./g, "%2E") : q;
}

/** TLS options for an `https://` daemon: a CA bundle (PEM) to trust. */
export interface TlsOptions {
  ca?: string | Buffer;
  rejectUnauthorized?: boolean;
}

/** The undici dispatcher for `endpoint`. */
export function makeDispatcher(endpoint: Endpoint, tls: TlsOptions = {}): Agent {
  if (endpoint.socketPath !== undefined) return new Agent({ connect: { socketPath: endpoint.socketPath } });
  return new Agent({ connect: { ca: tls.ca, rejectUnauthorized: tls.rejectUnauthorized ?? true } });
}
