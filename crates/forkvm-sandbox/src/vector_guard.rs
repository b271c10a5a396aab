//! The vector-state guard: a template snapshot is made only from a guest whose kernel
//! preserves every vector register class its user code can use.
//!
//! It runs `forkvm-agent vector-check` inside the guest (several processes holding known
//! values in xmm/ymm/zmm/opmask registers, switched against each other through
//! `sched_yield`) and refuses the guest when any class came back wrong, naming the class.
//! The bug class it catches is silent: on PVM hosts a guest kernel that saved only
//! FXSAVE state let numpy in two processes compute wrong numbers, with no error at all
//! (docs/vector-state.md).

use forkvm_proto::vector_check::{VectorCheckReport, GLIBC_SSE_ONLY};
use forkvm_proto::{AgentClient, ExecRequest};
use std::io::{Read, Write};

/// Where every forkvm image keeps the agent (forkvm-image's rootfs builder puts it there).
pub const GUEST_AGENT: &str = "/sbin/forkvm-agent";
/// Worker processes at template build.
pub const PROCESSES: u32 = 3;
/// Round trips per process at template build: enough for thousands of switches, a few
/// seconds of guest time where the guest kernel is emulated.
pub const SWITCHES: u32 = 1000;
/// How long the guest may take (its kernel is emulated on PVM hosts: ~1 ms a switch).
const TIMEOUT_MS: u64 = 300_000;

#[derive(Debug, thiserror::Error)]
pub enum VectorGuardError {
    #[error("running the vector-state check in the guest: {0}")]
    Run(String),
    #[error("the vector-state check in the guest printed no report (status {status}): {stderr}")]
    NoReport { status: String, stderr: String },
    #[error(
        "the guest kernel does not preserve vector registers across context switches: {} \
         (level {}, XCR0 {}, kernel saves {}); processes in this guest would silently corrupt \
         each other's results",
        .0.describe_failures(), .0.level, .0.xcr0, .0.kernel_xfeatures.as_deref().unwrap_or("?")
    )]
    Corrupted(Box<VectorCheckReport>),
}

/// Runs the check in the guest behind `client`; `Ok` only when every class held.
pub fn check<S: Read + Write + forkvm_proto::IdleLimit>(
    client: &AgentClient<S>,
    processes: u32,
    switches: u32,
) -> Result<VectorCheckReport, VectorGuardError> {
    let report = run(client, processes, switches)?;
    if report.failures().is_empty() {
        Ok(report)
    } else {
        Err(VectorGuardError::Corrupted(Box::new(report)))
    }
}

