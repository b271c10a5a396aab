// detail.ts — the #detail panel of the selected sandbox: its facts, and the console
// log, files, metrics and terminal panes, opened when a sandbox is selected and
// closed when the selection goes away.

import type { SandboxInfo } from "./api";
import { h, byId } from "./dom";
import { age, isoTime, mib } from "./format";
import { openConsole, closeConsole } from "./consolelog";
import { openFiles, closeFiles } from "./files";
import { startMetrics, stopMetrics } from "./metrics";
import { closeTerminal } from "./terminal";

let shown: string | null = null;

function facts(sb: SandboxInfo): HTMLElement[] {
  const rows: [string, string][] = [
    ["state", sb.state + (sb.reason ? ` (${sb.reason})` : "")],
    ["template", sb.template ?? "–"],
    ["snapshot", sb.snapshot_tag ?? "–"],
    ["forked from", sb.forked_from ?? "–"],
    ["memory limit", sb.memory_limit_mib ? mib(sb.memory_limit_mib) : "–"],
    ["vCPUs", sb.vcpus ? String(sb.vcpus) : "–"],
    ["branches", String(sb.branch_count ?? 0)],
    ["created", `${isoTime(sb.created_at_unix)} (${age(sb.created_at_unix)} ago)`],
  ];
  return rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]);
}

/** Shows `sb`; the panes reload only when the sandbox changed. */
export function showDetail(sb: SandboxInfo): void {
  const panel = byId("detail");
  panel.setAttribute("data-sandbox-id", sb.id);
  panel.dataset.state = sb.state;
  byId("detail-empty").hidden = true;
  byId("detail-body").hidden = false;
  byId("detail-title").textContent = sb.id;
  byId("detail-facts").replaceChildren(...facts(sb));
  if (shown === sb.id) return;
  shown = sb.id;
  closeTerminal();
  openConsole(sb.id);
  openFiles(sb.id, "/");
  startMetrics(sb.id);
}

export function clearDetail(): void {
  const panel = byId("detail");
  panel.removeAttribute("data-sandbox-id");
  delete panel.dataset.state;
  byId("detail-empty").hidden = false;
  byId("detail-body").hidden = true;
  if (shown === null) return;
  shown = null;
  closeTerminal();
  closeConsole();
  closeFiles();
  stopMetrics();
}
