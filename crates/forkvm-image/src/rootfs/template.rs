//! Image templates: a small declarative TOML file says what goes into a root filesystem.
//!
//! ```toml
//! name = "python"
//! base = "debian:bookworm"          # or "busybox", or "oci:sha256:<manifest>" (an imported image)
//! packages = ["python3-numpy"]      # Debian packages (debian bases only)
//! pip = []                          # PyPI packages, installed with the image's pip
//! python = "/usr/bin/python3"       # the agent's warm interpreter
//! warmup_eval = "import numpy"      # run in the warm interpreter before the template snapshot
//! vcpus = 2                         # vCPUs of its sandboxes unless a snapshot asks otherwise (1)
//! memory_mib = 512                  # guest memory of its sandboxes, MiB (256)
//! user = "user"                     # a login user: /home/user, bash, passwordless sudo (debian)
//! start = "my-server --port 8080"   # a service started before the template snapshot
//! ready = "test -e /tmp/up"         # retried until it succeeds, then the snapshot is taken
//! [files]
//! "/etc/motd" = "hello\n"           # extra files: path = content
//! [exec]                            # what every exec starts with unless it says otherwise
//! env = { LANG = "C.UTF-8" }
//! cwd = "/app"
//! user = "app"                      # an existing user (a name, uid or uid:gid of the image)
//! ```

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    pub name: String,
    pub base: Base,
    #[serde(default)]
    pub packages: Vec<String>,
    #[serde(default)]
    pub pip: Vec<String>,
    #[serde(default)]
    pub python: Option<String>,
    #[serde(default)]
    pub warmup_eval: Option<String>,
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// vCPUs of the template snapshot (and so of its sandboxes) unless a `snapshot create`
    /// or `POST /v1/snapshots` asks for another count; absent: 1. Not part of the image
    /// ([`image_text`]): the same root filesystem serves every count.
    #[serde(default)]
    pub vcpus: Option<u8>,
    /// Guest memory of the template snapshot (and so of its sandboxes), MiB; absent:
    /// [`DEFAULT_MEMORY_MIB`]. Like `vcpus`, not part of the image ([`image_text`]).
    #[serde(default)]
    pub memory_mib: Option<u32>,
    /// A login user made in the image (Debian bases): home `/home/<name>`, `/bin/bash`,
    /// in group `sudo` with passwordless sudo when `sudo` is installed. E2B's SDKs run
    /// their commands as a user named `user` (docs/e2b.md).
    #[serde(default)]
    pub user: Option<String>,
    /// A service (a shell command) the template runs: started detached, as `user` when the
    /// template has one, after the warm-up and before the template snapshot, so every
    /// sandbox restored from the snapshot has it running already (E2B's "start command").
    /// Its output goes to [`START_LOG`] in the guest.
    #[serde(default)]
    pub start: Option<String>,
    /// A shell command retried (as `start`'s user) until it exits 0 before the template
    /// snapshot is taken: the service is ready. Without it the snapshot follows `start`.
    #[serde(default)]
    pub ready: Option<String>,
    /// Defaults of every exec in the template's sandboxes (an OCI image's Env,
    /// WorkingDir and User): written into the image, applied by the agent.
    #[serde(default)]
    pub exec: ExecDefaults,
}

/// What an exec starts with unless its request says otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExecDefaults {
    /// Environment variables under the request's own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory (absolute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The user execs run as: a name, a uid, or `user:group` as an image config gives it;
    /// the build resolves it to a name of the image's `/etc/passwd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl ExecDefaults {
    pub fn is_empty(&self) -> bool {
        *self == ExecDefaults::default()
    }
}

/// The most `[exec] env` variables, and the longest name or value.
pub const MAX_ENV: usize = 512;
pub const MAX_ENV_BYTES: usize = 32 << 10;

/// Where a template's `start` service writes its output, in the guest.
pub const START_LOG: &str = "/tmp/forkvm-start.log";

/// Guest memory of a template that does not say (`memory_mib`).
pub const DEFAULT_MEMORY_MIB: u32 = 256;
/// The range `memory_mib` may take: enough for a Linux guest, at most 16 GiB.
pub const MEMORY_MIB_RANGE: std::ops::RangeInclusive<u32> = 64..=16384;

/// Longest `start` or `ready` command.
pub const MAX_COMMAND: usize = 4096;

/// The part of a template's text its image is made from: the text without `vcpus` and
/// `memory_mib`, which only say how the image boots. A template without either is its own
/// text, so the images of existing templates keep their keys.
pub fn image_text(text: &str) -> std::borrow::Cow<'_, str> {
    let Ok(mut table) = text.parse::<toml::Table>() else { return std::borrow::Cow::Borrowed(text) };
    let boot_only = ["vcpus", "memory_mib"].map(|k| table.remove(k).is_some());
    match boot_only.contains(&true) {
        true => std::borrow::Cow::Owned(table.to_string()),
        false => std::borrow::Cow::Borrowed(text),
    }
}

