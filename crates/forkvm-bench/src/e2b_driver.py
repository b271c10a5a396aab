# Driven by `forkvm bench e2b` (crates/forkvm-bench/src/e2b.rs): times, in one process and
# one run, Sandbox.create() and the first command through E2B's own SDK (against the
# daemon's E2B face) and through forkvm's SDK (its REST API on the Unix socket), and the
# daemon's CPU time around each, read from /proc. With a code tag, also the code
# interpreter: E2B's run_code (the template's server on port 49999) against forkvm's
# eval (the agent's warm interpreter) in sandboxes of that tag. Prints one JSON object.
import json
import os
import sys
import time


def daemon_cpu_ms(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000.0 / os.sysconf("SC_CLK_TCK")


def timed_round(pid: int, create, run, calls) -> dict:
    """Creates a sandbox, makes the first and a second call in it (each checked against
    what it must return) and kills it; the times and the daemon's CPU around each."""
    (first, first_wants), (second, second_wants) = calls
    cpu0, t0 = daemon_cpu_ms(pid), time.perf_counter()
    sb = create()
    t1, cpu1 = time.perf_counter(), daemon_cpu_ms(pid)
    got = run(sb, first)
    t2, cpu2 = time.perf_counter(), daemon_cpu_ms(pid)
    assert got == first_wants, got
    t3 = time.perf_counter()
    got = run(sb, second)
    t4 = time.perf_counter()
    assert got == second_wants, got
    sb.kill()
    return {
        "create_ms": (t1 - t0) * 1e3,
        "first_run_ms": (t2 - t1) * 1e3,
        "warm_run_ms": (t4 - t3) * 1e3,
        "daemon_cpu_create_ms": cpu1 - cpu0,
        "daemon_cpu_first_run_ms": cpu2 - cpu1,
    }


def main() -> None:
    rounds, tag, socket, pid = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    code_tag = sys.argv[5] if len(sys.argv) > 5 else ""
    import e2b
    from forkvm import Controller, Sandbox

    commands = (("echo hi", "hi\n"), ("echo again", "again\n"))
    sums = (("20 + 22", "42"), ("6 * 7", "42"))
    out = {"e2b": [], "forkvm": [], "e2b_code": [], "forkvm_code": []}
    with Controller(f"unix:{socket}", timeout=300) as ctl:
        for _ in range(rounds):
            stdout = lambda sb, cmd: sb.commands.run(cmd).stdout  # noqa: E731
            out["e2b"].append(timed_round(pid, lambda: e2b.Sandbox.create("base", timeout=300), stdout, commands))
            out["forkvm"].append(timed_round(pid, lambda: Sandbox.create(tag, controller=ctl), stdout, commands))
            if code_tag:
                import e2b_code_interpreter

                create = lambda: e2b_code_interpreter.Sandbox.create(timeout=300)  # noqa: E731
                out["e2b_code"].append(timed_round(pid, create, lambda sb, code: sb.run_code(code).text, sums))
                create = lambda: Sandbox.create(code_tag, controller=ctl)  # noqa: E731
                out["forkvm_code"].append(timed_round(pid, create, lambda sb, code: sb.eval(code), sums))
    print(json.dumps(out))


main()
