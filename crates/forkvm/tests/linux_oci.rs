//! Linux tier: a template made from an OCI image. The test writes a two-layer image
//! itself (busybox, users, a whiteout, an opaque directory, a hard link, a link that
//! points out of the image, a device node), imports it as a `docker save` archive with
//! `forkvm template from-oci`, boots it once into its template snapshot and checks, in
//! a sandbox, that the guest sees exactly the merged tree and runs execs with the
//! image's Env, WorkingDir and User (a request's own cwd and env over them). A second
//! image on the same base layer stores only its own blobs.

#[path = "common/cli_env.rs"]
mod cli_env;

use cli_env::CliEnv;
use forkvm_image::oci::writer::{ImageSpec, LayerBuilder};
use std::path::Path;

/// Layer 1: a busybox system with a user `app` (1000).
fn base_layer() -> Vec<u8> {
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static at /bin/busybox");
    let list = std::process::Command::new("/bin/busybox").arg("--list").output().unwrap();
    let mut l = LayerBuilder::new();
    for (dir, owner) in [("bin", 0), ("etc", 0), ("home/app", 1000), ("opt/old", 0), ("var/cache", 0), ("dev", 0)] {
        l = l.dir(dir, 0o755, owner).unwrap();
    }
    l = l.file("bin/busybox", &busybox, 0o755, 0).unwrap();
    for applet in String::from_utf8(list.stdout).unwrap().lines().filter(|a| !a.is_empty() && *a != "busybox") {
        l = l.symlink(&format!("bin/{applet}"), "busybox").unwrap();
    }
    l.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n", 0o644, 0)
        .unwrap()
        .file("etc/group", b"root:x:0:\napp:x:1000:\n", 0o644, 0)
        .unwrap()
        .file("etc/motd", b"from the base layer\n", 0o644, 0)
        .unwrap()
        .file("opt/old/a", b"a", 0o644, 0)
        .unwrap()
        .file("opt/old/b", b"b", 0o644, 0)
        .unwrap()
        .file("var/cache/junk", b"junk", 0o644, 0)
        .unwrap()
        .finish_gzip()
        .unwrap()
}

/// Layer 2: whites out a file and the old directory's contents, adds the app.
fn app_layer(greeting: &str) -> Vec<u8> {
    let mut dev = LayerBuilder::new().whiteout("etc/motd").unwrap();
    dev = dev.opaque("opt/old").unwrap().file("opt/old/new", b"new", 0o644, 0).unwrap();
    dev.dir("app", 0o755, 1000)
        .unwrap()
        .file("app/hello.txt", greeting.as_bytes(), 0o640, 1000)
        .unwrap()
        .hard_link("app/hello-link", "app/hello.txt")
        .unwrap()
        // A link out of the image, and a file written through it: lands inside.
        .symlink("escape", "/")
        .unwrap()
        .file("escape/etc/escaped", b"inside\n", 0o644, 0)
        .unwrap()
        .finish()
        .unwrap()
}

fn image(greeting: &str) -> ImageSpec {
    ImageSpec {
        layers: vec![base_layer(), app_layer(greeting)],
        config: serde_json::json!({
            "Env": ["PATH=/bin", "GREETING=hello from oci"],
            "WorkingDir": "/app",
            "User": "1000",
            "Cmd": ["sh"],
        }),
    }
}

