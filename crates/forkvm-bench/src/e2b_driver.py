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


def main() -> None:
    rounds, tag, socket, pid = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    code_tag = sys.argv[5] if len(sys.argv) > 5 else ""
    import e2b
    from forkvm import Controller, Sandbox

    out = {"e2b": [], "forkvm": [], "e2b_code": [], "forkvm_code": []}
    with Controller(f"unix:{socket}", timeout=300) as ctl:
        for _ in range(rounds):
            for which in ("e2b", "forkvm"):
                cpu0, t0 = daemon_cpu_ms(pid), time.perf_counter()
                if which == "e2b":
                    sb = e2b.Sandbox.create("base", timeout=300)
                else:
                    sb = Sandbox.create(tag, controller=ctl)
                t1, cpu1 = time.perf_counter(), daemon_cpu_ms(pid)
                r = sb.commands.run("echo hi")
                t2, cpu2 = time.perf_counter(), daemon_cpu_ms(pid)
                assert r.stdout == "hi\n", r.stdout
                t3 = time.perf_counter()
                r = sb.commands.run("echo again")
                t4 = time.perf_counter()
                assert r.stdout == "again\n", r.stdout
                sb.kill()
                out[which].append(
                    {
                        "create_ms": (t1 - t0) * 1e3,
                        "first_run_ms": (t2 - t1) * 1e3,
                        "warm_run_ms": (t4 - t3) * 1e3,
                        "daemon_cpu_create_ms": cpu1 - cpu0,
                        "daemon_cpu_first_run_ms": cpu2 - cpu1,
                    }
                )
            if code_tag:
                code_round(out, ctl, code_tag, pid)
    print(json.dumps(out))


def code_round(out: dict, ctl: "object", code_tag: str, pid: int) -> None:
    """One code-interpreter sandbox each way: create, then the first and a second run."""
    import e2b_code_interpreter
    from forkvm import Sandbox

    for which in ("e2b_code", "forkvm_code"):
        cpu0, t0 = daemon_cpu_ms(pid), time.perf_counter()
        if which == "e2b_code":
            sb = e2b_code_interpreter.Sandbox.create(timeout=300)
            run = lambda code: sb.run_code(code).text  # noqa: E731
        else:
            sb = Sandbox.create(code_tag, controller=ctl)
            run = sb.eval
        t1, cpu1 = time.perf_counter(), daemon_cpu_ms(pid)
        first = run("20 + 22")
        t2, cpu2 = time.perf_counter(), daemon_cpu_ms(pid)
        assert first == "42", first
        t3 = time.perf_counter()
        again = run("6 * 7")
        t4 = time.perf_counter()
        assert again == "42", again
        sb.kill()
        out[which].append(
            {
                "create_ms": (t1 - t0) * 1e3,
                "first_run_ms": (t2 - t1) * 1e3,
                "warm_run_ms": (t4 - t3) * 1e3,
                "daemon_cpu_create_ms": cpu1 - cpu0,
                "daemon_cpu_first_run_ms": cpu2 - cpu1,
            }
        )


main()
