//! Bringing an image into the blob store from where a user has it: an OCI image layout
//! directory (`skopeo copy ... oci:DIR`, `umoci`), or one tar archive of either an OCI
//! layout (`docker buildx --output type=oci`, `podman save --format oci-archive`, the
//! `docker save` of Docker 25+) or Docker's older `docker save` format (`manifest.json`
//! naming `<id>/layer.tar` files). A gzip-compressed archive is read the same way.
//!
//! Whatever the source, what lands in the store is an OCI manifest, its config and its
//! layers, each checked against its digest; the result names the manifest, which is all
//! a template needs to refer to the image (`base = "oci:sha256:<hex>"`).

use super::digest::Digest;
use super::store::{parse_json, BlobStore, MAX_JSON};
use super::OciError;
use oci_spec::image::{Arch, Descriptor, ImageIndex, ImageManifest, ImageManifestBuilder, MediaType, Os};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

/// The most entries read from an image archive.
const MAX_ARCHIVE_ENTRIES: usize = 100_000;
/// How deep an index may nest other indexes.
const MAX_INDEX_DEPTH: usize = 4;

/// An image in the store.
#[derive(Debug, Clone)]
pub struct Imported {
    pub manifest: Digest,
    /// Its layers, lowest first.
    pub layers: Vec<Digest>,
    pub config: oci_spec::image::ImageConfiguration,
    /// Bytes of the blobs that were not in the store before this import.
    pub new_bytes: u64,
    /// Bytes of the blobs that were (shared with images imported earlier).
    pub shared_bytes: u64,
}

/// Imports the image at `source` (a layout directory or an archive) into `store`.
pub fn import(source: &Path, store: &BlobStore) -> Result<Imported, OciError> {
    let meta = std::fs::metadata(source)
        .map_err(|e| OciError::Source { path: source.into(), problem: format!("cannot read it: {e}") })?;
    let mut tally = Tally::default();
    let manifest = if meta.is_dir() {
        import_layout_dir(source, store, &mut tally)?
    } else {
        import_archive(source, store, &mut tally)?
    };
    let mut image = resolve(store, &manifest)?;
    (image.new_bytes, image.shared_bytes) = (tally.new_bytes, tally.shared_bytes);
    Ok(image)
}

/// The image whose manifest is `manifest` (already in `store`), checked to be one a
/// forkvm guest can run: linux/amd64, every layer present.
pub fn resolve(store: &BlobStore, manifest: &Digest) -> Result<Imported, OciError> {
    let m: ImageManifest = store.read_json(manifest, "image manifest")?;
    let config_digest = digest_of(m.config())?;
    let config: oci_spec::image::ImageConfiguration = store.read_json(&config_digest, "image config")?;
    if *config.os() != Os::Linux || *config.architecture() != Arch::Amd64 {
        return Err(OciError::Invalid(format!(
            "the image is for {}/{}; forkvm guests are linux/amd64",
            config.os(),
            config.architecture()
        )));
    }
    let layers = m.layers().iter().map(digest_of).collect::<Result<Vec<_>, _>>()?;
    for layer in &layers {
        if !store.has(layer) {
            return Err(OciError::Invalid(format!("layer {layer} is not in the store {}", store.root().display())));
        }
    }
    Ok(Imported { manifest: manifest.clone(), layers, config, new_bytes: 0, shared_bytes: 0 })
}

fn digest_of(d: &Descriptor) -> Result<Digest, OciError> {
    let text = d.digest().to_string();
    Digest::parse(&text).ok_or_else(|| OciError::Invalid(format!("digest {text:?} is not a sha256 digest")))
}

#[derive(Default)]
struct Tally {
    new_bytes: u64,
    shared_bytes: u64,
}

impl Tally {
    fn put(&mut self, store: &BlobStore, from: &mut dyn Read, expect: Option<&Digest>) -> Result<Digest, OciError> {
        let (digest, len, new) = store.put(from, expect)?;
        match new {
            true => self.new_bytes += len,
            false => self.shared_bytes += len,
        }
        Ok(digest)
    }
}

