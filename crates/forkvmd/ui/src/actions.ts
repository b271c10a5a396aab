// actions.ts — the buttons that change the selected sandbox: fork N, branch (live,
// full or diff), archive and kill. Each runs one API call with the buttons disabled,
// reports the outcome in #status and refreshes the lists.

import { api } from "./api";
import { byId } from "./dom";
import { status, statusError } from "./status";

const BUTTONS = ["fork", "branch", "archive", "kill"];

function setBusy(busy: boolean): void {
  for (const id of BUTTONS) (byId(id) as HTMLButtonElement).disabled = busy;
  byId("actions").toggleAttribute("aria-busy", busy);
}

export function setupActions(getSelected: () => string | null, refresh: () => Promise<void>): void {
  const run = async (what: string, fn: (id: string) => Promise<string>) => {
    const id = getSelected();
    if (!id) return;
    setBusy(true);
    status(`${what} ${id} …`);
    try {
      const message = await fn(id);
      status(message, "ok");
    } catch (e) {
      statusError(`${what} ${id}`, e);
    } finally {
      setBusy(false);
      await refresh();
    }
  };

  byId("fork").addEventListener("click", () =>
    run("fork", async (id) => {
      const input = byId("fork-n") as HTMLInputElement;
      const n = Math.max(1, Math.min(1000, Math.floor(Number(input.value) || 1)));
      input.value = String(n);
      const made = await api.fork(id, n);
      const ids = made.map((s) => s.id);
      const shown = ids.length > 8 ? `${ids.slice(0, 8).join(", ")} … (+${ids.length - 8})` : ids.join(", ");
      return `forked ${id} into ${made.length}: ${shown}`;
    }),
  );
  byId("branch").addEventListener("click", () =>
    run("branch", async (id) => {
      const mode = (byId("branch-mode") as HTMLSelectElement).value;
      const snap = await api.branch(id, mode);
      return `branched ${id} into snapshot ${snap.tag} (${snap.mode ?? mode}, ${snap.status})`;
    }),
  );
  byId("archive").addEventListener("click", () =>
    run("archive", async (id) => {
      await api.archive(id);
      return `archived ${id}`;
    }),
  );
  // Kill loses the sandbox, so it takes two clicks: the first arms the button for a few
  // seconds (for that sandbox only), the second kills. No confirm() dialog: the page is
  // driven headless too.
  const kill = byId("kill") as HTMLButtonElement;
  const label = kill.textContent ?? "Kill";
  let armed: { id: string; timer: number } | null = null;
  const disarm = () => {
    if (armed) window.clearTimeout(armed.timer);
    armed = null;
    kill.textContent = label;
    delete kill.dataset.armed;
  };
  kill.addEventListener("click", () => {
    const id = getSelected();
    if (!id) return;
    if (armed?.id !== id) {
      disarm();
      armed = { id, timer: window.setTimeout(disarm, KILL_ARMED_MS) };
      kill.textContent = "Really kill?";
      kill.dataset.armed = id;
      status(`click again within ${KILL_ARMED_MS / 1000} s to kill ${id}`);
      return;
    }
    disarm();
    void run("kill", async (sid) => {
      await api.kill(sid);
      return `killed ${sid}`;
    });
  });
}

/** How long a first click on Kill waits for the second. */
const KILL_ARMED_MS = 4000;
