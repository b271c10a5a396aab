"""Fork ten sandboxes from one warmed parent, run a command in each, keep the best."""
from typing import Any, List, Tuple

from forkvm import Sandbox


def best_of_ten(tag: str, **controller_kwargs: Any) -> Tuple[Sandbox, List[str]]:
    with Sandbox.create(tag, **controller_kwargs) as parent:
        parent.commands.run(["cat", "/proc/sys/kernel/random/uuid"])  # warm: in the page cache
        children = parent.fork(10)  # copies of the running parent, in milliseconds
        runs = []
        for sandbox in children:
            # 300 s: a busy two-core CI host whose guest kernels are emulated.
            r = sandbox.commands.run(["cat", "/proc/sys/kernel/random/uuid"], timeout=300)
            if r.exit_code != 0:
                raise RuntimeError(f"{sandbox.id}: exit {r.exit_code}: {r.stderr}")
            runs.append((r.stdout.strip(), sandbox))  # each child has its own entropy
        runs.sort(key=lambda run: run[0])
        for _, loser in runs[1:]:
            loser.kill()
        return runs[0][1], [score for score, _ in runs]