/// Picks the manifest for linux/amd64 from an index (following nested indexes), with
/// `fetch` giving the bytes of a blob by digest; returns the manifest's digest.
fn pick_manifest(
    index: &ImageIndex,
    fetch: &mut dyn FnMut(&Digest) -> Result<Vec<u8>, OciError>,
    depth: usize,
) -> Result<Digest, OciError> {
    let runs_here = |d: &&Descriptor| {
        d.platform().as_ref().is_none_or(|p| *p.os() == Os::Linux && *p.architecture() == Arch::Amd64)
    };
    let candidates: Vec<&Descriptor> = index.manifests().iter().filter(runs_here).collect();
    let chosen = match candidates.as_slice() {
        [one] => *one,
        [] => {
            let have: Vec<String> = index
                .manifests()
                .iter()
                .filter_map(|d| d.platform().as_ref().map(|p| format!("{}/{}", p.os(), p.architecture())))
                .collect();
            return Err(OciError::Invalid(format!(
                "the image has no linux/amd64 manifest (it has {})",
                if have.is_empty() { "none".into() } else { have.join(", ") }
            )));
        }
        many => {
            // Several without a platform (several tags in one layout): refuse to guess.
            let tagged: Vec<&&Descriptor> = many.iter().filter(|d| d.platform().is_some()).collect();
            match tagged.as_slice() {
                [one] => **one,
                _ => {
                    return Err(OciError::Invalid(format!(
                    "the image index lists {} manifests that could run here; give an archive or layout of one image",
                    many.len()
                )))
                }
            }
        }
    };
    let digest = digest_of(chosen)?;
    let is_index = matches!(chosen.media_type(), MediaType::ImageIndex)
        || chosen.media_type().to_string() == "application/vnd.docker.distribution.manifest.list.v2+json";
    if !is_index {
        return Ok(digest);
    }
    if depth >= MAX_INDEX_DEPTH {
        return Err(OciError::Invalid(format!("image indexes nest deeper than {MAX_INDEX_DEPTH}")));
    }
    let nested: ImageIndex = parse_json(&fetch(&digest)?, "image index")?;
    pick_manifest(&nested, fetch, depth + 1)
}

/// An OCI layout directory: `index.json` and `blobs/sha256/<hex>`.
fn import_layout_dir(dir: &Path, store: &BlobStore, tally: &mut Tally) -> Result<Digest, OciError> {
    let source_err = |problem: String| OciError::Source { path: dir.into(), problem };
    let read_small = |path: PathBuf| -> Result<Vec<u8>, OciError> {
        let mut bytes = Vec::new();
        let file = std::fs::File::open(&path).map_err(|e| source_err(format!("reading {}: {e}", path.display())))?;
        file.take(MAX_JSON + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| source_err(format!("reading {}: {e}", path.display())))?;
        Ok(bytes)
    };
    if !dir.join("index.json").is_file() {
        return Err(source_err("a directory image must be an OCI image layout (it has no index.json)".into()));
    }
    let index: ImageIndex = parse_json(&read_small(dir.join("index.json"))?, "image index")?;
    let blob = |d: &Digest| dir.join("blobs/sha256").join(d.hex());
    let mut fetch = |d: &Digest| read_small(blob(d));
    let manifest = pick_manifest(&index, &mut fetch, 0)?;
    let bytes = read_small(blob(&manifest))?;
    tally.put(store, &mut &bytes[..], Some(&manifest))?;
    let m: ImageManifest = parse_json(&bytes, "image manifest")?;
    for d in std::iter::once(m.config()).chain(m.layers()) {
        let d = digest_of(d)?;
        let path = blob(&d);
        let mut file =
            std::fs::File::open(&path).map_err(|e| source_err(format!("reading {}: {e}", path.display())))?;
        tally.put(store, &mut file, Some(&d))?;
    }
    Ok(manifest)
}

/// What one pass over an archive found.
#[derive(Default)]
struct ArchiveFiles {
    /// Small metadata documents by path (`index.json`, `manifest.json`).
    documents: BTreeMap<String, Vec<u8>>,
    /// Every other regular file, stored as a blob: path → digest.
    blobs: BTreeMap<String, Digest>,
    /// Symbolic links (newer `docker save` links `<id>/layer.tar` to a blob): path → target path.
    links: BTreeMap<String, String>,
}

