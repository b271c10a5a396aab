// layout.ts — a small layered (Sugiyama-style) graph layout for the lineage view,
// left to right: ranks by longest path, long edges split by dummy points, rows
// ordered by barycenter sweeps, then positions pulled toward their neighbours. It
// replaces a general layout library to keep the bundle small; a lineage is a DAG of
// at most a few hundred nodes, where this is quick and reads well.

export interface LayoutInput {
  ids: string[];
  edges: { from: string; to: string }[];
  nodeWidth: number;
  nodeHeight: number;
  rankGap: number;
  rowGap: number;
}

export interface Point {
  x: number;
  y: number;
}

export interface LayoutResult {
  /** Centre of each node. */
  nodes: Map<string, Point>;
  /** For each input edge (same index), the points its line goes through. */
  edges: Point[][];
  width: number;
  height: number;
}

interface V {
  id: string;
  dummy: boolean;
  rank: number;
  order: number;
  y: number;
  preds: V[];
  succs: V[];
  /** A block of leaves sharing one parent, laid out as a grid (see PACK_*). */
  members?: V[];
  cols?: number;
}

/** More leaves than this under one parent are packed into a grid of columns... */
const PACK_MIN = 8;
/** ...of at most this many columns. */
const PACK_MAX_COLS = 4;
const COL_GAP = 16;

