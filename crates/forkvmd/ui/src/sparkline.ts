// sparkline.ts — a minimal inline-SVG line chart: one <polyline> (and a faint area
// under it) in a fixed viewBox, redrawn from an array of numbers.

import { s } from "./dom";

const W = 120;
const H = 32;

/** Draws `values` (oldest first, `capacity` slots wide) into `svg`, 0..max high. */
export function drawSpark(svg: SVGSVGElement, values: number[], max: number, capacity = 60): void {
  if (!svg.querySelector("polyline")) {
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.replaceChildren(s("polygon", { class: "area" }), s("polyline", { class: "line" }));
  }
  const top = max > 0 ? max : 1;
  const step = W / Math.max(1, capacity - 1);
  const x0 = W - step * (values.length - 1);
  const pts = values.map((v, i) => {
    const y = H - 1 - Math.max(0, Math.min(1, v / top)) * (H - 2);
    return `${(x0 + i * step).toFixed(1)},${y.toFixed(1)}`;
  });
  svg.querySelector("polyline")!.setAttribute("points", pts.join(" "));
  const area = values.length ? `${x0.toFixed(1)},${H} ${pts.join(" ")} ${W},${H}` : "";
  svg.querySelector("polygon")!.setAttribute("points", area);
}