/// One pass over a tar archive (gzip-compressed or not): every regular file goes into the
/// store as it streams past (whatever its name, checked against it when it is
/// `blobs/sha256/<hex>`), the metadata documents are kept; then the manifest is found.
fn import_archive(path: &Path, store: &BlobStore, tally: &mut Tally) -> Result<Digest, OciError> {
    let source_err = |problem: String| OciError::Source { path: path.into(), problem };
    let file = std::fs::File::open(path).map_err(|e| source_err(format!("opening it: {e}")))?;
    let mut reader = BufReader::new(file);
    let gzipped = reader.fill_buf().map_err(|e| source_err(format!("reading it: {e}")))?.starts_with(&[0x1f, 0x8b]);
    let stream: Box<dyn Read> = match gzipped {
        true => Box::new(flate2::read::GzDecoder::new(reader)),
        false => Box::new(reader),
    };
    let mut archive = tar::Archive::new(stream);
    let mut found = ArchiveFiles::default();
    let entries = archive.entries().map_err(|e| source_err(format!("not a tar archive: {e}")))?;
    for (n, entry) in entries.enumerate() {
        if n >= MAX_ARCHIVE_ENTRIES {
            return Err(source_err(format!("more than {MAX_ARCHIVE_ENTRIES} entries: not an image archive")));
        }
        let mut entry = entry.map_err(|e| source_err(format!("reading entry {n}: {e}")))?;
        let raw = entry.path().map_err(|e| source_err(format!("entry {n}'s name: {e}")))?.into_owned();
        let Some(name) = archive_name(&raw) else { continue };
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            tar::EntryType::Symlink => {
                let target = entry.link_name().ok().flatten().map(|t| t.into_owned()).unwrap_or_default();
                let base = Path::new(&name).parent().unwrap_or(Path::new(""));
                if let Some(t) = archive_name(&base.join(target)) {
                    found.links.insert(name, t);
                }
                continue;
            }
            _ => continue,
        }
        let is_document = matches!(name.as_str(), "index.json" | "manifest.json" | "oci-layout" | "repositories");
        if is_document {
            let mut bytes = Vec::new();
            (&mut entry).take(MAX_JSON + 1).read_to_end(&mut bytes).map_err(|e| source_err(format!("{name}: {e}")))?;
            found.documents.insert(name, bytes);
            continue;
        }
        let expect = name.strip_prefix("blobs/sha256/").map(|hex| {
            Digest::from_hex(hex).ok_or_else(|| source_err(format!("{name} is not named by a sha256 digest")))
        });
        let expect = expect.transpose()?;
        let digest = tally.put(store, &mut entry, expect.as_ref())?;
        found.blobs.insert(name, digest);
    }
    if let Some(index) = found.documents.get("index.json") {
        let index: ImageIndex = parse_json(index, "image index")?;
        let mut fetch = |d: &Digest| -> Result<Vec<u8>, OciError> {
            let mut bytes = Vec::new();
            store.open(d)?.take(MAX_JSON + 1).read_to_end(&mut bytes).map_err(|source| OciError::Store {
                step: "reading a blob",
                path: store.path(d),
                source,
            })?;
            Ok(bytes)
        };
        return pick_manifest(&index, &mut fetch, 0);
    }
    match found.documents.get("manifest.json") {
        Some(m) => docker_manifest(m, &found, store),
        None => Err(source_err("neither an OCI archive (index.json) nor a docker save archive (manifest.json)".into())),
    }
}

