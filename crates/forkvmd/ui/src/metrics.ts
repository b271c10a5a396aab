// metrics.ts — live usage of the selected sandbox: polls /usage every 2 s, keeps the
// last 60 samples, and draws memory and CPU (from cumulative-CPU deltas) as the
// #spark-mem and #spark-cpu sparklines with their current values.

import { api, ApiError, type Usage } from "./api";
import { byId } from "./dom";
import { bytes } from "./format";
import { drawSpark } from "./sparkline";

const CAPACITY = 60;
const PERIOD_MS = 2000;

let sandbox: string | null = null;
let timer: number | undefined;
let samples: Usage[] = [];
let generation = 0;

export function startMetrics(id: string): void {
  stopMetrics();
  sandbox = id;
  samples = [];
  draw();
  byId("metrics-note").textContent = "";
  const gen = ++generation;
  const tick = async () => {
    if (gen !== generation) return;
    try {
      const u = await api.usage(id);
      if (gen !== generation) return;
      samples.push(u);
      if (samples.length > CAPACITY + 1) samples.shift();
      byId("metrics-note").textContent = "";
      draw();
    } catch (e) {
      if (gen !== generation) return;
      byId("metrics-note").textContent =
        e instanceof ApiError && e.status === 404 ? "usage: not available (404)" : `usage: ${(e as Error).message}`;
    }
    if (gen === generation) timer = window.setTimeout(tick, PERIOD_MS);
  };
  void tick();
}

export function stopMetrics(): void {
  generation++;
  sandbox = null;
  if (timer !== undefined) clearTimeout(timer);
  timer = undefined;
}

/** CPU use between samples in percent of one CPU. */
function cpuSeries(): number[] {
  const out: number[] = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = samples[i].at_unix_ms - samples[i - 1].at_unix_ms;
    const du = samples[i].cpu_usage_usec - samples[i - 1].cpu_usage_usec;
    out.push(dt > 0 && du >= 0 ? (du / (dt * 1000)) * 100 : 0);
  }
  return out;
}

function draw(): void {
  const memEl = byId("spark-mem") as unknown as SVGSVGElement;
  const cpuEl = byId("spark-cpu") as unknown as SVGSVGElement;
  const mem = samples.slice(-CAPACITY).map((u) => u.memory_bytes);
  const last = samples[samples.length - 1];
  const limit = last?.memory_limit_bytes ?? null;
  const memMax = limit ?? Math.max(1, ...mem) * 1.25;
  drawSpark(memEl, mem, memMax, CAPACITY);
  byId("mem-value").textContent = last ? `${bytes(last.memory_bytes)}${limit ? ` / ${bytes(limit)}` : ""}` : "–";
  const cpu = cpuSeries().slice(-CAPACITY);
  const vcpus = Math.max(1, last?.vcpus ?? 1);
  drawSpark(cpuEl, cpu, vcpus * 100, CAPACITY);
  const now = cpu[cpu.length - 1];
  byId("cpu-value").textContent = now === undefined ? "–" : `${now.toFixed(1)}% (${vcpus} vCPU${vcpus > 1 ? "s" : ""})`;
  if (sandbox) memEl.dataset.samples = String(mem.length);
}
