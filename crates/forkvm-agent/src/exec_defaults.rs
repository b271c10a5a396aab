//! The image's exec defaults (`forkvm_proto::exec_defaults`), read once: the file is
//! part of the read-only image, so it cannot change while the agent runs, and every
//! sandbox restored from a snapshot has it in memory already.

use forkvm_proto::exec_defaults::{ExecDefaultsFile, EXEC_DEFAULTS_PATH, MAX_EXEC_DEFAULTS_BYTES};
use std::io::Read;
use std::sync::OnceLock;

/// The defaults; empty when the image has none (or an unreadable file, which is logged).
pub fn get() -> &'static ExecDefaultsFile {
    static DEFAULTS: OnceLock<ExecDefaultsFile> = OnceLock::new();
    DEFAULTS.get_or_init(|| load(EXEC_DEFAULTS_PATH))
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
