/**
 * Errors the SDK throws, one class per kind of failure.
 *
 * forkvmd answers every error with `{"error": "...", "code": "...", "state"?: "..."}` and
 * a status. Callers want to tell "no such sandbox" from "tag taken" from "daemon not
 * running" without parsing text, so each status maps to a class, and the server's own
 * words stay in `message`.
 */

export interface ErrorDetail {
  /** HTTP status, or undefined when no response came. */
  status?: number;
  /** The server's machine-readable code (`not_found`, `conflict`, ...). */
  code?: string;
  /** The object's current state, for conflicts (e.g. `writing`). */
  state?: string;
  url?: string;
  /** The decoded error body (an object, or text when it was not JSON). */
  body?: unknown;
}

export class ForkvmError extends Error {
  readonly status?: number;
  readonly code?: string;
  readonly state?: string;
  readonly url?: string;
  readonly body?: unknown;

  constructor(message: string, detail: ErrorDetail = {}, options?: { cause?: unknown }) {
    const parts = [detail.status !== undefined ? `HTTP ${detail.status}` : "", detail.code ?? "", detail.state ? `state=${detail.state}` : ""]
      .filter((p) => p);
    super(parts.length ? `${message} (${parts.join(", ")})` : message, options);
    this.name = new.target.name;
    this.status = detail.status;
    this.code = detail.code;
    this.state = detail.state;
    this.url = detail.url;
    this.body = detail.body;
  }
}

/** 400: malformed request, unknown field, bad tag or id, bad value. */
export class BadRequest extends ForkvmError {}
/** 401: missing or wrong bearer token (TCP listener only). */
export class Unauthorized extends ForkvmError {}
/** 403: refused by policy (a browser's origin; another sandbox's port token). */
export class Forbidden extends ForkvmError {}
/** 404: no such sandbox, snapshot, workspace or file. */
export class NotFound extends ForkvmError {}
/** 409: the object is in the wrong state (see `state`) or the name is taken. */
export class Conflict extends ForkvmError {}
/** 503: a concurrency cap was reached (e.g. branches); retry later. */
export class Busy extends ForkvmError {}
/** 507: the snapshot store ran out of space. */
export class DiskFull extends ForkvmError {}
/** 502 from the daemon: a sandbox's guest did not answer on the port asked for. */
export class BadGateway extends ForkvmError {}
/** Any other 5xx: the daemon failed internally. */
export class ServerError extends ForkvmError {}
/** The daemon could not be reached or the connection broke (no HTTP status). */
export class ConnectionFailed extends ForkvmError {}
/** The daemon answered something this SDK cannot understand. */
export class ProtocolError extends ForkvmError {}

/** Code given to `Sandbox.eval` raised; `traceback` is the guest's traceback text. */
export class EvalError extends ForkvmError {
  readonly traceback: string;
  constructor(message: string, traceback: string) {
    super(message);
    this.traceback = traceback;
  }
}

const BY_STATUS: Record<number, new (m: string, d: ErrorDetail) => ForkvmError> = {
  400: BadRequest,
  401: Unauthorized,
  403: Forbidden,
  404: NotFound,
  409: Conflict,
  503: Busy,
  507: DiskFull,
};

/** The error for a non-2xx answer, from its status and raw body text. */
export function errorFromResponse(status: number, text: string, url?: string): ForkvmError {
  let parsed: unknown;
  try {
    parsed = text.trim() ? JSON.parse(text) : undefined;
  } catch {
    parsed = undefined;
  }
  let message: string;
  let code: string | undefined;
  let state: string | undefined;
  const obj = parsed as { error?: unknown; code?: unknown; state?: unknown } | undefined;
  if (obj && typeof obj === "object" && typeof obj.error === "string") {
    message = obj.error;
    code = typeof obj.code === "string" && obj.code ? obj.code : undefined;
    state = typeof obj.state === "string" ? obj.state : undefined;
  } else {
    const snippet = text.trim();
    message = snippet ? (snippet.length > 500 ? `${snippet.slice(0, 500)}...` : snippet) : `HTTP ${status} with an empty body`;
  }
  // A 502 is the daemon's own only with its code (a proxy in front answers 502 too).
  const cls =
    status === 502 && code === "bad_gateway" ? BadGateway : (BY_STATUS[status] ?? (status >= 500 && status <= 599 ? ServerError : ForkvmError));
  return new cls(message, { status, code, state, url, body: parsed ?? text });
}
