//! Linux tier: sandboxes on two vCPUs (the SMP kernel, found through the VMM's MP
//! table), through the CLI.
//!
//! On a PVM host the guest kernel runs in KVM's instruction emulator, and there a process
//! that waits for another on the other vCPU can miss its wake-up and sleep for ever
//! (measured: a shell in `rt_sigsuspend` with SIGCHLD pending, within 60 cross-vCPU
//! waits). So several vCPUs are refused there unless `FORKVM_PVM_SMP=1`, and these tests
//! run no command in a two-vCPU guest: what they check — the template boots on both
//! vCPUs (its vector-state guard runs processes across them), a restore keeps both, and
//! so does every fork and branch — is read from the host. The two-vCPU template is booted
//! once (cached, `scripts/prepare-guest`); every sandbox here is a restore.

#[path = "common/cli_env.rs"]
mod cli_env;
use cli_env::CliEnv;

const PVM_SMP_ENV: &str = "FORKVM_PVM_SMP";

fn pvm_host() -> bool {
    std::path::Path::new("/sys/module/kvm_pvm").exists()
}

/// `forkvm args...` with several vCPUs allowed on PVM hosts; must succeed.
fn ok_smp(env: &CliEnv, args: &[&str]) -> serde_json::Value {
    let out = env.command(args).env(PVM_SMP_ENV, "1").output().unwrap();
    assert!(out.status.success(), "forkvm {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The `vcpus` `forkvm ps` shows for sandbox `id`.
fn vcpus_of(env: &CliEnv, id: &str) -> serde_json::Value {
    let ps = env.json(&["ps", "--json"]);
    let me = ps.as_array().unwrap().iter().find(|s| s["id"] == id).cloned();
    me.unwrap_or_else(|| panic!("{id} is not listed: {ps}"))["vcpus"].clone()
}

#[test]
fn a_vcpu_count_outside_the_range_is_refused_and_pvm_hosts_ask_first() {
    let env = CliEnv::new();
    let create = |vcpus: &str| env.cmd(&["snapshot", "create", "--image", "tiny", "--tag", "t", "--vcpus", vcpus]);
    for bad in ["0", "17"] {
        let out = create(bad);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("1 to 16 vCPUs"), "--vcpus {bad}: {err}");
    }
    if pvm_host() {
        let out = create("2");
        assert!(!out.status.success(), "two vCPUs were given on a PVM host without {PVM_SMP_ENV}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("PVM host") && err.contains(PVM_SMP_ENV), "{err}");
        assert!(env.json(&["snapshot", "ls", "--json"]).as_array().unwrap().is_empty(), "a refused create left a tag");
    }
}

#[test]
fn every_copy_of_a_two_vcpu_sandbox_has_both() {
    let env = CliEnv::new();
    let made = ok_smp(&env, &["snapshot", "create", "--image", "tiny", "--tag", "tiny2", "--vcpus", "2", "--json"]);
    assert_eq!(made["vcpus"], 2, "{made}");
    let one = ok_smp(&env, &["snapshot", "create", "--image", "tiny", "--tag", "tiny1", "--json"]);
    assert_eq!(one["vcpus"], 1, "{one}");
    assert_ne!(made["template_key"], one["template_key"], "one template snapshot served both counts");
    // `fork` returns once each agent answered: the guest runs on its restored vCPUs.
    let source = env.fork("--tag", "tiny2", 1).remove(0);
    assert_eq!(vcpus_of(&env, &source), 2);
    for round in 0..3 {
        let child = env.fork("--from-sandbox", &source, 1).remove(0);
        assert_eq!(vcpus_of(&env, &child), 2, "round {round}: a fork of the running sandbox");
        let tag = format!("b{round}");
        let mode = if round % 2 == 0 { "live" } else { "full" };
        let branch = env.json(&["branch", &source, "--tag", &tag, "--mode", mode, "--json"]);
        assert_eq!(branch["status"], "ready", "{branch}");
        let grandchild = env.fork("--tag", &tag, 1).remove(0);
        assert_eq!(vcpus_of(&env, &grandchild), 2, "round {round}: a child of a {mode} branch");
        env.ok(&["kill", &child, &grandchild]);
    }
    assert_eq!(vcpus_of(&env, &env.fork("--tag", "tiny1", 1).remove(0)), 1);
}
