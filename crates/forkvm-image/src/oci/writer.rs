//! Writing images: an OCI layout directory or archive, or an old-style `docker save`
//! archive, from layers and a config. The tests and `forkvm bench oci` make their
//! images with it, so they need no registry, no Docker and no network.

use super::digest::Digest;
use std::io::Write;
use std::path::Path;

/// One image: its layers (tar bytes, compressed or not), lowest first, and its config's
/// `config` object (Env, WorkingDir, User, Entrypoint, Cmd, ...).
#[derive(Debug, Clone)]
pub struct ImageSpec {
    pub layers: Vec<Vec<u8>>,
    pub config: serde_json::Value,
}

impl ImageSpec {
    fn config_json(&self) -> Vec<u8> {
        let diff_ids: Vec<String> = self.layers.iter().map(|l| Digest::of(l).to_string()).collect();
        serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "config": self.config,
        }))
        .unwrap_or_default()
    }

    /// The layout's files: (path, bytes), `index.json` and `oci-layout` included.
    fn layout_files(&self) -> Vec<(String, Vec<u8>)> {
        let blob = |bytes: &[u8]| (format!("blobs/sha256/{}", Digest::of(bytes).hex()), bytes.to_vec());
        let config = self.config_json();
        let descriptor = |media: &str, bytes: &[u8]| serde_json::json!({"mediaType": media, "digest": Digest::of(bytes).to_string(), "size": bytes.len()});
        let layers: Vec<serde_json::Value> =
            self.layers.iter().map(|l| descriptor("application/vnd.oci.image.layer.v1.tar", l)).collect();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
            "layers": layers,
        }))
        .unwrap_or_default();
        let mut index = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
        index["platform"] = serde_json::json!({"architecture": "amd64", "os": "linux"});
        let index =
            serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [index]})).unwrap_or_default();
        let mut files = vec![
            ("oci-layout".to_string(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
            ("index.json".to_string(), index),
            blob(&manifest),
            blob(&config),
        ];
        files.extend(self.layers.iter().map(|l| blob(l)));
        files
    }

    /// Writes an OCI image layout into the directory `dir`.
    pub fn write_layout_dir(&self, dir: &Path) -> std::io::Result<()> {
        for (path, bytes) in self.layout_files() {
            let path = dir.join(path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, bytes)?;
        }
        Ok(())
    }

    /// Writes an OCI archive (the layout as one tar) to `path`.
    pub fn write_oci_archive(&self, path: &Path) -> std::io::Result<()> {
        write_tar(path, self.layout_files())
    }

    /// Writes an archive as the `docker save` of Docker before 25 made it:
    /// `manifest.json`, `<id>.json` and `<id>/layer.tar`.
    pub fn write_docker_save(&self, path: &Path, tag: &str) -> std::io::Result<()> {
        let config = self.config_json();
        let config_name = format!("{}.json", Digest::of(&config).hex());
        let mut files = vec![(config_name.clone(), config)];
        let mut layer_names = Vec::new();
        for l in &self.layers {
            let name = format!("{}/layer.tar", Digest::of(l).hex());
            files.push((name.clone(), l.clone()));
            layer_names.push(name);
        }
        let manifest = serde_json::json!([{"Config": config_name, "RepoTags": [tag], "Layers": layer_names}]);
        // Docker writes manifest.json last, after the blobs it names.
        files.push(("manifest.json".into(), serde_json::to_vec(&manifest).unwrap_or_default()));
        write_tar(path, files)
    }
}

fn write_tar(path: &Path, files: Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
    let mut tar = tar::Builder::new(std::io::BufWriter::new(std::fs::File::create(path)?));
    for (name, bytes) in files {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_size(bytes.len() as u64);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, &name, &bytes[..])?;
    }
    tar.into_inner()?.flush()
}

/// A layer under construction: entries appended in order.
pub struct LayerBuilder(tar::Builder<Vec<u8>>);

impl std::fmt::Debug for LayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LayerBuilder")
    }
}

impl Default for LayerBuilder {
    fn default() -> Self {
        LayerBuilder::new()
    }
}

impl LayerBuilder {
    pub fn new() -> LayerBuilder {
        LayerBuilder(tar::Builder::new(Vec::new()))
    }

    fn header(kind: tar::EntryType, mode: u32, owner: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(owner.into());
        h.set_gid(owner.into());
        h.set_mtime(1_700_000_000);
        h.set_size(0);
        h
    }

    pub fn dir(mut self, path: &str, mode: u32, owner: u32) -> std::io::Result<LayerBuilder> {
        let mut h = LayerBuilder::header(tar::EntryType::Directory, mode, owner);
        self.0.append_data(&mut h, path, std::io::empty())?;
        Ok(self)
    }

    pub fn file(mut self, path: &str, body: &[u8], mode: u32, owner: u32) -> std::io::Result<LayerBuilder> {
        let mut h = LayerBuilder::header(tar::EntryType::Regular, mode, owner);
        h.set_size(body.len() as u64);
        self.0.append_data(&mut h, path, body)?;
        Ok(self)
    }

    pub fn symlink(mut self, path: &str, target: &str) -> std::io::Result<LayerBuilder> {
        let mut h = LayerBuilder::header(tar::EntryType::Symlink, 0o777, 0);
        self.0.append_link(&mut h, path, target)?;
        Ok(self)
    }

    pub fn hard_link(mut self, path: &str, target: &str) -> std::io::Result<LayerBuilder> {
        let mut h = LayerBuilder::header(tar::EntryType::Link, 0o644, 0);
        self.0.append_link(&mut h, path, target)?;
        Ok(self)
    }

    /// `.wh.<name>` in `name`'s directory: removes `name` of the layers below.
    pub fn whiteout(self, path: &str) -> std::io::Result<LayerBuilder> {
        let p = Path::new(path);
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let wh = p.with_file_name(format!(".wh.{name}"));
        self.file(&wh.to_string_lossy(), b"", 0o644, 0)
    }

    /// `.wh..wh..opq` in `dir`: empties it of what the layers below put there.
    pub fn opaque(self, dir: &str) -> std::io::Result<LayerBuilder> {
        self.file(&format!("{}/.wh..wh..opq", dir.trim_end_matches('/')), b"", 0o644, 0)
    }

    pub fn finish(self) -> std::io::Result<Vec<u8>> {
        self.0.into_inner()
    }

    /// The layer gzip-compressed, as registries and `docker save` of today carry them.
    pub fn finish_gzip(self) -> std::io::Result<Vec<u8>> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&self.finish()?)?;
        gz.finish()
    }
}
