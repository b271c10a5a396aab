// status.ts — the one line (#status) that says what the last action did or what went
// wrong, with the time it happened.

import { ApiError } from "./api";

export function status(message: string, kind: "ok" | "error" | "info" = "info"): void {
  const el = document.getElementById("status");
  if (!el) return;
  const t = new Date();
  const hh = String(t.getHours()).padStart(2, "0");
  const mm = String(t.getMinutes()).padStart(2, "0");
  const ss = String(t.getSeconds()).padStart(2, "0");
  el.textContent = `${hh}:${mm}:${ss} ${message}`;
  el.dataset.kind = kind;
}

export function statusError(what: string, e: unknown): void {
  const msg = e instanceof ApiError ? e.message : e instanceof Error ? e.message : String(e);
  status(`${what}: ${msg}`, "error");
}
