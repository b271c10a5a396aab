// consolelog.ts — the #console-log pane: the end (64 KiB) of the selected sandbox's
// serial console, fetched on selection and on the refresh button, shown as text.

import { api } from "./api";
import { byId } from "./dom";
import { statusError } from "./status";

let sandbox: string | null = null;
let generation = 0;

export function openConsole(id: string): void {
  sandbox = id;
  const pre = byId("console-log");
  pre.textContent = "";
  delete pre.dataset.loaded;
  void load();
}

export function closeConsole(): void {
  sandbox = null;
  generation++;
  byId("console-log").textContent = "";
}

async function load(): Promise<void> {
  const id = sandbox;
  if (!id) return;
  const gen = ++generation;
  const pre = byId("console-log");
  pre.setAttribute("aria-busy", "true");
  try {
    const text = await api.console(id, 65536);
    if (gen !== generation) return;
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    pre.textContent = text || "(the console log is empty)";
    if (atBottom || !pre.dataset.loaded) pre.scrollTop = pre.scrollHeight;
    pre.dataset.loaded = "1";
  } catch (e) {
    if (gen === generation) statusError("console log", e);
  } finally {
    if (gen === generation) pre.removeAttribute("aria-busy");
  }
}

export function setupConsole(): void {
  byId("console-refresh").addEventListener("click", () => void load());
}
