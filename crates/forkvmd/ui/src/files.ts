// files.ts — the #files browser of the selected sandbox's guest filesystem: one
// `li[data-path]` per entry of the current directory; a directory opens on click,
// "up" goes to the parent. Names come from the guest and are shown as text only.

import { api, type FileEntry } from "./api";
import { h, byId } from "./dom";
import { bytes } from "./format";
import { statusError } from "./status";

let sandbox: string | null = null;
let current = "/";
let generation = 0;

function join(dir: string, name: string): string {
  return dir.endsWith("/") ? dir + name : `${dir}/${name}`;
}

function parent(path: string): string {
  const trimmed = path.replace(/\/+$/, "");
  const i = trimmed.lastIndexOf("/");
  return i <= 0 ? "/" : trimmed.slice(0, i);
}

const ORDER: Record<string, number> = { dir: 0, symlink: 1, file: 2, other: 3 };

export function openFiles(id: string, path = "/"): void {
  sandbox = id;
  void load(path);
}

export function closeFiles(): void {
  sandbox = null;
  generation++;
  byId("files-list").replaceChildren();
  byId("files-path").textContent = "/";
}

export function reloadFiles(): void {
  if (sandbox) void load(current);
}

async function load(path: string): Promise<void> {
  const id = sandbox;
  if (!id) return;
  const gen = ++generation;
  const root = byId("files");
  root.setAttribute("aria-busy", "true");
  try {
    const entries = await api.listFiles(id, path);
    if (gen !== generation) return;
    current = path;
    root.dataset.currentPath = path;
    byId("files-path").textContent = path;
    (byId("files-up") as HTMLButtonElement).disabled = path === "/";
    render(entries);
  } catch (e) {
    if (gen === generation) statusError(`listing ${path}`, e);
  } finally {
    if (gen === generation) root.removeAttribute("aria-busy");
  }
}

function render(entries: FileEntry[]): void {
  const sorted = [...entries].sort((a, b) => (ORDER[a.type] ?? 9) - (ORDER[b.type] ?? 9) || a.name.localeCompare(b.name));
  const items = sorted.map((e) => {
    const path = join(current, e.name);
    const li = h(
      "li",
      { "data-path": path, "data-type": e.type, class: `file type-${e.type.replace(/[^a-z]/g, "")}`, title: path },
      h("span", { class: "fname" }, e.type === "dir" ? `${e.name}/` : e.type === "symlink" ? `${e.name} →` : e.name),
      h("span", { class: "fsize" }, e.type === "file" ? bytes(e.size) : ""),
      h("span", { class: "fmode" }, (e.mode & 0o7777).toString(8).padStart(4, "0")),
    );
    if (e.type === "dir") {
      li.classList.add("clickable");
      li.tabIndex = 0;
      li.addEventListener("click", () => void load(path));
      li.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter") void load(path);
      });
    }
    return li;
  });
  const list = byId("files-list");
  list.replaceChildren(...items);
  if (!items.length) list.appendChild(h("li", { class: "empty" }, "(empty)"));
}

export function setupFiles(): void {
  byId("files-up").addEventListener("click", () => {
    if (sandbox) void load(parent(current));
  });
  byId("files-refresh").addEventListener("click", reloadFiles);
}
