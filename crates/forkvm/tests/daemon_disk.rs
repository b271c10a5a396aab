//! Linux tier: disk snapshots through a real `forkvm daemon` with real sandboxes. A
//! sandbox's writes reach its layered data disk (the writable half of its root overlay);
//! `forkvm --daemon disk-snapshot` takes one now, and the daemon's schedule
//! (`--disk-snapshot-interval 1s`) takes more by itself while the guest keeps writing.
//! The interval flag's parsing is checked without KVM.

use std::time::{Duration, Instant};

mod common;

use common::Env;

#[test]
fn the_interval_flag_is_parsed_and_garbage_is_refused() {
    let env = Env::new();
    for bad in ["garbage", "1.5s", "-3", "500ms"] {
        let flag = format!("--disk-snapshot-interval={bad}");
        let out = env.command(&["daemon", &flag]).output().unwrap();
        assert!(!out.status.success(), "{bad} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--disk-snapshot-interval"), "{bad}: {err}");
        assert!(err.contains("not an interval") || err.contains("at least"), "{bad}: {err}");
    }
    let out = env.command(&["daemon", "--disk-retention-keep-last", "many"]).output().unwrap();
    assert!(!out.status.success());
}

#[test]
fn disk_snapshots_on_request_and_on_schedule() {
    let mut env = Env::new();
    env.start_daemon(&["--disk-snapshot-interval", "1s", "--disk-retention-keep-last", "100"]);
    env.ok(&["snapshot", "create", "--image", "python", "--tag", "py"]);
    env.ok(&["fork", "--tag", "py", "-n", "1"]);
    let ps = env.json(&["ps", "--json"]);
    let id = ps[0]["id"].as_str().unwrap().to_string();
    // 256 KiB that do not compress, made in the warm interpreter's user space (the guest
    // kernel's /dev/urandom is emulated here), then synced.
    let write = |n: u32| {
        let code =
            format!("import os, random\nopen('/root/blob{n}', 'wb').write(random.randbytes(256 << 10))\nos.sync()");
        env.ok(&["eval", &id, &code]);
    };

    // One now, through the daemon. The 1 s schedule may have taken the write first: then
    // this one finds nothing new (`unchanged`) and names the newest.
    write(0);
    let r = env.json(&["disk-snapshot", &id, "--json"]);
    assert_eq!(r["sandbox_id"], id.as_str(), "{r}");
    let first = r["seq"].as_u64().unwrap();
    assert!(r["unchanged"].is_boolean(), "{r}");
    assert!(first >= 1, "{r}");
    // The schedule may have caught the guest mid-write and taken part of it: what the
    // newest snapshot holds, not what this call wrote, must cover the whole blob.
    assert!(r["stored_bytes"].as_u64().unwrap() >= 256 << 10, "{r}");
    let list = env.json(&["disk-snapshots", &id, "--json"]);
    let seqs: Vec<u64> = list.as_array().unwrap().iter().map(|s| s["seq"].as_u64().unwrap()).collect();
    assert!(seqs.contains(&first), "{list}");
    let disk = &list.as_array().unwrap().last().unwrap()["disks"][0];
    assert_eq!(disk["id"], "forkvm-data", "{list}");
    assert!(disk["blocks"].as_u64().unwrap() >= 64, "{list}");

    // The schedule takes more by itself while the guest writes.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 1;
    let newest = loop {
        write(n);
        n += 1;
        std::thread::sleep(Duration::from_millis(1500));
        let list = env.json(&["disk-snapshots", &id, "--json"]);
        let newest = list.as_array().unwrap().iter().map(|s| s["seq"].as_u64().unwrap()).max().unwrap();
        if newest >= first + 2 || Instant::now() > deadline {
            break newest;
        }
    };
    assert!(newest >= first + 2, "the schedule made no new snapshot in 60 s (newest {newest}, first {first})");
    let ps = env.json(&["ps", "--json"]);
    let last = &ps[0]["last_disk_snapshot"];
    assert!(last["seq"].as_u64().unwrap() >= first + 2 && last["error"].is_null(), "{ps}");

    // Killed, the sandbox's snapshots can still be listed through the daemon.
    env.ok(&["kill", &id]);
    let list = env.json(&["disk-snapshots", &id, "--json"]);
    assert!(list.as_array().unwrap().len() >= 3, "{list}");
    let out = env.cli(&["disk-snapshot", &id]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"), "{}", String::from_utf8_lossy(&out.stderr));
}