/// Runs the check and returns its report, pass or fail.
pub fn run<S: Read + Write + forkvm_proto::IdleLimit>(
    client: &AgentClient<S>,
    processes: u32,
    switches: u32,
) -> Result<VectorCheckReport, VectorGuardError> {
    let mut req = ExecRequest::argv([
        GUEST_AGENT.to_string(),
        "vector-check".into(),
        "--processes".into(),
        processes.to_string(),
        "--switches".into(),
        switches.to_string(),
    ]);
    req.timeout_ms = Some(TIMEOUT_MS);
    // glibc on SSE from the first instruction: the check must not be corrupted by what
    // it looks for (it re-executes itself so otherwise, after its start-up).
    req.env = vec![("GLIBC_TUNABLES".into(), GLIBC_SSE_ONLY.into())];
    let out = client.exec_collect(&req, b"").map_err(|e| VectorGuardError::Run(e.to_string()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{'));
    match line.map(serde_json::from_str::<VectorCheckReport>) {
        Some(Ok(report)) => Ok(report),
        Some(Err(e)) => Err(VectorGuardError::Run(format!("unreadable report: {e}"))),
        None => Err(VectorGuardError::NoReport {
            status: format!("{:?}", out.status),
            stderr: String::from_utf8_lossy(&out.stderr).chars().take(2000).collect(),
        }),
    }
}

/// The numpy workload that first showed the bug: `procs` processes forked from a warm
/// interpreter each recompute one 192x192 matmul and its sum for `seconds`, comparing
/// every result with their own first one. They start together, once all are forked and
/// warm, and each runs at least [`NUMPY_MIN_ITERATIONS`]. Python code for `eval`; its value is the JSON
/// of a [`NumpyProbe`].
pub fn numpy_probe_code(procs: u32, seconds: u32) -> String {
    let min_iterations = NUMPY_MIN_ITERATIONS;
    format!(
        r#"
import os, time, json
import numpy as np
def _forkvm_numpy_probe(seconds, procs):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((192, 192))
    b = rng.standard_normal((192, 192))
    go_r, go_w = os.pipe()
    started = []
    for _ in range(procs):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.close(go_w)
            ref = a @ b
            ref_sum = np.sum(ref)
            for _ in range(3):  # fault in this copy's pages before the clock starts
                np.sum(a @ b)
            os.read(go_r, 1)  # every worker starts once all exist (a fork takes seconds here)
            n = bad = 0
            start = time.monotonic()
            end, limit = start + seconds, start + 10 * seconds
            # At least `min_iterations` each, however slow a busy host makes the guest.
            while (time.monotonic() < end or n < {min_iterations}) and time.monotonic() < limit:
                c = a @ b
                s = np.sum(c)
                n += 1
                if not (np.array_equal(c, ref) and s == ref_sum):
                    bad += 1
            os.write(w, f"{{n}} {{bad}}".encode())
            os._exit(0)
        os.close(w)
        started.append((pid, r))
    os.close(go_r)
    os.close(go_w)
    per = []
    for pid, r in started:
        data = b""
        while True:
            chunk = os.read(r, 64)
            if not chunk:
                break
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        n, bad = map(int, data.split())
        per.append([n, bad])
    return json.dumps({{"iterations": sum(p[0] for p in per), "wrong": sum(p[1] for p in per), "per_process": per}})
_forkvm_numpy_probe({seconds}, {procs})
"#
    )
}

/// Iterations every numpy probe process runs, even past its time (up to ten times it).
pub const NUMPY_MIN_ITERATIONS: u64 = 100;

/// What [`numpy_probe_code`] measured.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct NumpyProbe {
    pub iterations: u64,
    pub wrong: u64,
    /// `[iterations, wrong]` per process.
    pub per_process: Vec<[u64; 2]>,
}

/// The numpy probe answered something that is not its result.
#[derive(Debug, thiserror::Error)]
#[error("unreadable numpy probe result {repr:?}: {source}")]
pub struct UnreadableProbe {
    pub repr: String,
    pub source: serde_json::Error,
}

impl NumpyProbe {
    /// Parses the probe's `eval` value (the `repr` of its JSON string).
    pub fn parse(value_repr: &str) -> Result<NumpyProbe, UnreadableProbe> {
        let json = value_repr.trim().trim_matches('\'');
        serde_json::from_str(json).map_err(|source| UnreadableProbe { repr: value_repr.to_string(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkvm_proto::vector_check::ClassResult;

    #[test]
    fn a_refusal_names_the_register_classes_that_came_back_wrong() {
        let report = VectorCheckReport {
            level: "avx512".into(),
            advertised: "avx512".into(),
            xcr0: "0xe7".into(),
            kernel_xfeatures: Some("0x3".into()),
            processes: 3,
            switches: 1000,
            classes: vec![
                ClassResult { class: "xmm".into(), checked: 3000, wrong: 0 },
                ClassResult { class: "ymm_upper".into(), checked: 3000, wrong: 2712 },
            ],
        };
        let e = VectorGuardError::Corrupted(Box::new(report)).to_string();
        assert!(e.contains("ymm_upper: 2712 of 3000 wrong"), "{e}");
        assert!(!e.contains("xmm:"), "{e}");
        assert!(e.contains("kernel saves 0x3"), "{e}");
    }

    #[test]
    fn the_numpy_probe_result_parses_from_its_repr() {
        let p = NumpyProbe::parse(r#"'{"iterations": 30, "wrong": 2, "per_process": [[10, 0], [10, 2], [10, 0]]}'"#)
            .unwrap();
        assert_eq!((p.iterations, p.wrong, p.per_process.len()), (30, 2, 3));
        assert!(NumpyProbe::parse("'nope'").is_err());
        assert!(numpy_probe_code(3, 10).contains("_forkvm_numpy_probe(10, 3)"));
    }
}
