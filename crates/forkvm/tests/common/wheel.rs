//! A pure-Python wheel (PEP 427) made in memory, and the PEP 503 "simple" index page
//! that offers it: what a test's fake package index serves to `pip install`.
#![allow(dead_code)] // each test binary uses its own part of it

use base64::Engine;
use sha2::{Digest, Sha256};
use std::io::Write;

/// A wheel: its file name and bytes.
pub struct Wheel {
    pub file_name: String,
    pub bytes: Vec<u8>,
}

/// A wheel of distribution `name` (`fvm-hello`) at `version`, holding one module
/// (`name` with `_` for `-`) whose `__init__.py` is `source`.
pub fn wheel(name: &str, version: &str, source: &str) -> Wheel {
    let module = name.replace('-', "_");
    let info = format!("{module}-{version}.dist-info");
    let files: Vec<(String, String)> = vec![
        (format!("{module}/__init__.py"), source.to_string()),
        (format!("{info}/METADATA"), format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")),
        (
            format!("{info}/WHEEL"),
            "Wheel-Version: 1.0\nGenerator: forkvm-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n".to_string(),
        ),
    ];
    let mut record = String::new();
    for (path, body) in &files {
        let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(body.as_bytes()));
        record.push_str(&format!("{path},sha256={digest},{}\n", body.len()));
    }
    record.push_str(&format!("{info}/RECORD,,\n"));

    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (path, body) in files.iter().chain(std::iter::once(&(format!("{info}/RECORD"), record))) {
        zip.start_file(path.as_str(), options).unwrap();
        zip.write_all(body.as_bytes()).unwrap();
    }
    let bytes = zip.finish().unwrap().into_inner();
    Wheel { file_name: format!("{module}-{version}-py3-none-any.whl"), bytes }
}

/// The simple index page of `name` offering `wheel` at `href`, with its sha256 (which
/// pip checks).
pub fn index_page(name: &str, wheel: &Wheel, href: &str) -> String {
    let digest: String = Sha256::digest(&wheel.bytes).iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "<!DOCTYPE html>\n<html><head><title>Links for {name}</title></head><body>\n\
         <a href=\"{href}#sha256={digest}\">{}</a>\n</body></html>\n",
        wheel.file_name
    )
}
