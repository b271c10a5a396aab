//! Linux tier, through the CLI: a Dockerfile built into a tag, every step in a sandbox.
//! The first build runs every step; the same build again runs none; changing one COPY'd
//! file reruns that step and the ones after it, not the ones before. The result execs
//! with the Dockerfile's ENV, WORKDIR and USER; `.dockerignore` leaves files out; links
//! are copied as links and a RUN that plants one pointing at a host directory only ever
//! reaches the guest's; a bad line, a failing RUN and a source outside the context are
//! refused by name and leave the tag as it was. The same context as a tar archive on
//! stdin gives the same cache keys. The template is booted once (cached).

#[path = "common/cli_env.rs"]
mod cli_env;

use cli_env::CliEnv;
use serde_json::Value;
use std::path::Path;

fn write(dir: &Path, name: &str, text: &str) {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// (cached, ran) per step of a build report, and whether the last step was cached.
fn outcome(r: &Value) -> (Vec<bool>, bool) {
    let steps = r["steps"].as_array().unwrap().iter().map(|s| s["cached"].as_bool().unwrap()).collect();
    (steps, r["finish_cached"].as_bool().unwrap())
}

#[test]
fn a_dockerfile_builds_in_sandboxes_and_reruns_only_what_changed() {
    let env = CliEnv::new();
    let ctx = env.tmp.path().join("ctx");
    // A host directory a RUN will try to reach through a link it plants.
    let host_dir = env.tmp.path().join("host-only");
    std::fs::create_dir(&host_dir).unwrap();
    write(&ctx, "app/main.py", "print('v1')\n");
    write(&ctx, "app/sub/data", "data\n");
    write(&ctx, "app/sub/debug.log", "left out\n");
    write(&ctx, "marker.txt", "marker\n");
    write(&ctx, ".dockerignore", "**/*.log\n");
    std::os::unix::fs::symlink("/etc/hostname", ctx.join("app/hostname-link")).unwrap();
    let dockerfile = format!(
        "FROM tiny\n\
         ARG GREETING=hello\n\
         ENV APP_HOME=/srv/app MSG=\"$GREETING world\"\n\
         WORKDIR $APP_HOME\n\
         RUN echo \"$MSG\" > greeting.txt && echo app:x:1000:1000::/home/app:/bin/sh >> /etc/passwd && mkdir -p /home/app\n\
         RUN mkdir -p /out {host} && ln -s {host} /out/esc\n\
         COPY marker.txt /out/esc/\n\
         COPY app/ ./\n\
         COPY --chown=app --chmod=750 app/main.py /opt/run.py\n\
         USER app\n\
         RUN id -u > /tmp/uid && pwd > /tmp/pwd\n\
         EXPOSE 8080\n\
         CMD [\"python3\", \"main.py\"]\n\
         READY test -f /srv/app/greeting.txt\n",
        host = host_dir.display()
    );
    write(&ctx, "Dockerfile", &dockerfile);
    let ctx_s = ctx.to_str().unwrap();
    let build = |extra: &[&str]| {
        let mut args = vec!["template", "build", ctx_s, "--tag", "app"];
        args.extend_from_slice(extra);
        env.json(&args)
    };

    let first = build(&[]);
    assert_eq!(outcome(&first), (vec![false; 6], false), "{first}");
    assert_eq!(first["ran"], 6);
    assert_eq!(first["expose"], serde_json::json!(["8080"]));
    assert_eq!(first["command"], serde_json::json!(["python3", "main.py"]));

    let id = env.fork("--tag", "app", 1).remove(0);
    let sh = |script: &str| env.sh(&id, script);
    assert_eq!(sh("id -u; pwd; echo $MSG; cat greeting.txt"), "1000\n/srv/app\nhello world\nhello world\n");
    assert_eq!(sh("cat /tmp/uid /tmp/pwd"), "1000\n/srv/app\n", "RUN after USER ran as app in WORKDIR");
    assert_eq!(sh("ls -A /srv/app/sub"), "data\n", ".dockerignore left debug.log out");
    assert_eq!(sh("readlink /srv/app/hostname-link"), "/etc/hostname\n", "a link is copied as a link");
    assert_eq!(sh("stat -c '%U %a' /opt/run.py"), "app 750\n");
    // The planted link led the COPY to the guest's directory of that name, never the host's.
    assert_eq!(sh(&format!("cat {}/marker.txt", host_dir.display())), "marker\n");
    assert_eq!(std::fs::read_dir(&host_dir).unwrap().count(), 0, "the build wrote into a host directory");
    env.ok(&["kill", &id]);

    // The same build again: every step and the last one come from the cache.
    let again = build(&[]);
    assert_eq!(outcome(&again), (vec![true; 6], true), "{again}");
    assert_eq!(again["replaced"], true);

    // One COPY'd file changes: the steps before it are cached, it and those after it run.
    write(&ctx, "app/main.py", "print('v2')\n");
    let changed = build(&[]);
    assert_eq!(outcome(&changed), (vec![true, true, true, false, false, false], false), "{changed}");
    let id = env.fork("--tag", "app", 1).remove(0);
    assert_eq!(env.sh(&id, "cat main.py /opt/run.py"), "print('v2')\nprint('v2')\n");
    env.ok(&["kill", &id]);

    // The same context as a gzip'd tar on stdin (indexed, never unpacked): the same keys,
    // so every step is cached and the tag is another over the same last step.
    let archive = env.tmp.path().join("ctx.tgz");
    let tar =
        std::process::Command::new("tar").arg("-C").arg(&ctx).arg("-czf").arg(&archive).arg(".").status().unwrap();
    assert!(tar.success());
    let out = env
        .command(&["template", "build", "-", "--tag", "from-archive"])
        .stdin(std::fs::File::open(&archive).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let from_archive: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(outcome(&from_archive), (vec![true; 6], true), "{from_archive}");
    assert_eq!(std::fs::read_dir(env.store.join("staging")).map_or(0, |d| d.count()), 0, "the staged archive is gone");

    // A build arg reaches the RUN that uses it and everything after it.
    let arg = build(&["--build-arg", "GREETING=hi"]);
    assert_eq!(outcome(&arg).0, vec![false; 6], "{arg}");

    // Refusals name their line and leave the tag as it was.
    let before = env.json(&["snapshot-info", "app", "--json"]);
    for (text, needle) in [
        ("FROM tiny\nRUN true\nHEALTHCHECK CMD true\n", "line 3: HEALTHCHECK"),
        ("FROM tiny\nCOPY ../x /x\n", "line 2: COPY ../x: outside the build context"),
        ("FROM tiny\nRUN echo failing-step && exit 3\n", "exit code 3"),
        ("FROM no-such-base\n", "line 1: FROM no-such-base"),
    ] {
        write(&ctx, "Dockerfile.bad", text);
        let out =
            env.cmd(&["template", "build", ctx_s, "-f", ctx.join("Dockerfile.bad").to_str().unwrap(), "--tag", "app"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{text}: {err}");
    }
    assert_eq!(env.json(&["snapshot-info", "app", "--json"])["created_at_unix_ms"], before["created_at_unix_ms"]);

    // A tag no build made is replaced only when asked.
    env.ok(&["snapshot", "create", "--image", "tiny", "--tag", "plain"]);
    let out = env.cmd(&["template", "build", ctx_s, "--tag", "plain"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--replace"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(env.json(&["ps", "--json"]).as_array().map_or(0, |a| a.len()), 0, "no build sandbox is left running");
}

/// The same kind of build through the daemon (`POST /v1/templates/build`): the context
/// archived by the CLI and uploaded, every step's sandbox started by the daemon's
/// spawner, progress streamed back; a rebuild finds every step; a bad Dockerfile is
/// refused before anything runs.
#[test]
fn a_dockerfile_builds_through_the_daemon() {
    let env = CliEnv::new();
    let templates = env.tmp.path().join("templates");
    let (_daemon, endpoint) = env.start_daemon(&templates);
    let through = |args: &[&str]| env.command(&[&["--daemon", endpoint.as_str()][..], args].concat()).output().unwrap();
    let ctx = env.tmp.path().join("ctx");
    write(&ctx, "app/main.py", "print('hi')\n");
    write(&ctx, "Dockerfile", "FROM tiny\nARG V=1\nCOPY app/ /app/\nRUN echo v$V > /app/v\nWORKDIR /app\n");
    let ctx_s = ctx.to_str().unwrap();
    let build = |extra: &[&str]| -> (Value, String) {
        let mut args = vec!["template", "build", ctx_s, "--tag", "remote", "--json-progress"];
        args.extend_from_slice(extra);
        let out = through(&args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
        (serde_json::from_slice(&out.stdout).unwrap(), err)
    };
    let (first, progress) = build(&["--build-arg", "V=2"]);
    assert_eq!(outcome(&first), (vec![false, false], false), "{first}");
    let types: Vec<String> = progress
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|e| e["type"].as_str().unwrap_or_default().to_string())
        .collect();
    for t in ["planned", "base", "step", "step_done", "finished", "done"] {
        assert!(types.iter().any(|x| x == t), "no {t} event in {types:?}");
    }
    let out = through(&["fork", "--tag", "remote", "-n", "1", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let forked: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = forked["sandboxes"][0]["sandbox_id"].as_str().unwrap().to_string();
    let seen = through(&["exec", &id, "--", "sh", "-c", "pwd; cat v main.py"]);
    assert_eq!(String::from_utf8_lossy(&seen.stdout), "/app\nv2\nprint('hi')\n");
    assert!(through(&["kill", &id]).status.success());

    let (again, _) = build(&["--build-arg", "V=2"]);
    assert_eq!(outcome(&again), (vec![true, true], true), "{again}");

    write(&ctx, "Dockerfile.bad", "FROM tiny\nONBUILD RUN x\n");
    let bad = ctx.join("Dockerfile.bad");
    let out = through(&["template", "build", ctx_s, "-f", bad.to_str().unwrap(), "--tag", "remote"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("line 2: ONBUILD"), "{err}");
    let ps: Value = serde_json::from_slice(&through(&["ps", "--json"]).stdout).unwrap();
    assert_eq!(ps.as_array().map_or(0, |a| a.len()), 0, "no build sandbox is left running: {ps}");
}

#[test]
fn a_multi_stage_build_copies_from_the_stages_it_needs_and_skips_the_rest() {
    let env = CliEnv::new();
    let ctx = env.tmp.path().join("ctx");
    // The `never` stage would fail the build if it ran: only the stages the last one
    // reaches (through FROM and COPY --from) are built.
    let staged_dockerfile = String::from(
        "ARG V=1\n\
         FROM tiny AS Build\n\
         ARG V\n\
         WORKDIR /src\n\
         RUN mkdir -p out/sub && echo \"built $V\" > out/sub/a.txt && ln -s sub/a.txt out/link && printf '#!/bin/sh\\necho tool\\n' > tool && chmod 755 tool\n\
         FROM build AS never\n\
         RUN exit 7\n\
         FROM tiny\n\
         COPY --from=build /src/out /app/\n\
         COPY --from=0 /src/tool /usr/local/bin/mytool\n\
         COPY --from=build --chmod=750 /src/out /moded/\n\
         COPY --from=build --chmod=700 /src/tool /usr/local/bin/tool700\n",
    );
    write(&ctx, "Dockerfile", &staged_dockerfile);
    let ctx_s = ctx.to_str().unwrap();
    let build = |extra: &[&str]| {
        let mut args = vec!["template", "build", ctx_s, "--tag", "staged"];
        args.extend_from_slice(extra);
        env.json(&args)
    };
    let first = build(&[]);
    assert_eq!(outcome(&first), (vec![false; 5], false), "{first}");
    assert_eq!(first["from"], "tiny");
    let id = env.fork("--tag", "staged", 1).remove(0);
    let sh = |script: &str| env.sh(&id, script);
    assert_eq!(sh("cat /app/sub/a.txt; readlink /app/link"), "built 1\nsub/a.txt\n", "a directory, its link kept");
    assert_eq!(sh("stat -c '%a %U' /usr/local/bin/mytool; mytool"), "755 root\ntool\n", "a file, its mode kept");
    assert_eq!(sh("test -e /src || echo no-src"), "no-src\n", "the last stage has only what it copied");
    // --chmod over every file and directory of a copied directory (its link kept), and a file.
    assert_eq!(
        sh("stat -c '%a' /moded/sub /moded/sub/a.txt; readlink /moded/link; cat /moded/sub/a.txt; stat -c '%a' /usr/local/bin/tool700"),
        "750\n750\nsub/a.txt\nbuilt 1\n700\n"
    );
    env.ok(&["kill", &id]);

    let again = build(&[]);
    assert_eq!(outcome(&again), (vec![true; 5], true), "{again}");
    // The build stage changes: the copies from it run again, though their own text did not.
    let changed = build(&["--build-arg", "V=2"]);
    assert_eq!(outcome(&changed), (vec![false; 5], false), "{changed}");
    let id = env.fork("--tag", "staged", 1).remove(0);
    assert_eq!(env.sh(&id, "cat /app/sub/a.txt"), "built 2\n");
    env.ok(&["kill", &id]);

    // A path the stage does not have fails its step by name and leaves the tag as it was.
    write(&ctx, "Dockerfile", "FROM tiny AS b\nFROM tiny\nCOPY --from=b /nowhere /x\n");
    let out = env.command(&["template", "build", ctx_s, "--tag", "staged"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("/nowhere in the stage"), "{err}");
    let id = env.fork("--tag", "staged", 1).remove(0);
    assert_eq!(env.sh(&id, "cat /app/sub/a.txt"), "built 2\n", "the tag is as it was");

    // Pruning the build cache: the first build's steps (no tag sits on them any more) and
    // the build stage's step go; the chain under `staged` stays, and a sandbox running
    // from it runs on.
    let tags = || -> Vec<String> {
        let list = env.json(&["snapshot", "ls", "--json"]);
        list.as_array().unwrap().iter().map(|s| s["tag"].as_str().unwrap().to_string()).collect()
    };
    let staged_chain: Vec<String> = env.json(&["snapshot-info", "staged", "--json"])["ancestors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let first_steps: Vec<String> =
        first["steps"].as_array().unwrap().iter().map(|s| s["snapshot"].as_str().unwrap().to_string()).collect();
    let dry = env.json(&["template", "prune", "--dry-run", "--json"]);
    let would: Vec<String> =
        dry["removed"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
    assert!(first_steps.iter().all(|t| would.contains(t)), "{dry}");
    assert!(staged_chain.iter().all(|t| !would.contains(t)), "{dry}");
    assert!(would.iter().all(|t| tags().contains(t)), "a dry run removes nothing");
    let pruned = env.json(&["template", "prune", "--json"]);
    assert_eq!(pruned["removed"], dry["removed"], "{pruned}");
    assert!(pruned["freed_bytes"].as_u64().unwrap() > 0, "{pruned}");
    let left = tags();
    assert!(would.iter().all(|t| !left.contains(t)) && staged_chain.iter().all(|t| left.contains(t)), "{left:?}");
    assert_eq!(env.sh(&id, "cat /app/sub/a.txt"), "built 2\n", "the running sandbox is untouched");
    env.ok(&["kill", &id]);
    let id = env.fork("--tag", "staged", 1).remove(0);
    assert_eq!(env.sh(&id, "mytool"), "tool\n", "the tag still starts");
    env.ok(&["kill", &id]);
    assert_eq!(env.json(&["template", "prune", "--json"])["removed"], serde_json::json!([]), "nothing more to prune");
    // Rebuilt after the prune: the copies are found, so the build stage, pruned, is not
    // needed and does not run.
    write(&ctx, "Dockerfile", &staged_dockerfile);
    let after = build(&["--build-arg", "V=2"]);
    assert_eq!(outcome(&after), (vec![true; 5], true), "{after}");

    // COPY --from an image (here a template) rather than a stage: an implicit stage of it.
    write(&ctx, "Dockerfile", "FROM tiny\nCOPY --from=tiny /bin/busybox /opt/busybox\n");
    let from_image = env.json(&["template", "build", ctx_s, "--tag", "from-image"]);
    assert_eq!(outcome(&from_image), (vec![false], false), "{from_image}");
    let id = env.fork("--tag", "from-image", 1).remove(0);
    assert_eq!(env.sh(&id, "/opt/busybox echo copied"), "copied\n");
    env.ok(&["kill", &id]);
    write(&ctx, "Dockerfile", "FROM tiny\nCOPY --from=no-such-image /x /y\n");
    let out = env.command(&["template", "build", ctx_s, "--tag", "from-image"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("line 2: COPY --from=no-such-image"), "{err}");
}

#[test]
fn two_builds_at_once_make_each_step_once() {
    let env = CliEnv::new();
    let ctx = env.tmp.path().join("ctx");
    // The base first, so the two builds below race on their step alone.
    write(&ctx, "Dockerfile", "FROM tiny\n");
    env.json(&["template", "build", ctx.to_str().unwrap(), "--tag", "warm"]);
    write(&ctx, "Dockerfile", "FROM tiny\nRUN echo once >> /made\n");
    let start = |tag: &str| {
        env.command(&["template", "build", ctx.to_str().unwrap(), "--tag", tag])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (left, right) = (start("left"), start("right"));
    let mut ran = Vec::new();
    for child in [left, right] {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        ran.push(outcome(&report));
    }
    // Each step is made once across the two builds: the RUN by one, and the finish by
    // whichever build reaches it first (not always the one that made the RUN).
    let made_run = ran.iter().filter(|(steps, _)| !steps[0]).count();
    let made_finish = ran.iter().filter(|(_, finish_cached)| !finish_cached).count();
    assert_eq!((made_run, made_finish), (1, 1), "one build made each step, the other found it: {ran:?}");
    for tag in ["left", "right"] {
        let id = env.fork("--tag", tag, 1).remove(0);
        assert_eq!(env.sh(&id, "cat /made"), "once\n", "{tag}");
        env.ok(&["kill", &id]);
    }
}
