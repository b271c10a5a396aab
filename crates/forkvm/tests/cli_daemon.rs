//! Linux tier: the CLI's verbs through a real `forkvm daemon` (`--daemon`), over its Unix
//! socket and over TCP with TLS and a bearer token.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

struct Env {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    daemon: Option<Child>,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.cli(&["kill", "--all"], &[]);
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

impl Env {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_forkvm"));
        c.args(args)
            .env("FORKVM_STORE", self.dir.join("store"))
            .env("FORKVM_RUN", self.dir.join("run"))
            .env_remove("FORKVM_DAEMON")
            .env_remove("FORKVM_TOKEN");
        c
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("run/forkvmd.sock")
    }

    /// `forkvm --daemon unix:<socket> args...` with extra environment.
    fn cli(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        let endpoint = format!("unix:{}", self.socket().display());
        let mut c = self.command(&[]);
        c.arg("--daemon").arg(&endpoint).args(args);
        for (k, v) in envs {
            c.env(k, v);
        }
        c.output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args, &[]);
        assert!(out.status.success(), "forkvm {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }
}

/// Starts a daemon with TCP + TLS + token; returns the env and the https address.
fn start() -> (Env, String, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert_pem, key_pem) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_pem, cert.cert.pem()).unwrap();
    std::fs::write(&key_pem, cert.signing_key.serialize_pem()).unwrap();
    std::fs::write(dir.join("token"), "cli-test-token-0123456789\n").unwrap();
    let mut env = Env { _tmp: tmp, dir: dir.clone(), daemon: None };
    let mut child = env
        .command(&["daemon", "--bind", "127.0.0.1:0", "--token-file"])
        .arg(dir.join("token"))
        .arg("--tls-cert")
        .arg(&cert_pem)
        .arg("--tls-key")
        .arg(&key_pem)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let https = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the daemon exited");
        if let Some(a) = line.trim().strip_prefix("forkvmd listening on https://") {
            break a.replace("127.0.0.1", "localhost");
        }
    };
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    env.daemon = Some(child);
    (env, https, cert_pem)
}

fn ids(ps_json: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(ps_json).unwrap();
    v.as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect()
}

