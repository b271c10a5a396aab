// terminal.ts — an interactive shell in the selected sandbox: starts `/bin/sh -i` on
// a pty as a background process, attaches to it over the daemon's WebSocket (the
// token travels as a subprotocol), and connects it to xterm.js in #terminal: output
// binary frames (first byte = stream) to the screen, keys as binary frames, resizes
// and the exit as JSON text frames.

import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import { api, paths, wsUrl, type ProcessInfo } from "./api";
import { wsProtocols } from "./auth";
import { byId } from "./dom";
import { status, statusError } from "./status";

interface Session {
  term: Terminal;
  fit: FitAddon;
  ws: WebSocket | null;
  observer: ResizeObserver;
  ended: boolean;
  closed: boolean;
}

let session: Session | null = null;
const encoder = new TextEncoder();

function setState(state: string, text: string): void {
  const host = byId("terminal");
  host.dataset.state = state;
  byId("terminal-status").textContent = text;
}

function exitText(p: ProcessInfo | undefined): string {
  const x = p?.exit;
  if (!x) return "process ended";
  if (x.timed_out) return `process timed out (exit ${x.exit_code})`;
  if (x.signal) return `process killed by signal ${x.signal} (exit ${x.exit_code})`;
  return `process exited with code ${x.exit_code}`;
}

function send(s: Session, data: Uint8Array | string): void {
  if (s.ws && s.ws.readyState === WebSocket.OPEN) s.ws.send(data);
}

export async function openTerminal(id: string): Promise<void> {
  closeTerminal();
  const host = byId("terminal");
  host.hidden = false;
  host.replaceChildren();
  host.removeAttribute("data-exit-code");
  const term = new Terminal({
    cursorBlink: true,
    fontSize: 13,
    fontFamily: "ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', monospace",
    scrollback: 5000,
    theme: { background: "#0b0e14", foreground: "#d7dae0" },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(host);
  let pending = 0;
  const observer = new ResizeObserver(() => {
    cancelAnimationFrame(pending);
    pending = requestAnimationFrame(() => {
      try {
        fit.fit();
      } catch {
        // Not laid out (hidden): the next resize fits it.
      }
    });
  });
  observer.observe(host);
  const s: Session = { term, fit, ws: null, observer, ended: false, closed: false };
  session = s;
  try {
    fit.fit();
  } catch {
    // As above.
  }
  setState("starting", "starting /bin/sh -i …");

  let proc: ProcessInfo;
  try {
    proc = await api.startProcess(id, {
      args: ["/bin/sh", "-i"],
      pty: { rows: term.rows, cols: term.cols },
      tag: "web-console",
    });
  } catch (e) {
    if (s.closed) return;
    setState("error", "could not start a shell");
    term.write(`\r\n\x1b[31mcould not start a shell: ${(e as Error).message}\x1b[0m\r\n`);
    statusError("terminal", e);
    return;
  }
  if (s.closed) return;
  host.dataset.pid = String(proc.pid);

  const ws = new WebSocket(wsUrl(paths.attach(id, proc.pid, 0)), wsProtocols());
  ws.binaryType = "arraybuffer";
  s.ws = ws;
  ws.addEventListener("open", () => {
    setState("attached", `attached to pid ${proc.pid} in ${id}`);
    send(s, JSON.stringify({ type: "resize", rows: term.rows, cols: term.cols }));
    term.focus();
    status(`terminal: /bin/sh -i is pid ${proc.pid} in ${id}`, "ok");
  });
  ws.addEventListener("message", (ev) => {
    if (typeof ev.data !== "string") {
      const bytes = new Uint8Array(ev.data as ArrayBuffer);
      if (bytes.length > 1) term.write(bytes.subarray(1));
      return;
    }
    let event: { type?: string; process?: ProcessInfo; error?: string };
    try {
      event = JSON.parse(ev.data);
    } catch {
      return;
    }
    if (event.type === "end") {
      s.ended = true;
      const text = exitText(event.process);
      if (event.process?.exit) host.dataset.exitCode = String(event.process.exit.exit_code);
      setState("exited", text);
      term.write(`\r\n\x1b[90m[${text}]\x1b[0m\r\n`);
      status(`terminal: ${text}`);
    } else if (event.type === "error") {
      term.write(`\r\n\x1b[31m[error: ${event.error ?? "unknown"}]\x1b[0m\r\n`);
      statusError("terminal", new Error(event.error ?? "unknown"));
    }
  });
  ws.addEventListener("close", (ev) => {
    if (s.closed || s.ended) return;
    setState("closed", `disconnected (${ev.code}${ev.reason ? ` ${ev.reason}` : ""})`);
    term.write(`\r\n\x1b[90m[disconnected: ${ev.code}${ev.reason ? ` ${ev.reason}` : ""}]\x1b[0m\r\n`);
  });
  ws.addEventListener("error", () => {
    if (!s.closed) statusError("terminal", new Error("the WebSocket failed (is the sandbox still running?)"));
  });
  term.onData((d) => send(s, encoder.encode(d)));
  term.onBinary((d) => send(s, Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)));
  term.onResize(({ rows, cols }) => send(s, JSON.stringify({ type: "resize", rows, cols })));
}

/** Hangs the shell up (SIGHUP to its group, as closing a terminal does) and detaches. */
export function closeTerminal(): void {
  const s = session;
  session = null;
  if (!s) return;
  s.closed = true;
  if (!s.ended) send(s, JSON.stringify({ type: "signal", signal: 1 }));
  s.ws?.close(1000);
  s.observer.disconnect();
  s.term.dispose();
  const host = byId("terminal");
  host.replaceChildren();
  host.hidden = true;
  setState("none", "");
}

export function setupTerminal(getSelected: () => string | null): void {
  byId("open-terminal").addEventListener("click", () => {
    const id = getSelected();
    if (id) void openTerminal(id);
  });
  byId("close-terminal").addEventListener("click", closeTerminal);
}
