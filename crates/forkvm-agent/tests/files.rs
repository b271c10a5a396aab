//! File requests through the real agent binary: byte-identical round trips (0 B, 1 B,
//! 50 MiB), list/stat/mkdir/remove, and errno-like errors.

mod common;

use common::TestAgent;
use forkvm_proto::{ClientError, ErrorKind, FileType, MkdirRequest, WriteFileRequest};

fn write(agent: &TestAgent, path: &str, data: &[u8]) -> u64 {
    let req = WriteFileRequest { path: path.into(), mode: None, create_parents: false, owner: None };
    agent.client().write_file(&req, &mut &data[..]).unwrap()
}

fn kind(err: ClientError) -> ErrorKind {
    match err {
        ClientError::Agent(e) => e.kind,
        other => panic!("expected an agent error, got {other}"),
    }
}

#[test]
fn round_trips_are_byte_identical() {
    let agent = TestAgent::start();
    let big: Vec<u8> = (0..50u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    for (name, data) in [("empty", Vec::new()), ("one", vec![0x5a]), ("big", big)] {
        let path = agent.path(name);
        assert_eq!(write(&agent, &path, &data), data.len() as u64);
        let back = agent.client().read_file_to_vec(&path).unwrap();
        assert!(back == data, "{name}: read back {} bytes, wrote {}", back.len(), data.len());
        assert_eq!(std::fs::read(&path).unwrap().len(), data.len());
    }
}

#[test]
fn write_replaces_atomically_with_mode_and_parents() {
    let agent = TestAgent::start();
    let path = agent.path("a/b/c.txt");
    let req = WriteFileRequest { path: path.clone(), mode: Some(0o600), create_parents: true, owner: None };
    agent.client().write_file(&req, &mut &b"one"[..]).unwrap();
    agent.client().write_file(&req, &mut &b"two!"[..]).unwrap();
    assert_eq!(agent.client().read_file_to_vec(&path).unwrap(), b"two!");
    let info = agent.client().stat(&path).unwrap();
    assert_eq!((info.name.as_str(), info.file_type, info.size, info.mode), ("c.txt", FileType::File, 4, 0o600));
    // No temp files are left behind.
    let names: Vec<_> = agent.client().list(&agent.path("a/b")).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["c.txt"]);
    // Without create_parents a missing parent is NotFound.
    let req = WriteFileRequest { path: agent.path("nope/x"), mode: None, create_parents: false, owner: None };
    assert_eq!(kind(agent.client().write_file(&req, &mut &b"data"[..]).unwrap_err()), ErrorKind::NotFound);
}

#[test]
fn list_stat_mkdir_remove() {
    let agent = TestAgent::start();
    let c = agent.client();
    let root = agent.path("tree");
    c.mkdir(&MkdirRequest { path: format!("{root}/x/y"), parents: true, mode: Some(0o750), owner: None }).unwrap();
    c.mkdir(&MkdirRequest { path: format!("{root}/x/y"), parents: true, mode: None, owner: None }).unwrap();
    let err =
        c.mkdir(&MkdirRequest { path: format!("{root}/x"), parents: false, mode: None, owner: None }).unwrap_err();
    assert_eq!(kind(err), ErrorKind::AlreadyExists);
    write(&agent, &format!("{root}/x/file"), b"12345");
    std::os::unix::fs::symlink("file", format!("{root}/x/link")).unwrap();
    let entries = c.list(&format!("{root}/x")).unwrap();
    let summary: Vec<_> = entries.iter().map(|e| (e.name.as_str(), e.file_type)).collect();
    assert_eq!(summary, [("file", FileType::File), ("link", FileType::Symlink), ("y", FileType::Dir)]);
    assert_eq!(entries[0].size, 5);
    assert!(entries[0].mtime_unix_ns > 1_600_000_000_000_000_000);
    assert_eq!(c.stat(&format!("{root}/x/y")).unwrap().mode, 0o750);
    assert_eq!(c.stat(&format!("{root}/x/link")).unwrap().file_type, FileType::File);
    assert_eq!(entries[1].symlink_target.as_deref(), Some("file"));
    assert_eq!(entries[0].symlink_target, None);
    assert!(entries.iter().all(|e| e.owner.is_some() && e.group.is_some()), "{entries:?}");

    assert_eq!(kind(c.remove(&format!("{root}/x"), false).unwrap_err()), ErrorKind::DirectoryNotEmpty);
    c.remove(&format!("{root}/x/file"), false).unwrap();
    c.remove(&format!("{root}/x"), true).unwrap();
    assert!(c.list(&root).unwrap().is_empty());
}

