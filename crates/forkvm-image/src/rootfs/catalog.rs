//! Which templates exist: the built-in ones, compiled into the binary, and those in the
//! configured template directory. Callers name a template; they never give a path, so
//! no request or command line can point a build (which runs package managers) at a
//! file the operator did not put in the catalog.
//!
//! The template directory is `$FORKVM_TEMPLATES`, else `/etc/forkvm/templates` for root,
//! else `$XDG_CONFIG_HOME/forkvm/templates` (`~/.config/forkvm/templates`). A template
//! there named like a built-in one replaces it.

use super::template::{Template, TemplateError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Environment variable naming the template directory.
pub const TEMPLATES_ENV: &str = "FORKVM_TEMPLATES";

/// The templates shipped inside the binary: (name, TOML text).
pub const BUILT_IN: &[(&str, &str)] = &[
    ("tiny", include_str!("../../../../templates/tiny.toml")),
    ("python", include_str!("../../../../templates/python.toml")),
    ("code-interpreter", include_str!("../../../../templates/code-interpreter.toml")),
];

/// Longest template name.
pub const MAX_NAME: usize = 64;

/// Where a template came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    BuiltIn,
    File(PathBuf),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::BuiltIn => f.write_str("built in"),
            Origin::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A template found by name: parsed, with the text its image key hashes.
#[derive(Debug, Clone)]
pub struct CatalogTemplate {
    pub template: Template,
    pub text: String,
    pub origin: Origin,
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(
        "template {name:?} is not a template name: give one of {known} (names are 1-{MAX_NAME} letters, digits, '-' or '_'; paths are not accepted: put the file in {dir} instead)"
    )]
    NotAName { name: String, known: String, dir: String },
    #[error("no template {name:?}: the templates are {known} (built in, and from {dir})")]
    Unknown { name: String, known: String, dir: String },
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("template {path}: its name field {inner:?} differs from its file name")]
    NameMismatch { path: String, inner: String },
}

impl CatalogError {
    /// The API's error code: every catalog error is the caller's (400).
    pub fn code(&self) -> forkvm_api::ErrorCode {
        forkvm_api::ErrorCode::BadRequest
    }
}

/// The built-in templates plus one directory.
#[derive(Debug, Clone)]
pub struct Catalog {
    dir: PathBuf,
}

/// Whether `name` can name a template.
pub fn is_template_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl Catalog {
    /// The catalog over the configured directory (see the module doc).
    pub fn configured() -> Catalog {
        Catalog::with_dir(default_dir())
    }

    pub fn with_dir(dir: PathBuf) -> Catalog {
        Catalog { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every template name, sorted: built-in ones and the directory's `*.toml` files.
    pub fn names(&self) -> Vec<String> {
        self.entries().into_keys().collect()
    }

    /// Names with where each comes from.
    pub fn entries(&self) -> BTreeMap<String, Origin> {
        let mut out: BTreeMap<String, Origin> =
            BUILT_IN.iter().map(|(n, _)| (n.to_string(), Origin::BuiltIn)).collect();
        if let Ok(dir) = std::fs::read_dir(&self.dir) {
            for e in dir.flatten() {
                let path = e.path();
                let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
                if path.extension().is_some_and(|x| x == "toml") && is_template_name(&stem) {
                    out.insert(stem, Origin::File(path));
                }
            }
        }
        out
    }

    /// The template called `name`: the directory's `<name>.toml`, else the built-in one.
    pub fn get(&self, name: &str) -> Result<CatalogTemplate, CatalogError> {
        let known = || self.names().join(", ");
        let dir = self.dir.display().to_string();
        if !is_template_name(name) {
            return Err(CatalogError::NotAName { name: name.chars().take(200).collect(), known: known(), dir });
        }
        let path = self.dir.join(format!("{name}.toml"));
        if path.is_file() {
            let (template, text) = Template::load(&path)?;
            if template.name != name {
                return Err(CatalogError::NameMismatch { path: path.display().to_string(), inner: template.name });
            }
            return Ok(CatalogTemplate { template, text, origin: Origin::File(path) });
        }
        match BUILT_IN.iter().find(|(n, _)| *n == name) {
            Some((_, text)) => {
                let template = Template::parse(text)?;
                Ok(CatalogTemplate { template, text: text.to_string(), origin: Origin::BuiltIn })
            }
            None => Err(CatalogError::Unknown { name: name.into(), known: known(), dir }),
        }
    }
}

/// `$FORKVM_TEMPLATES`, else `/etc/forkvm/templates` (root), else the user's config dir.
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(TEMPLATES_ENV) {
        return PathBuf::from(d);
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/etc/forkvm/templates");
    }
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("/nonexistent"));
    config.join("forkvm/templates")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_templates_need_no_directory() {
        let c = Catalog::with_dir(PathBuf::from("/nonexistent/templates"));
        assert_eq!(c.names(), ["code-interpreter", "python", "tiny"]);
        for (name, _) in BUILT_IN {
            let t = c.get(name).unwrap();
            assert_eq!((t.template.name.as_str(), t.origin), (*name, Origin::BuiltIn));
        }
    }

    #[test]
    fn paths_are_not_names() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("evil.toml");
        std::fs::write(&outside, "name = \"evil\"\nbase = \"busybox\"\n").unwrap();
        let c = Catalog::with_dir(dir.path().join("templates"));
        for bad in [outside.to_str().unwrap(), "../evil", "evil.toml", "", "a/b", &"x".repeat(65)] {
            let e = c.get(bad).unwrap_err().to_string();
            assert!(e.contains("code-interpreter, python, tiny"), "{bad}: {e}");
        }
        assert!(c.get("evil").unwrap_err().to_string().contains("no template \"evil\""));
    }

    #[test]
    fn the_directory_adds_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mine.toml"), "name = \"mine\"\nbase = \"busybox\"\n").unwrap();
        std::fs::write(dir.path().join("tiny.toml"), "name = \"tiny\"\nbase = \"busybox\"\n# local\n").unwrap();
        std::fs::write(dir.path().join("wrong.toml"), "name = \"other\"\nbase = \"busybox\"\n").unwrap();
        let c = Catalog::with_dir(dir.path().to_path_buf());
        assert_eq!(c.names(), ["code-interpreter", "mine", "python", "tiny", "wrong"]);
        assert!(matches!(c.get("mine").unwrap().origin, Origin::File(_)));
        assert!(c.get("tiny").unwrap().text.contains("# local"));
        assert!(matches!(c.get("wrong"), Err(CatalogError::NameMismatch { .. })));
    }
}