#[test]
fn an_oci_image_becomes_a_template_whose_sandboxes_see_the_merged_tree_and_its_defaults() {
    let env = CliEnv::new();
    let templates = env.tmp.path().join("templates");
    let run = |args: &[&str]| -> String {
        let out = env.command(args).env("FORKVM_TEMPLATES", &templates).output().unwrap();
        assert!(out.status.success(), "forkvm {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let archive = env.tmp.path().join("app.tar");
    image("hello from the image\n").write_docker_save(&archive, "app:latest").unwrap();
    let made: serde_json::Value =
        serde_json::from_str(&run(&["template", "from-oci", archive.to_str().unwrap(), "--name", "ocitest"])).unwrap();
    assert_eq!(made["layers"], 2, "{made}");
    assert_eq!(made["exec"]["cwd"], "/app", "{made}");
    assert!(Path::new(made["image"].as_str().unwrap()).is_file(), "{made}");
    let text = std::fs::read_to_string(templates.join("ocitest.toml")).unwrap();
    assert!(text.contains("base = \"oci:sha256:"), "{text}");

    // A second image on the same base: its base layer is already stored.
    let layout = env.tmp.path().join("other");
    image("another app\n").write_layout_dir(&layout).unwrap();
    let other: serde_json::Value = serde_json::from_str(&run(&[
        "template",
        "from-oci",
        layout.to_str().unwrap(),
        "--name",
        "ocitest2",
        "--no-build",
    ]))
    .unwrap();
    let base_bytes = base_layer().len() as u64;
    assert!(other["shared_bytes"].as_u64().unwrap() >= base_bytes, "{other} (base layer {base_bytes} bytes)");
    assert!(other["new_bytes"].as_u64().unwrap() < base_bytes / 10, "{other}");

    run(&["snapshot", "create", "--image", "ocitest", "--tag", "oci"]);
    let id = env.fork("--tag", "oci", 1).remove(0);
    let seen = env.ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "pwd; id -u; echo \"$GREETING\"; ls /opt/old; test -e /etc/motd || echo motd-gone; \
         test -e /var/cache/junk && echo junk-kept; cat hello.txt; stat -c '%u %a %h' hello.txt; \
         cat /etc/escaped; test -c /dev/null && echo devtmpfs",
    ]);
    assert_eq!(
        seen,
        "/app\n1000\nhello from oci\nnew\nmotd-gone\njunk-kept\nhello from the image\n1000 640 2\ninside\ndevtmpfs\n"
    );
    // The request's own cwd and env win over the image's.
    let own = env.ok(&["exec", &id, "--cwd", "/tmp", "-e", "GREETING=mine", "--", "sh", "-c", "pwd; echo $GREETING"]);
    assert_eq!(own, "/tmp\nmine\n");
    env.ok(&["kill", &id]);

    // A Dockerfile FROM the same archive (a path in its context): imported once as the
    // template oci-<manifest>, built in sandboxes. RUN runs as the image's User (1000), as
    // in Docker; the Dockerfile's ENV and USER go over the image's for the result.
    let ctx = env.tmp.path().join("ctx");
    std::fs::create_dir(&ctx).unwrap();
    std::fs::copy(&archive, ctx.join("app.tar")).unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM oci:app.tar\nRUN echo built-as-$(id -u) > /app/built\nENV GREETING=\"from the dockerfile\"\nUSER root\n",
    )
    .unwrap();
    let built: serde_json::Value =
        serde_json::from_str(&run(&["template", "build", ctx.to_str().unwrap(), "--tag", "built"])).unwrap();
    assert_eq!((built["ran"].as_u64(), built["from"].as_str()), (Some(1), Some("oci:app.tar")), "{built}");
    let names: Vec<_> = std::fs::read_dir(&templates).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(names.iter().any(|n| n.to_string_lossy().starts_with("oci-")), "{names:?}");
    let id = env.fork("--tag", "built", 1).remove(0);
    let seen = env.ok(&["exec", &id, "--", "sh", "-c", "cat /app/built; echo $GREETING; id -u; pwd; cat hello.txt"]);
    assert_eq!(seen, "built-as-1000\nfrom the dockerfile\n0\n/app\nhello from the image\n");
}

/// The same image uploaded through the daemon (`POST /v1/templates/oci`): its progress
/// lines, a sandbox of it with the image's defaults, and the refusals (not an image, a
/// built-in name, a name taken).
#[test]
fn an_oci_archive_uploaded_to_the_daemon_becomes_a_template() {
    let env = CliEnv::new();
    let templates = env.tmp.path().join("templates");
    let (_daemon, endpoint) = env.start_daemon(&templates);
    let through = |args: &[&str]| -> std::process::Output {
        env.command(&[&["--daemon", endpoint.as_str()][..], args].concat()).output().unwrap()
    };
    let ok = |args: &[&str]| -> String {
        let out = through(args);
        assert!(out.status.success(), "forkvm {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let archive = env.tmp.path().join("app.tar");
    // The same image and options as the local test: the same image key, so the same
    // cached image and template snapshot (one boot for both tests).
    image("hello from the image\n").write_docker_save(&archive, "app:latest").unwrap();
    let lines = ok(&["template", "from-oci", archive.to_str().unwrap(), "--name", "ocitest", "--snapshot"]);
    let events: Vec<serde_json::Value> = lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["imported", "built", "snapshot", "done"], "{lines}");
    assert_eq!((events[0]["layers"].as_u64(), events[0]["command"].clone()), (Some(2), serde_json::json!(["sh"])));
    assert!(templates.join("ocitest.toml").is_file());

    ok(&["snapshot", "create", "--image", "ocitest", "--tag", "oci-d"]);
    ok(&["fork", "--tag", "oci-d", "-n", "1"]);
    let ps: serde_json::Value = serde_json::from_str(&ok(&["ps", "--json"])).unwrap();
    let id = ps[0]["id"].as_str().unwrap().to_string();
    assert_eq!(ok(&["exec", &id, "--", "sh", "-c", "pwd; id -u; cat hello.txt"]), "/app\n1000\nhello from the image\n");

    let junk = env.tmp.path().join("junk.tar");
    std::fs::write(&junk, b"not an image at all").unwrap();
    for (args, want) in [
        (vec!["template", "from-oci", junk.to_str().unwrap(), "--name", "junk"], "not a usable image"),
        (vec!["template", "from-oci", archive.to_str().unwrap(), "--name", "tiny"], "built-in"),
        (vec!["template", "from-oci", archive.to_str().unwrap(), "--name", "ocitest"], "exists already"),
        (vec!["template", "from-oci", archive.to_str().unwrap(), "--name", "../x"], "template name"),
    ] {
        let out = through(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{args:?}: {err}");
    }
    assert!(!templates.join("junk.toml").exists(), "a refused upload left a template");
}
