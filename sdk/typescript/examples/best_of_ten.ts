// Fork ten sandboxes from one warmed parent, run a command in each, keep the best.
import { Sandbox, type SandboxOptions } from "../src/index.js";

export async function bestOfTen(tag: string, opts: SandboxOptions = {}) {
  const parent = await Sandbox.create(tag, opts);
  try {
    await parent.commands.run(["cat", "/proc/sys/kernel/random/uuid"]); // warm: in the page cache
    const children = await parent.fork(10); // copies of the running parent, in milliseconds
    const runs = await Promise.all(
      children.map(async (sandbox) => {
        // 300 s: ten guests at once on a two-core CI host whose guest kernels are emulated.
        const r = await sandbox.commands.run(["cat", "/proc/sys/kernel/random/uuid"], { timeoutSecs: 300 });
        if (r.exit_code !== 0) throw new Error(`${sandbox.id}: exit ${r.exit_code}: ${r.stderr}`);
        return { sandbox, score: r.stdout.trim() }; // each child has its own entropy
      }),
    );
    runs.sort((a, b) => a.score.localeCompare(b.score));
    const [best, ...rest] = runs;
    await Promise.all(rest.map((r) => r.sandbox.kill()));
    return { best: best!.sandbox, scores: runs.map((r) => r.score) };
  } finally {
    await parent.kill();
  }
}
