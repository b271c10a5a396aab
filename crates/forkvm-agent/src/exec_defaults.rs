//! The image's exec defaults (`forkvm_proto::exec_defaults`), read again whenever the
//! file changes. An OCI template's image carries the file; a Dockerfile build writes it
//! in its last step, into a sandbox whose agent had read the base image's long before
//! (the snapshot it was restored from). One `stat` per exec tells the two apart.

use forkvm_proto::exec_defaults::{ExecDefaultsFile, EXEC_DEFAULTS_PATH, MAX_EXEC_DEFAULTS_BYTES};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};

/// What identifies one version of the file: device, inode, size, change time.
type Stamp = Option<(u64, u64, u64, i64, i64)>;

/// The defaults; empty when the image has none (or an unreadable file, which is logged).
pub fn get() -> Arc<ExecDefaultsFile> {
    static CACHE: Mutex<Option<(Stamp, Arc<ExecDefaultsFile>)>> = Mutex::new(None);
    let stamp = stamp(EXEC_DEFAULTS_PATH);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    match &*cache {
        Some((s, d)) if *s == stamp => d.clone(),
        _ => {
            let d = Arc::new(load(EXEC_DEFAULTS_PATH));
            *cache = Some((stamp, d.clone()));
            d
        }
    }
}

fn stamp(path: &str) -> Stamp {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino(), m.len(), m.ctime(), m.ctime_nsec()))
}

fn load(path: &str) -> ExecDefaultsFile {
    let mut text = Vec::new();
    match std::fs::File::open(path) {
        Ok(f) => {
            if let Err(e) = f.take(MAX_EXEC_DEFAULTS_BYTES).read_to_end(&mut text) {
                eprintln!("forkvm-agent: reading {path}: {e}; execs get no image defaults");
                return ExecDefaultsFile::default();
            }
        }
        Err(_) => return ExecDefaultsFile::default(),
    }
    serde_json::from_slice(&text).unwrap_or_else(|e| {
        eprintln!("forkvm-agent: {path} is not valid: {e}; execs get no image defaults");
        ExecDefaultsFile::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_broken_file_means_no_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exec.json");
        assert_eq!(load(path.to_str().unwrap()), ExecDefaultsFile::default());
        std::fs::write(&path, "{not json").unwrap();
        assert_eq!(load(path.to_str().unwrap()), ExecDefaultsFile::default());
        std::fs::write(&path, r#"{"env":[["A","1"]],"cwd":"/app","user":"app"}"#).unwrap();
        let d = load(path.to_str().unwrap());
        assert_eq!((d.env.len(), d.cwd.as_deref(), d.user.as_deref()), (1, Some("/app"), Some("app")));
    }
}
