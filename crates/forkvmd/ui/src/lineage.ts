// lineage.ts — the #lineage graph: snapshots and sandboxes as nodes (different
// shapes), spawn/fork/branch/chain edges (different strokes), laid out by layout.ts
// into one SVG that #lineage scrolls over (drag pans too), zoomed by Ctrl+wheel or
// fitted to the pane. A click on a sandbox node selects that sandbox. The SVG is
// rebuilt only when the data changed, and the zoom and scroll survive rebuilds.

import type { EdgeKind, Lineage, LineageNode } from "./api";
import { s, byId } from "./dom";
import { bytes } from "./format";
import { layout, type Point } from "./layout";

const NODE_W = 184;
const NODE_H = 46;
const MARGIN = 24;
const KINDS: EdgeKind[] = ["spawn", "fork", "branch", "chain"];

let svg: SVGSVGElement | null = null;
let viewport: SVGGElement | null = null;
let zoom = 1;
let size = { w: 0, h: 0 };
let lastKey = "";
let fitted = false;
let selectHandler: (id: string) => void = () => {};

/** The graph is drawn at `zoom` and #lineage scrolls over it (so any node can be scrolled into view). */
function applyZoom(): void {
  if (!svg) return;
  svg.setAttribute("viewBox", `0 0 ${size.w.toFixed(1)} ${size.h.toFixed(1)}`);
  svg.setAttribute("width", (size.w * zoom).toFixed(1));
  svg.setAttribute("height", (size.h * zoom).toFixed(1));
}

/**
 * Scales the whole graph into the pane (never above 1:1); with `minScale`, a graph
 * that would need less is shown at that scale, still readable, to scroll over.
 */
export function fit(minScale = 0.05): void {
  const host = byId("lineage");
  const cw = host.clientWidth - 2;
  const ch = host.clientHeight - 2;
  if (!svg || cw <= 0 || ch <= 0 || !size.w) return;
  zoom = Math.max(minScale, Math.min(1, cw / size.w, ch / size.h));
  applyZoom();
  host.scrollTo(0, 0);
}

export function resetZoom(): void {
  zoomAround(1, 0, 0);
}

/** Sets the zoom keeping the graph point under (px, py) of the pane where it is. */
function zoomAround(k: number, px: number, py: number): void {
  const host = byId("lineage");
  const gx = (host.scrollLeft + px) / zoom;
  const gy = (host.scrollTop + py) / zoom;
  zoom = Math.min(4, Math.max(0.05, k));
  applyZoom();
  host.scrollLeft = gx * zoom - px;
  host.scrollTop = gy * zoom - py;
}

function truncate(t: string, n: number): string {
  return t.length > n ? `${t.slice(0, n - 1)}…` : t;
}

function cls(t: string): string {
  return t.replace(/[^a-z0-9_-]/gi, "");
}

function subtitle(n: LineageNode): string {
  const parts = [n.state];
  if (n.kind === "snapshot") {
    if (n.mode) parts.push(n.mode === "diff" && n.chain_depth ? `diff d${n.chain_depth}` : n.mode);
    parts.push(bytes(n.stored_bytes ?? n.memory_bytes));
  } else {
    parts.push(bytes(n.memory_bytes));
  }
  return parts.join(" · ");
}

function tooltip(n: LineageNode): string {
  const lines = [`${n.kind} ${n.name}`, `state: ${n.state}`, `memory: ${bytes(n.memory_bytes)}`];
  if (n.stored_bytes !== null && n.stored_bytes !== undefined) lines.push(`stored: ${bytes(n.stored_bytes)}`);
  if (n.mode) lines.push(`mode: ${n.mode}`);
  if (n.chain_depth) lines.push(`chain depth: ${n.chain_depth}`);
  return lines.join("\n");
}

function pathThrough(pts: Point[]): string {
  let d = `M${pts[0].x.toFixed(1)},${pts[0].y.toFixed(1)}`;
  for (let i = 1; i < pts.length; i++) {
    const a = pts[i - 1];
    const b = pts[i];
    const mx = (a.x + b.x) / 2;
    d += ` C${mx.toFixed(1)},${a.y.toFixed(1)} ${mx.toFixed(1)},${b.y.toFixed(1)} ${b.x.toFixed(1)},${b.y.toFixed(1)}`;
  }
  return d;
}