export function layout(input: LayoutInput): LayoutResult {
  const { nodeWidth: W, nodeHeight: H, rankGap, rowGap } = input;
  const vs = new Map<string, V>();
  for (const id of input.ids) vs.set(id, { id, dummy: false, rank: 0, order: 0, y: 0, preds: [], succs: [] });
  const edges = input.edges.filter((e) => vs.has(e.from) && vs.has(e.to) && e.from !== e.to);

  // Ranks: longest path from the sources (Kahn's order); nodes on a cycle, which a
  // lineage should not have, keep the rank their processed parents give them.
  const indeg = new Map<string, number>();
  const out = new Map<string, string[]>();
  for (const id of vs.keys()) {
    indeg.set(id, 0);
    out.set(id, []);
  }
  for (const e of edges) {
    indeg.set(e.to, (indeg.get(e.to) ?? 0) + 1);
    out.get(e.from)!.push(e.to);
  }
  const queue = [...vs.keys()].filter((id) => indeg.get(id) === 0);
  for (let i = 0; i < queue.length; i++) {
    const u = vs.get(queue[i])!;
    for (const t of out.get(u.id)!) {
      const v = vs.get(t)!;
      v.rank = Math.max(v.rank, u.rank + 1);
      const d = indeg.get(t)! - 1;
      indeg.set(t, d);
      if (d === 0) queue.push(t);
    }
  }

  // Edges spanning several ranks go through one dummy per rank in between.
  const chains: V[][] = [];
  let dummies = 0;
  for (const e of edges) {
    const a = vs.get(e.from)!;
    const b = vs.get(e.to)!;
    const chain = [a];
    if (b.rank > a.rank) {
      for (let r = a.rank + 1; r < b.rank; r++) {
        const d: V = { id: `\u0000d${dummies++}`, dummy: true, rank: r, order: 0, y: 0, preds: [], succs: [] };
        chain.push(d);
      }
    }
    chain.push(b);
    for (let i = 0; i + 1 < chain.length; i++) {
      if (chain[i + 1].rank > chain[i].rank) {
        chain[i].succs.push(chain[i + 1]);
        chain[i + 1].preds.push(chain[i]);
      }
    }
    chains.push(chain);
  }

  const all: V[] = [...vs.values()];
  for (const c of chains) for (const v of c) if (v.dummy) all.push(v);
  const maxRank = all.reduce((m, v) => Math.max(m, v.rank), 0);
  const layers: V[][] = Array.from({ length: maxRank + 1 }, () => []);
  for (const v of all) layers[v.rank].push(v);
  layers.forEach((l) => l.forEach((v, i) => (v.order = i)));

  // Order within ranks: barycenter sweeps down and up.
  const bary = (v: V, ns: V[]) => (ns.length ? ns.reduce((s, n) => s + n.order, 0) / ns.length : v.order);
  for (let iter = 0; iter < 8; iter++) {
    const down = iter % 2 === 0;
    const seq = down ? layers.slice(1) : layers.slice(0, -1).reverse();
    for (const layer of seq) {
      const key = new Map(layer.map((v) => [v, bary(v, down ? v.preds : v.succs)]));
      layer.sort((a, b) => key.get(a)! - key.get(b)! || a.order - b.order);
      layer.forEach((v, i) => (v.order = i));
    }
  }

  // Fan-outs (a fork of 20, 50 sandboxes spawned from one snapshot) would make very
  // tall columns: leaves with the same single parent become one block, a grid of up
  // to PACK_MAX_COLS columns, placed as one tall vertex.
  const blockOf = new Map<V, V>();
  layers.forEach((layer, r) => {
    const groups = new Map<V, V[]>();
    for (const v of layer) {
      if (v.dummy || v.succs.length || v.preds.length !== 1) continue;
      const g = groups.get(v.preds[0]) ?? [];
      g.push(v);
      groups.set(v.preds[0], g);
    }
    for (const [parent, members] of groups) {
      if (members.length <= PACK_MIN) continue;
      const cols = Math.min(PACK_MAX_COLS, Math.ceil(members.length / PACK_MIN));
      const block: V = { id: `\u0000b${blockOf.size}`, dummy: false, rank: r, order: 0, y: 0, preds: [parent], succs: [], members, cols };
      for (const m of members) blockOf.set(m, block);
      const set = new Set(members);
      const rest = layers[r].filter((v) => v === members[0] || !set.has(v));
      rest[rest.indexOf(members[0])] = block;
      layers[r] = rest;
    }
  });
  layers.forEach((l) => l.forEach((v, i) => (v.order = i)));
  const blockRows = (b: V) => Math.ceil(b.members!.length / b.cols!);

  // Rows: start stacked, then pull each node toward its neighbours' mean while
  // keeping the order and the minimum gaps.
  const size = (v: V) => (v.dummy ? 6 : v.members ? blockRows(v) * (H + rowGap) - rowGap : H);
  const gap = (a: V, b: V) => (size(a) + size(b)) / 2 + (a.dummy || b.dummy ? rowGap / 2 : rowGap);
  for (const layer of layers) {
    let y = 0;
    layer.forEach((v, i) => {
      if (i > 0) y += gap(layer[i - 1], v);
      v.y = y;
    });
  }
  const place = (layer: V[], want: number[]) => {
    const n = layer.length;
    if (!n) return;
    const y = want.slice();
    for (let i = 1; i < n; i++) y[i] = Math.max(y[i], y[i - 1] + gap(layer[i - 1], layer[i]));
    // Shift the whole row back so it sits on its wishes on average.
    let shift = 0;
    for (let i = 0; i < n; i++) shift += y[i] - want[i];
    shift /= n;
    for (let i = 0; i < n; i++) layer[i].y = y[i] - shift;
  };
  // A parent looks at its children's (or blocks') centres, not at the packed members.
  const succsOf = (v: V) => [...new Set(v.succs.map((c) => blockOf.get(c) ?? c))];
  const mean = (v: V, ns: V[]) => (ns.length ? ns.reduce((s, n) => s + n.y, 0) / ns.length : v.y);
  for (let iter = 0; iter < 6; iter++) {
    for (const layer of layers.slice(1)) place(layer, layer.map((v) => mean(v, v.preds)));
    for (const layer of layers.slice(0, -1).reverse()) place(layer, layer.map((v) => mean(v, succsOf(v))));
  }
  for (const layer of layers) place(layer, layer.map((v) => (mean(v, v.preds) + mean(v, succsOf(v))) / 2));

  // Columns: each rank as wide as its widest block.
  const rankLeft: number[] = [];
  let left = 0;
  for (const layer of layers) {
    rankLeft.push(left);
    const cols = layer.reduce((m, v) => Math.max(m, v.cols ?? 1), 1);
    left += cols * W + (cols - 1) * COL_GAP + rankGap;
  }
  const width = Math.max(W, left - rankGap);

  // Final centres; members of a block in reading order, row by row.
  const centre = new Map<V, Point>();
  let minY = Infinity;
  let maxY = -Infinity;
  for (const layer of layers) {
    for (const v of layer) {
      minY = Math.min(minY, v.y - size(v) / 2);
      maxY = Math.max(maxY, v.y + size(v) / 2);
      const x = rankLeft[v.rank] + W / 2;
      if (!v.members) {
        centre.set(v, { x, y: v.y });
        continue;
      }
      const top = v.y - size(v) / 2;
      v.members.forEach((m, i) => {
        const col = i % v.cols!;
        const row = Math.floor(i / v.cols!);
        centre.set(m, { x: x + col * (W + COL_GAP), y: top + row * (H + rowGap) + H / 2 });
      });
    }
  }
  if (!isFinite(minY)) minY = maxY = 0;
  const at = (v: V): Point => {
    const c = centre.get(v)!;
    return { x: c.x, y: c.y - minY };
  };
  const nodes = new Map<string, Point>();
  for (const v of vs.values()) nodes.set(v.id, at(v));
  const edgePoints = chains.map((c) => {
    const pts = c.map(at);
    pts[0] = { x: pts[0].x + W / 2, y: pts[0].y };
    const last = pts.length - 1;
    const end = c[last];
    const target = { x: pts[last].x - W / 2, y: pts[last].y };
    const block = blockOf.get(end);
    // Into a packed member: reach the block's first column at the member's row, then
    // run straight along the row (behind the nodes before it).
    const firstColLeft = rankLeft[end.rank];
    if (block && target.x > firstColLeft + 1) {
      pts[last] = { x: firstColLeft - 2, y: target.y };
      pts.push(target);
    } else {
      pts[last] = target;
    }
    return pts;
  });
  return { nodes, edges: edgePoints, width, height: maxY - minY };
}
