//! `watch` through the real agent binary: exactly the changes made after `armed`, in
//! order, with paths relative to the watched directory; recursive watches follow new
//! directories; keepalives while nothing changes; errors for what cannot be watched;
//! the host ending the watch (`End`, or hanging up) and the directory going away.

mod common;

use std::time::{Duration, Instant};

use common::TestAgent;
use forkvm_proto::{ChangeKind, ClientError, ErrorKind, WatchMessage, WatchRequest, WatchStream};

type Stream = WatchStream<std::os::unix::net::UnixStream>;

fn watch(agent: &TestAgent, path: &str, recursive: bool) -> (Stream, u32) {
    agent.client().watch(&WatchRequest { path: path.into(), recursive }).unwrap()
}

/// The changes that arrive until `n` of them have, skipping keepalives.
fn changes(w: &mut Stream, n: usize) -> Vec<(ChangeKind, String)> {
    let mut out = Vec::new();
    while out.len() < n {
        match w.recv().unwrap() {
            Some(WatchMessage::Change { kind, path }) => out.push((kind, path)),
            Some(WatchMessage::Keepalive) => {}
            other => panic!("unexpected {other:?} after {out:?}"),
        }
    }
    out
}

#[test]
fn create_write_and_remove_of_three_files_arrive_in_order() {
    use ChangeKind::*;
    let agent = TestAgent::start_with(&[]);
    let dir = agent.path("w");
    std::fs::create_dir(&dir).unwrap();
    let (mut w, directories) = watch(&agent, &dir, false);
    assert_eq!(directories, 1);
    for name in ["a", "b", "c"] {
        std::fs::File::create(format!("{dir}/{name}")).unwrap();
    }
    // Appends: one write(2) each is one modification (truncating an existing file, as
    // `fs::write` does, is a modification of its own).
    for name in ["a", "b", "c"] {
        let mut f = std::fs::OpenOptions::new().append(true).open(format!("{dir}/{name}")).unwrap();
        std::io::Write::write_all(&mut f, name.as_bytes()).unwrap();
    }
    for name in ["a", "b", "c"] {
        std::fs::remove_file(format!("{dir}/{name}")).unwrap();
    }
    let got = changes(&mut w, 9);
    let s = |k, p: &str| (k, p.to_string());
    assert_eq!(
        got,
        [
            s(Create, "a"),
            s(Create, "b"),
            s(Create, "c"),
            s(Write, "a"),
            s(Write, "b"),
            s(Write, "c"),
            s(Remove, "a"),
            s(Remove, "b"),
            s(Remove, "c")
        ]
    );
    assert_eq!(w.recv().unwrap(), Some(WatchMessage::Keepalive), "exactly those nine changes");
    w.stop().unwrap();
}

#[test]
fn a_recursive_watch_follows_directories_made_while_it_runs() {
    let agent = TestAgent::start_with(&[]);
    let dir = agent.path("r");
    std::fs::create_dir_all(format!("{dir}/old/deeper")).unwrap();
    let (mut w, directories) = watch(&agent, &dir, true);
    assert_eq!(directories, 3);
    std::fs::write(format!("{dir}/old/deeper/f"), b"x").unwrap();
    assert_eq!(
        changes(&mut w, 2),
        [(ChangeKind::Create, "old/deeper/f".into()), (ChangeKind::Write, "old/deeper/f".into())]
    );
    std::fs::create_dir(format!("{dir}/new")).unwrap();
    assert_eq!(changes(&mut w, 1), [(ChangeKind::Create, "new".into())]);
    // The new directory's own watch is in place once its create has been reported.
    std::fs::rename(format!("{dir}/old/deeper/f"), format!("{dir}/new/g")).unwrap();
    assert_eq!(changes(&mut w, 2), [(ChangeKind::Rename, "old/deeper/f".into()), (ChangeKind::Create, "new/g".into())]);
    std::fs::set_permissions(format!("{dir}/new/g"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    assert_eq!(changes(&mut w, 1), [(ChangeKind::Chmod, "new/g".into())]);
    w.stop().unwrap();
}

#[test]
fn a_plain_watch_does_not_see_below_its_directory() {
    let agent = TestAgent::start_with(&[]);
    let dir = agent.path("p");
    std::fs::create_dir_all(format!("{dir}/sub")).unwrap();
    let (mut w, _) = watch(&agent, &dir, false);
    std::fs::write(format!("{dir}/sub/hidden"), b"x").unwrap();
    std::fs::write(format!("{dir}/seen"), b"").unwrap();
    assert_eq!(changes(&mut w, 1), [(ChangeKind::Create, "seen".into())]);
    w.stop().unwrap();
}

#[test]
fn the_watch_ends_when_its_directory_goes_away() {
    let agent = TestAgent::start_with(&[]);
    let dir = agent.path("gone");
    std::fs::create_dir(&dir).unwrap();
    let (mut w, _) = watch(&agent, &dir, false);
    std::fs::remove_dir(&dir).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match w.recv().unwrap() {
            None => break,
            Some(WatchMessage::Keepalive) => assert!(Instant::now() < deadline, "the watch did not end"),
            Some(other) => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn keepalives_arrive_while_nothing_changes_and_a_hang_up_ends_the_watch() {
    let agent = TestAgent::start_with(&[]);
    let dir = agent.path("quiet");
    std::fs::create_dir(&dir).unwrap();
    let (mut w, _) = watch(&agent, &dir, false);
    let started = Instant::now();
    assert_eq!(w.recv().unwrap(), Some(WatchMessage::Keepalive));
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
    drop(w);
    // The agent keeps serving after the host hung up.
    assert!(agent.client().ping().is_ok());
}

#[test]
fn what_cannot_be_watched_is_refused_with_the_reason() {
    let agent = TestAgent::start_with(&[]);
    let file = agent.path("file");
    std::fs::write(&file, b"").unwrap();
    for (path, kind) in [(agent.path("missing"), ErrorKind::NotFound), (file, ErrorKind::NotADirectory)] {
        match agent.client().watch(&WatchRequest { path: path.clone(), recursive: false }) {
            Err(ClientError::Agent(e)) => assert_eq!(e.kind, kind, "{path}: {e}"),
            other => panic!("{path}: {other:?}"),
        }
    }
}
