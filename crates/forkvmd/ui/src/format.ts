// format.ts — how numbers and times read on the page: byte sizes in binary units
// ("512 MiB") and ages ("3m", "2h").

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) return "–";
  let v = n;
  let i = 0;
  while (v >= 1024 && i < UNITS.length - 1) {
    v /= 1024;
    i++;
  }
  const s = i === 0 ? String(v) : String(Number(v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)));
  return `${s} ${UNITS[i]}`;
}

export function mib(n: number | null | undefined): string {
  return n === null || n === undefined ? "–" : bytes(n * 1024 * 1024);
}

/** Seconds since `unix` (seconds) as "42s", "3m", "5h", "2d". */
export function age(unix: number, nowMs = Date.now()): string {
  const s = Math.max(0, Math.floor(nowMs / 1000 - unix));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

export function isoTime(unix: number): string {
  return new Date(unix * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}
