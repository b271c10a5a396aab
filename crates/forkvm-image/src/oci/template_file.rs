//! The template an imported image becomes: a `<name>.toml` in the template directory
//! whose base is the image's manifest, with the image config's defaults as `[exec]`.
//! The file is the user's to edit afterwards (a changed file is a new image key).

use super::defaults::ImageDefaults;
use super::Imported;
use crate::rootfs::catalog::is_template_name;
use crate::rootfs::template::{Template, TemplateError};
use std::path::{Path, PathBuf};

/// What the caller adds to what the image says.
#[derive(Debug, Clone, Default)]
pub struct TemplateOptions {
    /// The `start` service; `None` runs none.
    pub start: Option<String>,
    pub ready: Option<String>,
    pub vcpus: Option<u8>,
    pub memory_mib: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum TemplateFileError {
    #[error("{0:?} is not a template name (1-64 letters, digits, '-' or '_')")]
    BadName(String),
    #[error("template {0} exists already (give --force to replace it)")]
    Exists(PathBuf),
    #[error("the template made from the image is not valid: {0}")]
    Invalid(#[from] TemplateError),
    #[error("writing the template {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// The TOML text of the template `name` for `image`, checked to parse.
pub fn template_text(
    name: &str,
    image: &Imported,
    defaults: &ImageDefaults,
    options: &TemplateOptions,
) -> Result<String, TemplateFileError> {
    if !is_template_name(name) {
        return Err(TemplateFileError::BadName(name.chars().take(80).collect()));
    }
    let mut t = toml::Table::new();
    t.insert("name".into(), name.into());
    t.insert("base".into(), format!("oci:{}", image.manifest).into());
    if let Some(v) = options.vcpus {
        t.insert("vcpus".into(), i64::from(v).into());
    }
    if let Some(m) = options.memory_mib {
        t.insert("memory_mib".into(), i64::from(m).into());
    }
    if let Some(s) = &options.start {
        t.insert("start".into(), s.clone().into());
    }
    if let Some(r) = &options.ready {
        t.insert("ready".into(), r.clone().into());
    }
    if !defaults.exec.is_empty() {
        let exec = toml::Table::try_from(&defaults.exec).map_err(|e| {
            TemplateFileError::Invalid(TemplateError::Invalid { path: String::new(), problem: e.to_string() })
        })?;
        t.insert("exec".into(), exec.into());
    }
    // The text is what the image key hashes: nothing here may differ between two imports
    // of one image (not where it was imported from).
    let mut text = String::from("# Made by `forkvm template from-oci`\n");
    if let Some(cmd) = defaults.command_line() {
        text.push_str(&format!("# The image's command (Entrypoint + Cmd): {}\n", cmd.replace('\n', " ")));
    }
    if !defaults.exposed_ports.is_empty() {
        text.push_str(&format!("# The image exposes: {}\n", defaults.exposed_ports.join(", ")));
    }
    text.push_str(&toml::to_string(&t).unwrap_or_default());
    Template::parse(&text)?;
    Ok(text)
}

/// Writes `text` as `<dir>/<name>.toml` (atomically); refuses to replace a file
/// unless `force`.
pub fn save_template(dir: &Path, name: &str, text: &str, force: bool) -> Result<PathBuf, TemplateFileError> {
    let path = dir.join(format!("{name}.toml"));
    if path.exists() && !force {
        return Err(TemplateFileError::Exists(path));
    }
    let write = |source| TemplateFileError::Write { path: path.clone(), source };
    std::fs::create_dir_all(dir).map_err(write)?;
    let tmp = dir.join(format!(".{name}.toml.tmp"));
    std::fs::write(&tmp, text).map_err(write)?;
    std::fs::rename(&tmp, &path).map_err(write)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::writer::{ImageSpec, LayerBuilder};
    use crate::oci::{import, BlobStore};

    #[test]
    fn an_imported_image_becomes_a_template_that_parses() {
        let dir = tempfile::tempdir().unwrap();
        let layer = LayerBuilder::new().file("bin/app", b"x", 0o755, 0).unwrap().finish().unwrap();
        let spec = ImageSpec {
            layers: vec![layer],
            config: serde_json::json!({"Env": ["PATH=/bin", "Q=it's \"quoted\""], "WorkingDir": "/srv",
                "User": "1000", "Cmd": ["/bin/app", "--port", "80"], "ExposedPorts": {"80/tcp": {}}}),
        };
        spec.write_layout_dir(&dir.path().join("img")).unwrap();
        let image = import(&dir.path().join("img"), &BlobStore::new(dir.path().join("store"))).unwrap();
        let defaults = ImageDefaults::from_config(&image.config);
        let options = TemplateOptions { start: defaults.command_line(), memory_mib: Some(512), ..Default::default() };
        let text = template_text("web", &image, &defaults, &options).unwrap();
        let t = Template::parse(&text).unwrap();
        assert_eq!(t.exec.env.get("Q").map(String::as_str), Some("it's \"quoted\""));
        assert_eq!((t.exec.user.as_deref(), t.start.as_deref()), (Some("1000"), Some("/bin/app --port 80")));
        assert!(text.contains("# The image exposes: 80/tcp"), "{text}");
        let saved = save_template(&dir.path().join("templates"), "web", &text, false).unwrap();
        let e = save_template(&dir.path().join("templates"), "web", &text, false).unwrap_err().to_string();
        assert!(e.contains("exists already"), "{e}");
        assert_eq!(std::fs::read_to_string(saved).unwrap(), text);
        assert!(template_text("../evil", &image, &defaults, &options).is_err());
    }
}
