// build.mjs — bundles the console into dist/ (committed, embedded in forkvmd):
// src/main.ts → dist/app.js, the CSS it imports (xterm's and src/style.css) →
// dist/app.css, src/index.html → dist/index.html. Deterministic: the same sources
// give byte-identical files (no timestamps, no absolute paths, no source maps).
// `node build.mjs --out DIR` builds into DIR instead (scripts/test builds there and
// compares with the committed dist/, so dist/ cannot drift from src/).

import { build } from "esbuild";
import { copyFile, mkdir, rm } from "node:fs/promises";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(fileURLToPath(import.meta.url));
const outAt = process.argv.indexOf("--out");
const dist = outAt > 0 && process.argv[outAt + 1] ? resolve(process.argv[outAt + 1]) : join(root, "dist");

await rm(dist, { recursive: true, force: true });
await mkdir(dist, { recursive: true });

await build({
  absWorkingDir: root,
  entryPoints: ["src/main.ts"],
  outfile: relative(root, join(dist, "app.js")),
  bundle: true,
  format: "iife",
  platform: "browser",
  target: ["es2020"],
  minify: true,
  sourcemap: false,
  legalComments: "eof",
  charset: "utf8",
  metafile: false,
  logLevel: "warning",
  define: { "process.env.NODE_ENV": '"production"' },
});

await copyFile(join(root, "src/index.html"), join(dist, "index.html"));
console.log(`built ${relative(root, dist) || "."}/{index.html,app.js,app.css}`);
