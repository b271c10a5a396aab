// tables.ts — the #sandboxes and #snapshots tables: one row per object, keyed by
// data-sandbox-id / data-snapshot-tag, redrawn only when the data changed so a
// selection or a hover survives the 3-second refresh.

import type { SandboxInfo, SnapshotInfo } from "./api";
import { h, byId } from "./dom";
import { age, bytes, isoTime, mib } from "./format";

let lastSandboxes = "";
let lastSnapshots = "";

function cell(text: string, cls?: string, title?: string): HTMLTableCellElement {
  return h("td", { class: cls, title }, text);
}

function stateCell(state: string): HTMLTableCellElement {
  return h("td", {}, h("span", { class: `badge state-${state.replace(/[^a-z_-]/gi, "")}` }, state));
}

/** `guestMemory`: each snapshot's guest memory by tag (a sandbox has its snapshot's). */
export function renderSandboxes(
  list: SandboxInfo[],
  guestMemory: Map<string, number>,
  selected: string | null,
  onSelect: (id: string) => void,
): void {
  const key = JSON.stringify(list) + "|" + JSON.stringify([...guestMemory]) + "|" + Math.floor(Date.now() / 10000);
  const tbody = byId("sandboxes").querySelector("tbody") as HTMLTableSectionElement;
  if (key !== lastSandboxes) {
    lastSandboxes = key;
    const rows = [...list]
      .sort((a, b) => a.created_at_unix - b.created_at_unix || a.id.localeCompare(b.id))
      .map((sb) => {
        const origin = sb.forked_from ? `fork of ${sb.forked_from}` : sb.snapshot_tag ?? "–";
        const tr = h(
          "tr",
          { "data-sandbox-id": sb.id, tabindex: 0 },
          cell(sb.id, "mono"),
          stateCell(sb.state),
          memoryCell(sb, guestMemory),
          cell(`${sb.template ?? "–"} / ${origin}`, undefined, sb.reason ?? undefined),
          cell(age(sb.created_at_unix), "num", isoTime(sb.created_at_unix)),
        );
        tr.addEventListener("click", () => onSelect(sb.id));
        tr.addEventListener("keydown", (ev) => {
          if (ev.key === "Enter" || ev.key === " ") {
            ev.preventDefault();
            onSelect(sb.id);
          }
        });
        return tr;
      });
    tbody.replaceChildren(...rows);
    if (!rows.length) tbody.appendChild(h("tr", { class: "empty" }, h("td", { colspan: 5 }, "no sandboxes")));
  }
  markSelected(selected);
  byId("sandboxes-count").textContent = String(list.length);
}

function memoryCell(sb: SandboxInfo, guestMemory: Map<string, number>): HTMLTableCellElement {
  const guest = sb.snapshot_tag ? guestMemory.get(sb.snapshot_tag) : undefined;
  const limit = sb.memory_limit_mib ? `limit ${mib(sb.memory_limit_mib)}` : "no memory limit";
  return cell(guest !== undefined ? bytes(guest) : sb.memory_limit_mib ? mib(sb.memory_limit_mib) : "–", "num", limit);
}

export function markSelected(selected: string | null): void {
  for (const tr of byId("sandboxes").querySelectorAll<HTMLTableRowElement>("tr[data-sandbox-id]")) {
    tr.classList.toggle("selected", tr.dataset.sandboxId === selected);
  }
}

export function renderSnapshots(list: SnapshotInfo[]): void {
  const key = JSON.stringify(list) + "|" + Math.floor(Date.now() / 10000);
  if (key === lastSnapshots) return;
  lastSnapshots = key;
  const tbody = byId("snapshots").querySelector("tbody") as HTMLTableSectionElement;
  const rows = [...list]
    .sort((a, b) => a.created_at_unix - b.created_at_unix || a.tag.localeCompare(b.tag))
    .map((sn) =>
      h(
        "tr",
        { "data-snapshot-tag": sn.tag, title: sn.warning ?? undefined },
        cell(sn.tag, "mono"),
        stateCell(sn.status),
        cell(sn.mode ?? "–"),
        cell(bytes(sn.memory_logical_bytes), "num"),
        cell(bytes(sn.memory_physical_bytes), "num"),
        cell(sn.branched_from ?? "–", "mono"),
        cell(age(sn.created_at_unix), "num", isoTime(sn.created_at_unix)),
      ),
    );
  tbody.replaceChildren(...rows);
  if (!rows.length) tbody.appendChild(h("tr", { class: "empty" }, h("td", { colspan: 7 }, "no snapshots")));
  byId("snapshots-count").textContent = String(list.length);
}