#[test]
fn missing_paths_and_wrong_types_are_typed_errors() {
    let agent = TestAgent::start();
    let c = agent.client();
    let missing = agent.path("missing");
    assert_eq!(kind(c.read_file_to_vec(&missing).unwrap_err()), ErrorKind::NotFound);
    assert_eq!(kind(c.stat(&missing).unwrap_err()), ErrorKind::NotFound);
    assert_eq!(kind(c.list(&missing).unwrap_err()), ErrorKind::NotFound);
    assert_eq!(kind(c.remove(&missing, true).unwrap_err()), ErrorKind::NotFound);
    let dir = agent.dir.path().display().to_string();
    assert_eq!(kind(c.read_file_to_vec(&dir).unwrap_err()), ErrorKind::IsADirectory);
    write(&agent, &agent.path("f"), b"x");
    assert_eq!(kind(c.list(&agent.path("f")).unwrap_err()), ErrorKind::NotADirectory);
    let err = c.read_file_to_vec(&missing).unwrap_err();
    assert!(err.to_string().contains(&missing), "error names the path: {err}");
}

#[test]
fn what_a_write_or_mkdir_creates_belongs_to_the_owner_it_names_and_rename_moves() {
    use std::os::unix::fs::MetadataExt;
    let agent = TestAgent::start();
    let c = agent.client();
    let req = WriteFileRequest {
        path: agent.path("o/p/f"),
        mode: None,
        create_parents: true,
        owner: Some("ghost-user".into()),
    };
    let e = c.write_file(&req, &mut &b"x"[..]).unwrap_err();
    assert!(e.to_string().contains("\"ghost-user\" does not exist"), "{e}");
    assert!(!std::path::Path::new(&agent.path("o")).exists(), "a failed owner lookup creates nothing");

    c.write_file(&WriteFileRequest { owner: None, ..req.clone() }, &mut &b"x"[..]).unwrap();
    c.rename(&agent.path("o/p/f"), &agent.path("o/g")).unwrap();
    assert_eq!(std::fs::read(agent.path("o/g")).unwrap(), b"x");
    assert_eq!(kind(c.rename(&agent.path("o/p/f"), &agent.path("o/h")).unwrap_err()), ErrorKind::NotFound);

    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return; // chown needs root, as the agent has in a guest
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let nobody: Vec<&str> = passwd.lines().find(|l| l.starts_with("nobody:")).unwrap().split(':').collect();
    let (uid, gid): (u32, u32) = (nobody[2].parse().unwrap(), nobody[3].parse().unwrap());
    let req = WriteFileRequest {
        path: agent.path("o/new/deeper/f"),
        mode: None,
        create_parents: true,
        owner: Some("nobody".into()),
    };
    c.write_file(&req, &mut &b"y"[..]).unwrap();
    let ids = |p: &str| {
        let m = std::fs::metadata(agent.path(p)).unwrap();
        (m.uid(), m.gid())
    };
    assert_eq!([ids("o/new"), ids("o/new/deeper"), ids("o/new/deeper/f")], [(uid, gid); 3]);
    assert_eq!(ids("o"), (0, 0), "a parent that existed keeps its owner");
    c.mkdir(&MkdirRequest { path: agent.path("o/d1/d2"), parents: true, mode: None, owner: Some("nobody".into()) })
        .unwrap();
    c.mkdir(&MkdirRequest { path: agent.path("o/d3"), parents: false, mode: None, owner: Some("nobody".into()) })
        .unwrap();
    assert_eq!([ids("o/d1"), ids("o/d1/d2"), ids("o/d3")], [(uid, gid); 3]);
    // Listings and stat name owners and groups as the guest's files do.
    let group_of_nobody = std::fs::read_to_string("/etc/group")
        .unwrap()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[2] == gid.to_string()).then(|| f[0].to_string())
        })
        .unwrap_or_else(|| gid.to_string());
    let entries = c.list(&agent.path("o")).unwrap();
    let d1 = entries.iter().find(|e| e.name == "d1").unwrap();
    assert_eq!((d1.owner.as_deref(), d1.group.as_deref()), (Some("nobody"), Some(group_of_nobody.as_str())));
    let f = c.stat(&agent.path("o/g")).unwrap();
    assert_eq!((f.owner.as_deref(), f.group.as_deref()), (Some("root"), Some("root")));
}

/// A tar stream with `entries` (name, data; a name ending in `@` is a link to the data;
/// a name with `..` is written raw, as a hostile host could).
fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o640);
        h.set_mtime(1_000_000);
        if let Some(link) = name.strip_suffix('@') {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, link, std::str::from_utf8(data).unwrap()).unwrap();
        } else if name.contains("..") {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(data.len() as u64);
            h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, name, *data).unwrap();
        }
    }
    b.into_inner().unwrap()
}