#[test]
fn cli_verbs_through_the_daemon_over_unix_and_tls() {
    let (env, https, cert) = start();
    assert!(Path::new(&env.socket()).exists());
    env.ok(&["snapshot", "create", "--image", "python", "--tag", "py"]);
    assert!(env.ok(&["snapshot", "ls"]).contains("py"));
    env.ok(&["fork", "--tag", "py", "-n", "2"]);
    let sandboxes = ids(&env.ok(&["ps", "--json"]));
    assert_eq!(sandboxes.len(), 2);
    let a = &sandboxes[0];
    // `ps --json` prints the same with and without the daemon: the API's list, from the
    // same registry rows (only the daemon knows its last disk snapshot of each).
    let through: serde_json::Value = serde_json::from_str(&env.ok(&["ps", "--json"])).unwrap();
    let out = env.command(&["ps", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let local: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (through, local) = (through.as_array().unwrap(), local.as_array().unwrap());
    assert_eq!(through.len(), local.len(), "daemon {through:?}\nlocal {local:?}");
    for (d, l) in through.iter().zip(local) {
        let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(d), keys(l), "the same fields");
        let mut d = d.clone();
        d["last_disk_snapshot"] = serde_json::Value::Null;
        assert_eq!(&d, l, "daemon and local views differ");
    }

    // So do `eval --json` and `branch --json` (the API's `EvalResponse`, `SnapshotInfo`).
    let local_json = |args: &[&str]| -> serde_json::Value {
        let out = env.command(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let code = "print('seen'); 6 * 7";
    let through: serde_json::Value = serde_json::from_str(&env.ok(&["eval", a, code, "--json"])).unwrap();
    assert_eq!(through, local_json(&["eval", a, code, "--json"]), "eval --json differs");
    assert_eq!((through["result"].as_str(), through["stdout"].as_str()), (Some("42"), Some("seen\n")), "{through}");
    let through: serde_json::Value =
        serde_json::from_str(&env.ok(&["branch", a, "--tag", "both-d", "--json"])).unwrap();
    let local = local_json(&["branch", a, "--tag", "both-l", "--json"]);
    let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&through), keys(&local), "branch --json: daemon {through}\nlocal {local}");
    for field in ["mode", "status", "bootable", "branched_from", "template", "memory_logical_bytes"] {
        assert_eq!(through[field], local[field], "{field}: daemon {through}\nlocal {local}");
    }
    env.ok(&["rmi", "both-d"]);
    env.ok(&["rmi", "both-l"]);

    // `exec` streams and exits with the command's code, both ways; a program that is not
    // there ends with 127, as in a shell.
    let command = ["exec", a, "--", "sh", "-c", "echo out; echo err >&2; exit 5"];
    for out in [env.cli(&command, &[]), env.command(&command).output().unwrap()] {
        assert_eq!(out.status.code(), Some(5), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
        assert!(String::from_utf8_lossy(&out.stderr).contains("err"));
    }
    let missing = ["exec", a, "--", "/no/such/program"];
    for out in [env.cli(&missing, &[]), env.command(&missing).output().unwrap()] {
        assert_eq!(out.status.code(), Some(127), "{}", String::from_utf8_lossy(&out.stderr));
    }

    // `fork --json` reports the same shape both ways: the API's sandbox objects, each with
    // its `exec` (the API's collected exec) and `eval` (`EvalResponse`); only this host
    // knows its `host` timings.
    let fork = ["fork", "--tag", "py", "-n", "1", "--exec", "hostname", "--eval", "6 * 7", "--rm", "--json"];
    let through: serde_json::Value = serde_json::from_str(&env.ok(&fork)).unwrap();
    let local = local_json(&fork);
    assert_eq!(keys(&through), keys(&local), "fork --json: daemon {through}\nlocal {local}");
    let (d, l) = (&through["sandboxes"][0], &local["sandboxes"][0]);
    assert_eq!(keys(d), keys(l), "fork --json rows: daemon {d}\nlocal {l}");
    for kid in [d, l] {
        let id = kid["sandbox_id"].as_str().unwrap();
        assert_eq!(kid["exec"]["stdout"].as_str(), Some(format!("sb-{id}\n").as_str()), "{kid}");
        assert_eq!(kid["exec"]["exit_code"], 0, "{kid}");
        assert_eq!(kid["eval"]["result"], "42", "{kid}");
    }
    assert_eq!(keys(&d["exec"]), keys(&l["exec"]));
    assert_eq!(keys(&d["eval"]), keys(&l["eval"]));
    assert!(through["host"].is_null() && local["host"]["host_spawn_ms"].is_number(), "{through}\n{local}");
    assert_eq!(ids(&env.ok(&["ps", "--json"])).len(), 2, "fork --rm left sandboxes");
    assert_eq!(env.ok(&["eval", a, "x = 6 * 7\nx"]).trim(), "42");
    let out = env.cli(&["eval", a, "1/0"], &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ZeroDivisionError"));

    // Checkpoints: one now, a change, the rewind back to it; the policy set and shown;
    // without a daemon the verbs say they need one.
    let ck: serde_json::Value =
        serde_json::from_str(&env.ok(&["checkpoint", a, "--note", "x is 42", "--json"])).unwrap();
    assert_eq!((ck["seq"].as_u64(), ck["note"].as_str()), (Some(1), Some("x is 42")), "{ck}");
    assert_eq!(env.ok(&["eval", a, "x = 7\nx"]).trim(), "7");
    let listed = env.ok(&["checkpoints", a, "--every", "5m", "--keep", "4"]);
    assert!(listed.starts_with("# every 300s, after exec false, keep 4\n1\t"), "{listed}");
    assert!(env.ok(&["rewind", a, "--to", "1"]).contains("back at checkpoint 1"));
    assert_eq!(env.ok(&["eval", a, "x"]).trim(), "42");
    let at = format!("{a}@1");
    let kid: serde_json::Value =
        serde_json::from_str(&env.ok(&["fork", "--from-checkpoint", &at, "-n", "1", "--eval", "x", "--rm", "--json"]))
            .unwrap();
    assert_eq!(kid["sandboxes"][0]["eval"]["result"], "42", "{kid}");
    let out = env.cli(&["fork", "--from-checkpoint", a, "-n", "1"], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected ID@SEQ"), "{out:?}");
    env.ok(&["checkpoints", a, "--every", "off"]);
    let out = env.command(&["checkpoint", a]).env("FORKVM_RUN", env.dir.join("no-daemon")).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("checkpoint needs the daemon"), "{out:?}");
    let out = env.cli(&["rewind", a, "--ago", "5w"], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown unit"), "{out:?}");
    // A sandbox killed without the daemon (the CLI's own kill) leaves checkpoints behind;
    // the daemon's sweep removes them, rows and snapshots.
    let made: serde_json::Value = serde_json::from_str(&env.ok(&["fork", "--tag", "py", "-n", "1", "--json"])).unwrap();
    let c = made["sandboxes"][0]["sandbox_id"].as_str().unwrap().to_string();
    env.ok(&["checkpoints", &c, "--thin", "10m:1m"]);
    env.ok(&["checkpoint", &c]);
    let tag = format!("ckpt-{c}-1");
    assert!(env.ok(&["snapshot", "ls"]).contains(&tag));
    let out = env.command(&["kill", &c]).output().unwrap();
    assert!(out.status.success(), "local kill: {}", String::from_utf8_lossy(&out.stderr));
    let swept = (0..80).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(250));
        !env.ok(&["snapshot", "ls"]).contains(&tag)
    });
    assert!(swept, "{tag} outlived its sandbox by 20 s");
    let out = env.cli(&["checkpoints", &c], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"), "{out:?}");

    let b: serde_json::Value =
        serde_json::from_str(&env.ok(&["branch", a, "--mode", "live", "--tag", "cli-b", "--json"])).unwrap();
    assert_eq!(b["tag"], "cli-b", "{b}");
    env.ok(&["fork", "--from-sandbox", a, "-n", "1"]);
    assert_eq!(ids(&env.ok(&["ps", "--json"])).len(), 3);

    // forkd's workspaces: a sandbox under a name; suspend archives it, resume brings the
    // same one back with its files; found on the default socket without --daemon too.
    let ws = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["workspace"];
        all.extend_from_slice(args);
        all.push("--json");
        serde_json::from_str(&env.ok(&all)).unwrap()
    };
    let made = ws(&["create", "dev", "--tag", "py"]);
    let sb = made[0]["sandbox_id"].as_str().unwrap().to_string();
    assert_eq!(made[0]["status"], "running", "{made}");
    env.ok(&["exec", &sb, "--", "sh", "-c", "echo kept > /tmp/ws-file"]);
    assert_eq!(ws(&["suspend", "dev"])[0]["status"], "suspended");
    let back = ws(&["resume", "dev"]);
    assert_eq!((back[0]["status"].as_str(), back[0]["sandbox_id"].as_str()), (Some("running"), Some(sb.as_str())));
    assert_eq!(env.ok(&["exec", &sb, "--", "cat", "/tmp/ws-file"]), "kept\n");
    let out = env.command(&["workspace", "ls"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("dev\trunning\t"), "{out:?}");
    env.ok(&["workspace", "rm", "dev"]);
    let out = env.cli(&["workspace", "get", "dev"], &[]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("dev"), "{out:?}");
    assert_eq!(ids(&env.ok(&["ps", "--json"])).len(), 3, "workspace rm left its sandbox");
    // Errors keep the daemon's message and fail the command.
    let out = env.cli(&["kill", "no-such-sandbox"], &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = env.cli(&["snapshot", "create", "--image", "python", "--tag", "py"], &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));

    // Over TCP + TLS: the token and the certificate are both required.
    let url = format!("https://{https}");
    let cert = cert.to_str().unwrap();
    let tls = |envs: &[(&str, &str)]| {
        let mut c = env.command(&["--daemon", &url, "ps", "--json"]);
        for (k, v) in envs {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let out = tls(&[("FORKVM_CA_CERT", cert), ("FORKVM_TOKEN", "cli-test-token-0123456789")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(ids(&String::from_utf8_lossy(&out.stdout)).len(), 3);
    let out = tls(&[("FORKVM_CA_CERT", cert)]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing bearer token"), "{out:?}");
    let out = tls(&[("FORKVM_CA_CERT", cert), ("FORKVM_TOKEN", "cli-test-token-0123456780")]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid bearer token"), "{out:?}");
    let out = tls(&[("FORKVM_TOKEN", "cli-test-token-0123456789")]);
    assert!(!out.status.success(), "an untrusted certificate must be refused");

    // Chains through the daemon: snapshot-diff (spawn, run, diff branch, kill), info,
    // compact, pack (streamed down), rmi, unpack (streamed up).
    let before = ids(&env.ok(&["ps", "--json"])).len();
    env.ok(&["snapshot-diff", "--from", "py", "--tag", "d1", "--exec", "echo layer > /tmp/d1", "--eval", "d1 = 17"]);
    assert_eq!(ids(&env.ok(&["ps", "--json"])).len(), before, "snapshot-diff left its sandbox running");
    let info: serde_json::Value = serde_json::from_str(&env.ok(&["snapshot-info", "d1", "--json"])).unwrap();
    assert_eq!(
        (info["chain_depth"].as_u64(), info["ancestors"].clone()),
        (Some(1), serde_json::json!(["py"])),
        "{info}"
    );
    env.ok(&["snapshot-compact", "--from", "d1", "--to", "d1-flat"]);
    let pack = env.dir.join("d1.tar.zst");
    env.ok(&["pack", "--tag", "d1", "--out", pack.to_str().unwrap()]);
    let out = env.cli(&["rmi", "py"], &[]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("d1"), "{out:?}");
    env.ok(&["rmi", "d1"]);
    let u: serde_json::Value = serde_json::from_str(&env.ok(&["unpack", pack.to_str().unwrap(), "--json"])).unwrap();
    assert_eq!(
        (u["imported"].clone(), u["reused"].clone()),
        (serde_json::json!(["d1"]), serde_json::json!(["py"])),
        "{u}"
    );
    for tag in ["d1", "d1-flat"] {
        let out = env.ok(&["fork", "--tag", tag, "-n", "1", "--exec", "cat /tmp/d1", "--eval", "d1", "--rm"]);
        assert!(out.contains("layer") && out.contains("17"), "{tag}: {out}");
    }

    env.ok(&["kill", "--all"]);
    assert!(ids(&env.ok(&["ps", "--json"])).is_empty());
}
