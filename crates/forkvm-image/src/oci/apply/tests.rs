use super::*;
use std::os::unix::fs::MetadataExt;

/// A layer under construction.
struct Tar(tar::Builder<Vec<u8>>);

impl Tar {
    fn new() -> Tar {
        Tar(tar::Builder::new(Vec::new()))
    }
    fn header(kind: tar::EntryType, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_size(0);
        h
    }
    fn dir(mut self, path: &str) -> Tar {
        let mut h = Tar::header(tar::EntryType::Directory, 0o755);
        self.0.append_data(&mut h, path, io::empty()).unwrap();
        self
    }
    fn file(mut self, path: &str, body: &str) -> Tar {
        let mut h = Tar::header(tar::EntryType::Regular, 0o644);
        h.set_size(body.len() as u64);
        self.0.append_data(&mut h, path, body.as_bytes()).unwrap();
        self
    }
    fn link(mut self, kind: tar::EntryType, path: &str, target: &str) -> Tar {
        let mut h = Tar::header(kind, 0o777);
        self.0.append_link(&mut h, path, target).unwrap();
        self
    }
    /// An entry whose name is written raw (the builder refuses `..`).
    fn raw(mut self, name: &str, body: &str) -> Tar {
        let mut h = Tar::header(tar::EntryType::Regular, 0o644);
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_size(body.len() as u64);
        h.set_cksum();
        self.0.append(&h, body.as_bytes()).unwrap();
        self
    }
    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn apply(root: &Path, layer: Vec<u8>) -> Result<ApplyStats, ApplyError> {
    let dir = File::open(root).unwrap();
    let mut budget = 1 << 30;
    apply_layer(&dir, &layer[..], &mut budget)
}

/// Every path under `root` with what it is: `f:<content>`, `d`, `l:<target>`.
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                out.push(format!("{rel} l:{}", std::fs::read_link(&path).unwrap().display()));
            } else if meta.is_dir() {
                out.push(format!("{rel} d"));
                walk(root, &path, out);
            } else {
                out.push(format!("{rel} f:{}", std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    walk(root, root, &mut out);
    out
}

#[test]
fn whiteouts_and_opaque_directories_remove_only_what_lower_layers_made() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let base = Tar::new()
        .dir("etc")
        .file("etc/keep", "k")
        .file("etc/gone", "g")
        .dir("var/cache")
        .file("var/cache/old", "o")
        .file("var/cache/older", "o")
        .link(tar::EntryType::Symlink, "lib", "usr/lib")
        .dir("usr/lib")
        .file("usr/lib/a.so", "a")
        .link(tar::EntryType::Link, "etc/hard", "etc/keep");
    let stats = apply(root, base.bytes()).unwrap();
    assert_eq!((stats.files, stats.symlinks, stats.hard_links), (5, 1, 1));
    let top = Tar::new()
        .file("var/cache/new", "n")
        .file("var/cache/.wh..wh..opq", "")
        .file("etc/.wh.gone", "")
        .file("etc/.wh.never-was", "")
        // A layer does not white out its own entries.
        .file("etc/mine", "m")
        .file("etc/.wh.mine", "")
        // Through the link: lands in usr/lib.
        .file("lib/b.so", "b");
    let stats = apply(root, top.bytes()).unwrap();
    assert_eq!(stats.whiteouts, 4);
    assert_eq!(
        tree(root),
        [
            "etc d",
            "etc/hard f:k",
            "etc/keep f:k",
            "etc/mine f:m",
            "lib l:usr/lib",
            "usr d",
            "usr/lib d",
            "usr/lib/a.so f:a",
            "usr/lib/b.so f:b",
            "var d",
            "var/cache d",
            "var/cache/new f:n",
        ]
    );
    assert_eq!(
        std::fs::metadata(root.join("etc/hard")).unwrap().ino(),
        std::fs::metadata(root.join("etc/keep")).unwrap().ino()
    );
}

#[test]
fn nothing_is_written_outside_the_root_whatever_links_the_image_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (root, host) = (dir.path().join("root"), dir.path().join("host"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("secret"), "host's").unwrap();
    let host_abs = host.display().to_string();
    let lower = Tar::new()
        .link(tar::EntryType::Symlink, "abs", &host_abs)
        .link(tar::EntryType::Symlink, "up", "../../../../../..")
        .link(tar::EntryType::Symlink, "secret-link", &format!("{host_abs}/secret"));
    apply(&root, lower.bytes()).unwrap();
    let upper = Tar::new()
        // Through an absolute link: resolved as if the root were `/`.
        .file("abs/written", "via abs")
        .file("up/written", "via up")
        // Onto a link to a host file: the link is replaced, the file untouched.
        .file("secret-link", "replaced");
    apply(&root, upper.bytes()).unwrap();
    assert_eq!(std::fs::read_to_string(host.join("secret")).unwrap(), "host's");
    assert_eq!(std::fs::read_dir(&host).unwrap().count(), 1, "something was written onto the host");
    assert_eq!(
        std::fs::read_to_string(root.join(format!("{}/written", host_abs.trim_start_matches('/')))).unwrap(),
        "via abs"
    );
    assert_eq!(std::fs::read_to_string(root.join("written")).unwrap(), "via up");
    assert_eq!(std::fs::read_to_string(root.join("secret-link")).unwrap(), "replaced");

    // Names and hard links that climb out are refused.
    let e = apply(&root, Tar::new().raw("../escaped", "x").bytes()).unwrap_err().to_string();
    assert!(e.contains("climbs out"), "{e}");
    assert!(!dir.path().join("escaped").exists());
    let mut h = Tar::header(tar::EntryType::Link, 0o644);
    h.as_old_mut().linkname[..11].copy_from_slice(b"../../x/../");
    let mut t = Tar::new();
    t.0.append_data(&mut h, "hard", io::empty()).unwrap();
    let e = apply(&root, t.bytes()).unwrap_err().to_string();
    assert!(e.contains("climbs out"), "{e}");
}

#[test]
fn compressed_layers_are_read_and_owners_and_modes_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = Tar::header(tar::EntryType::Regular, 0o4755);
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let owner = if euid == 0 { 1000 } else { euid };
    h.set_uid(owner as u64);
    h.set_gid(owner as u64);
    h.set_size(2);
    let mut t = Tar::new();
    t.0.append_data(&mut h, "bin/tool", &b"#!"[..]).unwrap();
    let mut dev = Tar::header(tar::EntryType::Char, 0o666);
    t.0.append_data(&mut dev, "dev/null", io::empty()).unwrap();
    let plain = t.bytes();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    io::Write::write_all(&mut gz, &plain).unwrap();
    let stats = apply(dir.path(), gz.finish().unwrap()).unwrap();
    assert_eq!((stats.files, stats.devices_skipped), (1, 1));
    let meta = std::fs::metadata(dir.path().join("bin/tool")).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777, meta.mtime()), (owner, 0o4755, 1_700_000_000));
    let zst = zstd::encode_all(&plain[..], 1).unwrap();
    let other = tempfile::tempdir().unwrap();
    assert_eq!(apply(other.path(), zst).unwrap().files, 1);
    // The budget bounds what an image may unpack to.
    let mut budget = 1;
    let e = apply_layer(&File::open(other.path()).unwrap(), &plain[..], &mut budget).unwrap_err();
    assert!(matches!(e, ApplyError::TooBig { .. }), "{e}");
}