/// What the root filesystem starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// busybox-static's applets.
    Busybox,
    /// A Debian suite, installed with mmdebstrap in a user namespace (`debian.rs`).
    Debian(String),
    /// An OCI image imported into the blob store (`crate::oci`), by its manifest's digest.
    Oci(crate::oci::Digest),
}

impl<'de> Deserialize<'de> for Base {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Base, D::Error> {
        let s = String::deserialize(d)?;
        match s.split_once(':') {
            None if s == "busybox" => Ok(Base::Busybox),
            Some(("debian", suite)) if !suite.is_empty() && suite.chars().all(|c| c.is_ascii_alphanumeric()) => {
                Ok(Base::Debian(suite.to_string()))
            }
            Some(("oci", digest)) => crate::oci::Digest::parse(digest).map(Base::Oci).ok_or_else(|| {
                serde::de::Error::custom(format!("base {s:?}: expected \"oci:sha256:<64 hex digits>\""))
            }),
            _ => Err(serde::de::Error::custom(format!(
                "base {s:?}: expected \"busybox\", \"debian:<suite>\" or \"oci:sha256:<digest>\""
            ))),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("reading template {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("template {path}: {source}")]
    Parse { path: String, source: toml::de::Error },
    #[error("template {path}: {problem}")]
    Invalid { path: String, problem: String },
}

impl Template {
    pub fn load(path: &Path) -> Result<(Template, String), TemplateError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TemplateError::Read { path: p.clone(), source })?;
        let t = Template::parse(&text).map_err(|e| match e {
            TemplateError::Parse { source, .. } => TemplateError::Parse { path: p.clone(), source },
            TemplateError::Invalid { problem, .. } => TemplateError::Invalid { path: p.clone(), problem },
            other => other,
        })?;
        Ok((t, text))
    }

    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let t: Template =
            toml::from_str(text).map_err(|source| TemplateError::Parse { path: String::new(), source })?;
        let invalid = |problem: String| Err(TemplateError::Invalid { path: String::new(), problem });
        if t.name.is_empty() || !t.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return invalid(format!("name {:?} must be letters, digits, '-' or '_'", t.name));
        }
        if t.base == Base::Busybox && (!t.packages.is_empty() || !t.pip.is_empty() || t.python.is_some()) {
            return invalid(
                "a busybox base has no package manager and no Python: use base = \"debian:bookworm\"".into(),
            );
        }
        for path in t.files.keys() {
            if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
                return invalid(format!("file path {path:?} must be absolute and must not contain '..'"));
            }
        }
        // These reach apt, pip and a build hook's command line: plain names only.
        if let Some(p) = t.packages.iter().find(|p| !is_debian_package(p)) {
            return invalid(format!("package {p:?} is not a Debian package name (a-z, 0-9, '+', '-', '.')"));
        }
        if let Some(p) = t.pip.iter().find(|p| !is_pip_requirement(p)) {
            return invalid(format!(
                "pip requirement {p:?}: use a name with an optional version (letters, digits and ._-[],<>=!~ only)"
            ));
        }
        if let Some(py) = t.python.as_deref().filter(|py| !is_plain_absolute_path(py)) {
            return invalid(format!("python {py:?} must be an absolute path of letters, digits and ._-/"));
        }
        if let Some(n) = t.vcpus.filter(|&n| n == 0 || n > crate::kernel::MAX_VCPUS) {
            return invalid(format!("vcpus = {n}: a sandbox has 1 to {} vCPUs", crate::kernel::MAX_VCPUS));
        }
        if let Some(m) = t.memory_mib.filter(|m| !MEMORY_MIB_RANGE.contains(m)) {
            return invalid(format!(
                "memory_mib = {m}: a sandbox has {} to {} MiB",
                MEMORY_MIB_RANGE.start(),
                MEMORY_MIB_RANGE.end()
            ));
        }
        if let Some(u) = t.user.as_deref() {
            if t.base == Base::Busybox {
                return invalid("user needs a debian base (busybox has no useradd)".into());
            }
            if matches!(t.base, Base::Oci(_)) {
                return invalid("an OCI image's user is [exec] user (it must exist in the image)".into());
            }
            if !is_user_name(u) {
                return invalid(format!(
                    "user {u:?} must start with a-z or '_' and hold only a-z, 0-9, '_', '-' (32 at most)"
                ));
            }
        }
        for (field, cmd) in [("start", &t.start), ("ready", &t.ready)] {
            if let Some(cmd) =
                cmd.as_deref().filter(|c| c.trim().is_empty() || c.len() > MAX_COMMAND || c.contains('\0'))
            {
                return invalid(format!(
                    "{field} must be a shell command of 1 to {MAX_COMMAND} bytes without NUL (got {} bytes)",
                    cmd.len()
                ));
            }
        }
        if t.ready.is_some() && t.start.is_none() {
            return invalid("ready checks the start service: give start too".into());
        }
        if let Err(problem) = check_exec_defaults(&t.exec) {
            return invalid(problem);
        }
        if matches!(t.base, Base::Oci(_)) && (!t.packages.is_empty() || !t.pip.is_empty()) {
            return invalid("an OCI image base installs no packages: put them in the image".into());
        }
        if t.warmup_eval.is_some() && t.python.is_none() {
            return invalid("warmup_eval needs python = \"/path/to/python3\"".into());
        }
        Ok(t)
    }
}