function ensureSvg(): void {
  if (svg) return;
  const host = byId("lineage");
  const defs = s("defs");
  for (const k of KINDS) {
    defs.appendChild(
      s(
        "marker",
        { id: `arrow-${k}`, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
        s("path", { d: "M0,0 L10,5 L0,10 z", class: `arrow kind-${k}` }),
      ),
    );
  }
  viewport = s("g", { class: "viewport" });
  svg = s("svg", { xmlns: "http://www.w3.org/2000/svg", role: "img", "aria-label": "lineage graph" }, defs, viewport);
  host.replaceChildren(svg);
  setupPanZoom(svg);
}

let dragged = false;

function setupPanZoom(el: SVGSVGElement): void {
  const host = byId("lineage");
  let start: { px: number; py: number; left: number; top: number } | null = null;
  el.addEventListener("pointerdown", (ev) => {
    if (ev.button !== 0) return;
    start = { px: ev.clientX, py: ev.clientY, left: host.scrollLeft, top: host.scrollTop };
    dragged = false;
  });
  window.addEventListener("pointermove", (ev) => {
    if (!start) return;
    const dx = ev.clientX - start.px;
    const dy = ev.clientY - start.py;
    if (!dragged && Math.hypot(dx, dy) < 4) return;
    dragged = true;
    el.classList.add("panning");
    host.scrollLeft = start.left - dx;
    host.scrollTop = start.top - dy;
  });
  window.addEventListener("pointerup", () => {
    start = null;
    el.classList.remove("panning");
  });
  // The wheel scrolls; with Ctrl (or a pinch, which browsers send as Ctrl+wheel) it zooms.
  host.addEventListener(
    "wheel",
    (ev) => {
      if (!ev.ctrlKey && !ev.metaKey) return;
      ev.preventDefault();
      const r = host.getBoundingClientRect();
      zoomAround(zoom * Math.exp(-ev.deltaY * 0.002), ev.clientX - r.left, ev.clientY - r.top);
    },
    { passive: false },
  );
  el.addEventListener("click", (ev) => {
    if (dragged) {
      dragged = false;
      return;
    }
    const g = (ev.target as Element).closest?.("g.node") as SVGGElement | null;
    const id = g?.getAttribute("data-node") ?? "";
    if (id.startsWith("sandbox:")) selectHandler(id.slice("sandbox:".length));
  });
}

export function setLineageError(message: string): void {
  byId("lineage-note").textContent = message;
}

export function renderLineage(data: Lineage, selected: string | null, onSelect: (id: string) => void): void {
  selectHandler = onSelect;
  ensureSvg();
  setLineageError(data.nodes.length ? "" : "nothing yet: create a snapshot and a sandbox");
  const key = JSON.stringify(data);
  if (key !== lastKey) {
    lastKey = key;
    draw(data);
  }
  markSelected(selected);
}

export function markSelected(selected: string | null): void {
  if (!viewport) return;
  const want = selected === null ? null : `sandbox:${selected}`;
  for (const g of viewport.querySelectorAll<SVGGElement>("g.node")) {
    g.classList.toggle("selected", g.getAttribute("data-node") === want);
  }
}

function draw(data: Lineage): void {
  const nodes = [...data.nodes].sort((a, b) => a.created_at_unix - b.created_at_unix || a.id.localeCompare(b.id));
  const result = layout({
    ids: nodes.map((n) => n.id),
    edges: data.edges,
    nodeWidth: NODE_W,
    nodeHeight: NODE_H,
    rankGap: 70,
    rowGap: 14,
  });
  size = { w: result.width + 2 * MARGIN, h: result.height + 2 * MARGIN };
  const edgeLayer = s("g", { class: "edges" });
  data.edges.forEach((e, i) => {
    const pts = result.edges[i];
    if (!pts || !result.nodes.has(e.from) || !result.nodes.has(e.to)) return;
    edgeLayer.appendChild(
      s(
        "path",
        {
          class: `edge kind-${cls(e.kind)}`,
          "data-from": e.from,
          "data-to": e.to,
          "data-kind": e.kind,
          d: pathThrough(pts.map((p) => ({ x: p.x + MARGIN, y: p.y + MARGIN }))),
          "marker-end": KINDS.includes(e.kind) ? `url(#arrow-${e.kind})` : null,
        },
        s("title", {}, `${e.kind}: ${e.from} → ${e.to}`),
      ),
    );
  });
  const nodeLayer = s("g", { class: "nodes" });
  for (const n of nodes) {
    const p = result.nodes.get(n.id);
    if (!p) continue;
    const x = p.x + MARGIN - NODE_W / 2;
    const y = p.y + MARGIN - NODE_H / 2;
    const g = s(
      "g",
      {
        class: `node ${cls(n.kind)} state-${cls(n.state)}${n.mode ? ` mode-${cls(n.mode)}` : ""}`,
        "data-node": n.id,
        transform: `translate(${x.toFixed(1)},${y.toFixed(1)})`,
      },
      s("title", {}, tooltip(n)),
      s("rect", {
        class: "shape",
        width: NODE_W,
        height: NODE_H,
        rx: n.kind === "sandbox" ? NODE_H / 2 : 3,
      }),
      n.kind === "snapshot" ? s("rect", { class: "stripe", width: 6, height: NODE_H, rx: 2 }) : null,
      s("text", { class: "name", x: NODE_W / 2, y: 19 }, truncate(n.name, 24)),
      s("text", { class: "sub", x: NODE_W / 2, y: 35 }, subtitle(n)),
    );
    nodeLayer.appendChild(g);
  }
  viewport!.replaceChildren(edgeLayer, nodeLayer);
  applyZoom();
  if (!fitted && nodes.length) {
    fitted = true;
    requestAnimationFrame(() => fit(0.6));
  }
}
