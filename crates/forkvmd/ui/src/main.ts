// main.ts — the page's entry point: takes the token, wires every pane, and keeps the
// lists and the lineage fresh (every 3 s and after each action). It owns the one piece
// of shared state, the selected sandbox.

import "@xterm/xterm/css/xterm.css";
import "./style.css";
import { api, ApiError, type SandboxInfo } from "./api";
import { initToken, setupLogin, showLogin, getToken } from "./auth";
import { byId } from "./dom";
import { setupActions } from "./actions";
import { setupConsole } from "./consolelog";
import { clearDetail, showDetail } from "./detail";
import { setupFiles } from "./files";
import { fit, renderLineage, resetZoom, setLineageError, markSelected as markNode } from "./lineage";
import { status, statusError } from "./status";
import { renderSandboxes, renderSnapshots, markSelected as markRow } from "./tables";
import { setupTerminal } from "./terminal";

const REFRESH_MS = 3000;

let selected: string | null = null;
let sandboxes: SandboxInfo[] = [];
let timer: number | undefined;
let inFlight: Promise<void> | null = null;
let started = false;

function select(id: string | null): void {
  selected = id;
  const sb = id === null ? undefined : sandboxes.find((s) => s.id === id);
  if (sb) showDetail(sb);
  else clearDetail();
  markRow(selected);
  markNode(selected);
}

function indicator(text: string, state: "busy" | "ok" | "error"): void {
  const el = byId("refresh-indicator");
  el.textContent = text;
  el.dataset.state = state;
}

function clock(): string {
  return new Date().toTimeString().slice(0, 8);
}

/** Each snapshot's guest memory by tag, from the last snapshot list. */
let guestMemory = new Map<string, number>();

async function refreshOnce(): Promise<void> {
  if (!getToken() || !byId("login").hidden) return;
  indicator("refreshing…", "busy");
  const [sbs, snaps, lineage] = await Promise.allSettled([api.sandboxes(), api.snapshots(), api.lineage()]);
  let failed: unknown = null;
  if (snaps.status === "fulfilled") guestMemory = new Map(snaps.value.map((s) => [s.tag, s.memory_logical_bytes]));
  if (sbs.status === "fulfilled") {
    sandboxes = sbs.value;
    renderSandboxes(sandboxes, guestMemory, selected, (id) => select(id));
    if (selected !== null) {
      const sb = sandboxes.find((s) => s.id === selected);
      if (sb) showDetail(sb);
      else {
        // After a kill, #status already says so; otherwise say where the selection went.
        if (!byId("status").textContent?.includes(selected)) status(`sandbox ${selected} is gone`);
        select(null);
      }
    }
  } else failed = sbs.reason;
  if (snaps.status === "fulfilled") renderSnapshots(snaps.value);
  else failed ??= snaps.reason;
  if (lineage.status === "fulfilled") renderLineage(lineage.value, selected, (id) => select(id));
  else {
    const e = lineage.reason;
    setLineageError(
      e instanceof ApiError && e.status === 404 ? "lineage: this daemon has no /v1/lineage" : `lineage: ${(e as Error).message}`,
    );
  }
  if (failed) {
    indicator(`refresh failed ${clock()}`, "error");
    if (!(failed instanceof ApiError && failed.status === 401)) statusError("refresh", failed);
  } else indicator(`updated ${clock()}`, "ok");
}

/** Refreshes now (joining a refresh already running) and re-arms the 3 s timer. */
function refresh(): Promise<void> {
  if (inFlight) return inFlight;
  if (timer !== undefined) clearTimeout(timer);
  inFlight = refreshOnce()
    .catch((e) => statusError("refresh", e))
    .finally(() => {
      inFlight = null;
      timer = window.setTimeout(() => void refresh(), REFRESH_MS);
    });
  return inFlight;
}

async function loadVersion(): Promise<void> {
  try {
    const v = await api.version();
    byId("version").textContent = `forkvmd ${v.version} (API ${v.api})`;
  } catch {
    byId("version").textContent = "forkvmd (version unknown)";
  }
}

function start(): void {
  void loadVersion();
  if (started) {
    void refresh();
    return;
  }
  started = true;
  void refresh();
}

function init(): void {
  setupLogin(start);
  setupConsole();
  setupFiles();
  setupTerminal(() => selected);
  setupActions(() => selected, refresh);
  byId("lineage-fit").addEventListener("click", () => fit());
  byId("lineage-reset").addEventListener("click", resetZoom);
  byId("logout").addEventListener("click", () => {
    try {
      sessionStorage.removeItem("forkvm.token");
    } catch {
      // Nothing stored.
    }
    select(null);
    showLogin("Token forgotten.");
  });
  if (initToken()) start();
  else showLogin();
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
else init();