/// `[exec]`'s fields are what the agent will apply: plain variable names, values without
/// NUL, an absolute working directory, a user as an image config writes one.
fn check_exec_defaults(d: &ExecDefaults) -> Result<(), String> {
    if d.env.len() > MAX_ENV {
        return Err(format!("[exec] env has {} variables, at most {MAX_ENV}", d.env.len()));
    }
    for (k, v) in &d.env {
        let name_ok = !k.is_empty() && k.len() <= 256 && !k.contains(['=', '\0']);
        if !name_ok || v.len() > MAX_ENV_BYTES || v.contains('\0') {
            return Err(format!(
                "[exec] env {:?}: a name without '=' or NUL and a value of at most {MAX_ENV_BYTES} bytes without NUL",
                k.chars().take(64).collect::<String>()
            ));
        }
    }
    if let Some(cwd) = d.cwd.as_deref().filter(|c| !c.starts_with('/') || c.len() > 4096 || c.contains('\0')) {
        return Err(format!("[exec] cwd {cwd:?} must be an absolute path"));
    }
    if let Some(u) = d.user.as_deref() {
        let ok = u.split(':').count() <= 2
            && u.split(':').all(|p| {
                (1..=32).contains(&p.len()) && p.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
            });
        if !ok {
            return Err(format!("[exec] user {u:?} must be a name or id, optionally with :group"));
        }
    }
    Ok(())
}

/// Debian policy §5.6.1: lower-case letters, digits, `+`, `-`, `.`; two or more
/// characters, starting with a letter or digit.
fn is_debian_package(p: &str) -> bool {
    p.len() >= 2
        && p.len() <= 128
        && p.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
}

/// A PEP 508 name with optional extras and version specifiers; no URLs, paths, spaces,
/// quotes or options.
fn is_pip_requirement(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 200
        && p.starts_with(|c: char| c.is_ascii_alphanumeric())
        && p.chars().all(|c| c.is_ascii_alphanumeric() || "._-[],<>=!~".contains(c))
}