#[test]
fn untar_unpacks_a_stream_inside_its_directory_and_nowhere_else() {
    let agent = TestAgent::start();
    let c = agent.client();
    let dir = agent.path("dst/app");
    let good = tar_of(&[("a.txt", b"alpha"), ("sub/b.txt", b"beta"), ("link@", b"a.txt")]);
    let sent = c.untar(&forkvm_proto::UntarRequest { dir: dir.clone(), owner: None }, &mut &good[..]).unwrap();
    assert_eq!(sent, good.len() as u64);
    assert_eq!(std::fs::read(format!("{dir}/sub/b.txt")).unwrap(), b"beta");
    assert_eq!(std::fs::read_link(format!("{dir}/link")).unwrap().to_str(), Some("a.txt"));
    let info = c.stat(&format!("{dir}/a.txt")).unwrap();
    assert_eq!((info.size, info.mode), (5, 0o640));
    // Unpacked again over what is there: contents and modes are the stream's.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(format!("{dir}/a.txt"), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(format!("{dir}/a.txt"), "something longer").unwrap();
    c.untar(&forkvm_proto::UntarRequest { dir: dir.clone(), owner: None }, &mut &good[..]).unwrap();
    let info = c.stat(&format!("{dir}/a.txt")).unwrap();
    assert_eq!((info.size, info.mode), (5, 0o640));

    // A `..` entry, or a file written through a link the stream made, stays out.
    let outside = agent.path("dst/outside");
    let escape = tar_of(&[("../outside", b"x")]);
    let err = c.untar(&forkvm_proto::UntarRequest { dir: dir.clone(), owner: None }, &mut &escape[..]).unwrap_err();
    assert!(err.to_string().contains("outside") || err.to_string().contains(".."), "{err}");
    let through = tar_of(&[("up@", b".."), ("up/outside", b"x")]);
    let err = c.untar(&forkvm_proto::UntarRequest { dir: dir.clone(), owner: None }, &mut &through[..]).unwrap_err();
    assert!(!std::path::Path::new(&outside).exists(), "{err}");

    // A broken stream is an error, and the connection still answers the next request.
    let err = c.untar(&forkvm_proto::UntarRequest { dir: dir.clone(), owner: None }, &mut &good[..700]).unwrap_err();
    assert!(err.to_string().contains("tar") || err.to_string().contains("unpack"), "{err}");
    c.ping().unwrap();
    let err = c.untar(&forkvm_proto::UntarRequest { dir: "relative".into(), owner: None }, &mut &good[..]).unwrap_err();
    assert!(err.to_string().contains("not absolute"), "{err}");
}

#[test]
fn a_directory_goes_out_as_a_tar_stream_and_a_file_is_hashed_in_the_guest() {
    let agent = TestAgent::start();
    let c = agent.client();
    let root = agent.path("out");
    let big: Vec<u8> = (0..3u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    std::fs::create_dir_all(format!("{root}/sub/empty")).unwrap();
    std::fs::write(format!("{root}/a.txt"), b"alpha").unwrap();
    std::fs::write(format!("{root}/sub/big.bin"), &big).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", format!("{root}/link")).unwrap();
    let mut archive = Vec::new();
    let size = c.tar(&root, &mut archive).unwrap();
    assert_eq!(size, archive.len() as u64);
    let mut seen = Vec::new();
    for entry in tar::Archive::new(&archive[..]).entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().to_string_lossy().trim_end_matches('/').to_string();
        let kind = entry.header().entry_type();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
        match name.as_str() {
            "a.txt" => assert_eq!(data, b"alpha"),
            "sub/big.bin" => assert!(data == big, "the big file came back different"),
            "link" => {
                assert_eq!(kind, tar::EntryType::Symlink, "a link stays a link");
                assert_eq!(entry.link_name().unwrap().unwrap().to_str(), Some("/etc/passwd"));
            }
            _ => {}
        }
        seen.push(name);
    }
    assert_eq!(seen, ["a.txt", "link", "sub", "sub/big.bin", "sub/empty"], "every entry, in name order, relative");
    assert_eq!(kind(c.tar(&format!("{root}/a.txt"), &mut Vec::new()).unwrap_err()), ErrorKind::NotADirectory);
    assert_eq!(kind(c.tar(&agent.path("none"), &mut Vec::new()).unwrap_err()), ErrorKind::NotFound);

    use sha2::Digest;
    let want: String = sha2::Sha256::digest(&big).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(c.hash_file(&format!("{root}/sub/big.bin")).unwrap(), (big.len() as u64, want));
    assert_eq!(kind(c.hash_file(&format!("{root}/sub")).unwrap_err()), ErrorKind::IsADirectory);
}
