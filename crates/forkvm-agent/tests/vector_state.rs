//! Vector state the kernel does not save (PVM guests, `noxsave`): the agent re-executes
//! itself with glibc kept to SSE, and its children inherit that; glibc really does keep
//! to SSE under the tunable. See `src/xstate.rs`.

mod common;

use std::process::Command;

use common::TestAgent;
use forkvm_agent::xstate::{self, GLIBC_SSE_ONLY, KERNEL_XFEATURES_ENV};
use forkvm_proto::ExecRequest;

/// The agent's own environment (it is the test's child, re-executed in place).
fn agent_environ(agent: &TestAgent) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{}/environ", agent.child.id())).unwrap();
    raw.split(|b| *b == 0).map(|v| String::from_utf8_lossy(v).into_owned()).collect()
}

fn tunables_seen_by_a_child(agent: &TestAgent) -> String {
    let out = agent.client().exec_collect(&ExecRequest::shell("printf %s \"$GLIBC_TUNABLES\""), b"").unwrap();
    assert_eq!(out.status.code, Some(0), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn on_a_kernel_that_saves_only_sse_the_agent_reexecs_with_glibc_kept_to_sse() {
    // As in a PVM guest: the kernel saves x87 and SSE only.
    let agent = TestAgent::start_with_env(&[], &[(KERNEL_XFEATURES_ENV, "3"), ("GLIBC_TUNABLES", "")]);
    let cpu_has_more = xstate::cpu_xfeatures() & xstate::GLIBC_XFEATURES != 0;
    let expected = if cpu_has_more { GLIBC_SSE_ONLY } else { "" };
    assert_eq!(tunables_seen_by_a_child(&agent), expected);
    // The agent process itself (same pid) runs with it, not only its children.
    let own = agent_environ(&agent);
    assert_eq!(own.contains(&format!("GLIBC_TUNABLES={GLIBC_SSE_ONLY}")), cpu_has_more, "{own:?}");
    assert!(agent.client().ping().is_ok());
}

#[test]
fn other_tunables_are_kept() {
    let agent =
        TestAgent::start_with_env(&[], &[(KERNEL_XFEATURES_ENV, "3"), ("GLIBC_TUNABLES", "glibc.malloc.check=0")]);
    let expected = if xstate::cpu_xfeatures() & xstate::GLIBC_XFEATURES != 0 {
        format!("glibc.malloc.check=0:{GLIBC_SSE_ONLY}")
    } else {
        "glibc.malloc.check=0".into()
    };
    assert_eq!(tunables_seen_by_a_child(&agent), expected);
}

#[test]
fn on_a_kernel_that_saves_everything_nothing_changes() {
    let agent = TestAgent::start_with_env(&[], &[(KERNEL_XFEATURES_ENV, "ffffffffffffffff"), ("GLIBC_TUNABLES", "")]);
    assert_eq!(tunables_seen_by_a_child(&agent), "");
    assert!(!agent_environ(&agent).iter().any(|v| v.contains(GLIBC_SSE_ONLY)));
}

/// glibc's own report of the CPU features it will dispatch on (`ld.so --list-diagnostics`,
/// glibc 2.33+), under `tunables`. libc.a, which the static agent links, runs the same code.
fn glibc_diagnostics(tunables: &str) -> std::collections::HashMap<String, u64> {
    let out = Command::new("/lib64/ld-linux-x86-64.so.2")
        .arg("--list-diagnostics")
        .env("GLIBC_TUNABLES", tunables)
        .output()
        .expect("running the glibc dynamic loader");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), u64::from_str_radix(v.strip_prefix("0x")?, 16).ok()?)))
        .collect()
}

/// (diagnostics key, bit, name): AVX and FMA in CPUID.1:ECX, AVX2 and AVX-512 in CPUID.7:EBX.
const VECTOR_FEATURES: [(&str, u32, &str); 8] = [
    ("x86.cpu_features.features[0x0].active[0x2]", 28, "AVX"),
    ("x86.cpu_features.features[0x0].active[0x2]", 12, "FMA"),
    ("x86.cpu_features.features[0x1].active[0x1]", 5, "AVX2"),
    ("x86.cpu_features.features[0x1].active[0x1]", 16, "AVX512F"),
    ("x86.cpu_features.features[0x1].active[0x1]", 17, "AVX512DQ"),
    ("x86.cpu_features.features[0x1].active[0x1]", 28, "AVX512CD"),
    ("x86.cpu_features.features[0x1].active[0x1]", 30, "AVX512BW"),
    ("x86.cpu_features.features[0x1].active[0x1]", 31, "AVX512VL"),
];

fn active_vector_features(d: &std::collections::HashMap<String, u64>) -> Vec<&'static str> {
    let mut on: Vec<&str> =
        VECTOR_FEATURES.iter().filter(|(key, bit, _)| d[*key] & (1 << bit) != 0).map(|f| f.2).collect();
    // memmove & co. choose their AVX versions on this preference, not on AVX2 itself.
    if d["x86.cpu_features.preferred.AVX_Fast_Unaligned_Load"] != 0 {
        on.push("AVX_Fast_Unaligned_Load");
    }
    on
}

#[test]
fn under_the_tunable_glibc_dispatches_to_no_avx_code() {
    let with = glibc_diagnostics(GLIBC_SSE_ONLY);
    assert_eq!(active_vector_features(&with), Vec::<&str>::new());
    // Control: on an AVX machine glibc would use AVX without the tunable, so the check
    // above sees what it claims to.
    if xstate::cpu_xfeatures() & 0b100 != 0 {
        let without = glibc_diagnostics("");
        assert!(active_vector_features(&without).contains(&"AVX_Fast_Unaligned_Load"), "{without:?}");
    }
}