/// A portable user name (`useradd`'s default rule, without `$`); `root` is one already.
fn is_user_name(u: &str) -> bool {
    (1..=32).contains(&u.len())
        && u != "root"
        && u.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && u.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

fn is_plain_absolute_path(p: &str) -> bool {
    p.starts_with('/')
        && p.len() <= 256
        && !p.split('/').any(|c| c == "..")
        && p.chars().all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_templates_parse() {
        for (name, text) in super::super::catalog::BUILT_IN {
            assert_eq!(Template::parse(text).unwrap().name, *name);
        }
    }

    #[test]
    fn bad_templates_are_refused_with_the_reason() {
        let e = |text: &str| Template::parse(text).unwrap_err().to_string();
        assert!(e("name = \"x\"\nbase = \"alpine\"").contains("expected \"busybox\""));
        assert!(e("name = \"x\"\nbase = \"oci:sha256:../x\"").contains("64 hex digits"));
        let oci = format!("name = \"x\"\nbase = \"oci:sha256:{}\"\n", "0a".repeat(32));
        let t = Template::parse(&format!("{oci}[exec]\nenv = {{ A = \"1\" }}\ncwd = \"/app\"\nuser = \"1000:1000\""))
            .unwrap();
        assert!(matches!(t.base, Base::Oci(_)));
        assert_eq!(
            (t.exec.cwd.as_deref(), t.exec.user.as_deref(), t.exec.env.len()),
            (Some("/app"), Some("1000:1000"), 1)
        );
        assert!(e(&format!("{oci}user = \"app\"")).contains("[exec] user"));
        assert!(e(&format!("{oci}packages = [\"vim\"]")).contains("installs no packages"));
        assert!(e(&format!("{oci}[exec]\ncwd = \"app\"")).contains("absolute"));
        assert!(e(&format!("{oci}[exec]\nuser = \"a b\"")).contains("name or id"));
        assert!(e(&format!("{oci}[exec]\nenv = {{ \"A=B\" = \"1\" }}")).contains("without '='"));
        assert!(e(&format!("{oci}[exec]\nsurprise = 1")).contains("unknown field"));
        assert!(e("name = \"x\"\nbase = \"busybox\"\npackages = [\"vim\"]").contains("no package manager"));
        assert!(e("name = \"x\"\nbase = \"busybox\"\nuser = \"user\"").contains("user needs a debian base"));
        assert!(e("name = \"x\"\nbase = \"busybox\"\nready = \"true\"").contains("give start too"));
        assert!(e("name = \"x\"\nbase = \"busybox\"\nstart = \" \"").contains("start must be a shell command"));
        let long = format!("name = \"x\"\nbase = \"busybox\"\nstart = \"{}\"", "a".repeat(MAX_COMMAND + 1));
        assert!(e(&long).contains("4096"));
        for bad in ["root", "User", "1user", "a b", "x'y", ""] {
            let text = format!("name = \"x\"\nbase = \"debian:bookworm\"\nuser = \"{bad}\"");
            assert!(e(&text).contains("must start with"), "{bad}");
        }
        assert_eq!(
            Template::parse("name = \"x\"\nbase = \"debian:bookworm\"\nuser = \"user\"").unwrap().user.as_deref(),
            Some("user")
        );
        assert!(e("name = \"x\"\nbase = \"busybox\"\n[files]\n\"../etc\" = \"\"").contains("absolute"));
        assert!(e("name = \"x y\"\nbase = \"busybox\"").contains("letters"));
        assert!(e("name = \"x\"\nbase = \"busybox\"\nsurprise = 1").contains("unknown field"));
        let debian = |line: &str| e(&format!("name = \"x\"\nbase = \"debian:bookworm\"\n{line}"));
        assert!(debian("packages = [\"vim; rm -rf /\"]").contains("not a Debian package name"));
        assert!(debian("packages = [\"-oDpkg::Pre-Invoke=x\"]").contains("not a Debian package name"));
        assert!(debian("pip = [\"numpy' && curl x\"]").contains("pip requirement"));
        assert!(debian("pip = [\"--index-url=http://x\"]").contains("pip requirement"));
        assert!(debian("pip = [\"git+https://x/y\"]").contains("pip requirement"));
        assert!(debian("python = \"/usr/bin/python3 -c x\"").contains("absolute path"));
        assert!(e("name = \"x\"\nbase = \"busybox\"\nvcpus = 0").contains("1 to 16 vCPUs"));
        assert!(e("name = \"x\"\nbase = \"busybox\"\nvcpus = 17").contains("1 to 16 vCPUs"));
        assert!(e("name = \"x\"\nbase = \"busybox\"\nvcpus = 300").contains("vcpus"));
        assert_eq!(Template::parse("name = \"x\"\nbase = \"busybox\"\nvcpus = 4").unwrap().vcpus, Some(4));
        assert!(e("name = \"x\"\nbase = \"busybox\"\nmemory_mib = 32").contains("64 to 16384 MiB"));
        assert!(e("name = \"x\"\nbase = \"busybox\"\nmemory_mib = 20000").contains("64 to 16384 MiB"));
        assert!(e("name = \"x\"\nbase = \"busybox\"\nmemory_mib = -1").contains("memory_mib"));
        assert_eq!(
            Template::parse("name = \"x\"\nbase = \"busybox\"\nmemory_mib = 512").unwrap().memory_mib,
            Some(512)
        );
        let ok = "name = \"x\"\nbase = \"debian:bookworm\"\npackages = [\"python3-pip\", \"g++\"]\n\
                  pip = [\"numpy>=1.26,<2\", \"requests[socks]==2.31.0\"]\npython = \"/usr/bin/python3.11\"";
        Template::parse(ok).unwrap();
    }

    #[test]
    fn vcpus_are_not_part_of_the_image() {
        let plain = "# tiny\nname = \"tiny\"\nbase = \"busybox\"\n";
        assert_eq!(image_text(plain), plain, "a template without vcpus keeps its text, and its image key");
        let two = image_text("name = \"tiny\"\nvcpus = 2\nbase = \"busybox\"\n").into_owned();
        let four = image_text("name = \"tiny\"\nbase = \"busybox\"\nvcpus = 4\n").into_owned();
        assert_eq!(two, four, "only the vCPU count differs");
        assert!(!two.contains("vcpus"), "{two}");
        let other = image_text("name = \"tiny\"\nbase = \"busybox\"\nvcpus = 2\n[files]\n\"/a\" = \"b\"\n");
        assert_ne!(two, other, "everything else still counts");
        let big = image_text("name = \"tiny\"\nmemory_mib = 1024\nbase = \"busybox\"\nvcpus = 2\n").into_owned();
        assert_eq!(big, two, "nor does the memory size");
    }
}