/// A name inside an archive, normalised (`./a/b` → `a/b`); `None` for the archive's
/// root or a name that climbs out of it.
fn archive_name(raw: &Path) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in raw.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str()?.to_string()),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::Prefix(_) => return None,
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// One entry of an old `docker save`'s `manifest.json`.
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerSaveEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// Makes an OCI manifest for the one image of an old `docker save` archive and stores it.
fn docker_manifest(bytes: &[u8], found: &ArchiveFiles, store: &BlobStore) -> Result<Digest, OciError> {
    let entries: Vec<DockerSaveEntry> = parse_json(bytes, "docker save manifest.json")?;
    let entry = match entries.as_slice() {
        [one] => one,
        [] => return Err(OciError::Invalid("the docker save archive holds no image".into())),
        many => {
            let tags: Vec<String> = many.iter().flat_map(|e| e.repo_tags.clone().unwrap_or_default()).collect();
            return Err(OciError::Invalid(format!(
                "the docker save archive holds {} images ({}); save one image per archive",
                many.len(),
                tags.join(", ")
            )));
        }
    };
    let blob =
        |name: &str| -> Result<Digest, OciError> {
            let mut name = archive_name(Path::new(name))
                .ok_or_else(|| OciError::Invalid(format!("manifest.json names {name:?}, not a file of the archive")))?;
            for _ in 0..8 {
                match found.links.get(&name) {
                    Some(target) => name = target.clone(),
                    None => break,
                }
            }
            found.blobs.get(&name).cloned().ok_or_else(|| {
                OciError::Invalid(format!("manifest.json names {name:?}, which the archive does not hold"))
            })
        };
    let descriptor = |media: MediaType, d: &Digest| -> Result<Descriptor, OciError> {
        let size = std::fs::metadata(store.path(d)).map(|m| m.len()).unwrap_or(0);
        let digest = oci_spec::image::Digest::from_str(&d.to_string()).map_err(|e| OciError::Invalid(e.to_string()))?;
        Ok(Descriptor::new(media, size, digest))
    };
    let config = descriptor(MediaType::ImageConfig, &blob(&entry.config)?)?;
    let layers =
        entry.layers.iter().map(|l| descriptor(MediaType::ImageLayer, &blob(l)?)).collect::<Result<Vec<_>, _>>()?;
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config)
        .layers(layers)
        .build()
        .map_err(|e| OciError::Invalid(format!("making a manifest for the docker save archive: {e}")))?;
    let json = serde_json::to_vec(&manifest).map_err(|e| OciError::Invalid(e.to_string()))?;
    store.put_bytes(&json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::writer::{ImageSpec, LayerBuilder};

    fn spec(extra: &str) -> ImageSpec {
        // A base big enough to dominate (bytes gzip cannot shrink much).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let body: Vec<u8> = (0..64 * 1024)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let base = LayerBuilder::new().file("etc/base", &body, 0o644, 0).unwrap().finish_gzip().unwrap();
        let top = LayerBuilder::new().file("etc/top", extra.as_bytes(), 0o644, 0).unwrap().finish().unwrap();
        ImageSpec { layers: vec![base, top], config: serde_json::json!({"Env": ["A=1"], "WorkingDir": "/srv"}) }
    }

    #[test]
    fn layouts_oci_archives_and_docker_saves_import_alike_and_share_blobs() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::new(dir.path().join("store"));
        let a = spec("a");
        a.write_layout_dir(&dir.path().join("layout")).unwrap();
        let first = import(&dir.path().join("layout"), &store).unwrap();
        assert_eq!(first.layers.len(), 2);
        assert_eq!(first.shared_bytes, 0);
        assert_eq!(first.config.config().as_ref().unwrap().working_dir().as_deref(), Some("/srv"));
        // The same image as an OCI archive: the same manifest, every blob already stored.
        a.write_oci_archive(&dir.path().join("a.tar")).unwrap();
        let again = import(&dir.path().join("a.tar"), &store).unwrap();
        assert_eq!((again.manifest.clone(), again.new_bytes), (first.manifest.clone(), 0));
        // Another image on the same base: only its own layer, config and manifest are new.
        let b = spec("b");
        b.write_docker_save(&dir.path().join("b.tar"), "b:latest").unwrap();
        let other = import(&dir.path().join("b.tar"), &store).unwrap();
        assert_ne!(other.manifest, first.manifest);
        assert_eq!(other.layers[0], first.layers[0], "the base layer is one blob");
        assert!(other.new_bytes * 4 < other.shared_bytes, "{} new, {} shared", other.new_bytes, other.shared_bytes);
        assert_eq!(resolve(&store, &other.manifest).unwrap().layers, other.layers);
    }

    #[test]
    fn broken_images_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::new(dir.path().join("store"));
        let layout = dir.path().join("layout");
        spec("a").write_layout_dir(&layout).unwrap();
        // A layer whose bytes no longer match its digest.
        let blobs = layout.join("blobs/sha256");
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
        let manifest_hex = index["manifests"][0]["digest"].as_str().unwrap().trim_start_matches("sha256:").to_string();
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(blobs.join(&manifest_hex)).unwrap()).unwrap();
        let layer = manifest["layers"][1]["digest"].as_str().unwrap().trim_start_matches("sha256:").to_string();
        std::fs::write(blobs.join(&layer), b"tampered").unwrap();
        let e = import(&layout, &store).unwrap_err().to_string();
        assert!(e.contains("does not match its digest"), "{e}");
        // Not an image at all.
        std::fs::write(dir.path().join("junk.tar"), b"junk").unwrap();
        let e = import(&dir.path().join("junk.tar"), &store).unwrap_err().to_string();
        assert!(e.contains("junk.tar"), "{e}");
        let e = import(dir.path(), &store).unwrap_err().to_string();
        assert!(e.contains("no index.json"), "{e}");
        // Another platform's image.
        let arm = dir.path().join("arm");
        spec("a").write_layout_dir(&arm).unwrap();
        let text = std::fs::read_to_string(arm.join("index.json")).unwrap().replace("amd64", "arm64");
        std::fs::write(arm.join("index.json"), text).unwrap();
        let e = import(&arm, &store).unwrap_err().to_string();
        assert!(e.contains("no linux/amd64 manifest") && e.contains("linux/arm64"), "{e}");
    }

    #[test]
    fn archive_names_never_leave_the_archive() {
        assert_eq!(archive_name(Path::new("./blobs/sha256/ab")).as_deref(), Some("blobs/sha256/ab"));
        assert_eq!(archive_name(Path::new("/index.json")).as_deref(), Some("index.json"));
        assert_eq!(archive_name(Path::new("abc/../blobs/x")).as_deref(), Some("blobs/x"));
        assert_eq!(archive_name(Path::new("../etc/passwd")), None);
        assert_eq!(archive_name(Path::new("./")), None);
    }
}
