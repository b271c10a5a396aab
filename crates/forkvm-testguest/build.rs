//! Assembles the test guests in `guests/` into flat binaries with the system's GNU
//! binutils (`as`, `ld`, `objcopy`), so the guests are built by the project from source.

use std::path::{Path, PathBuf};
use std::process::Command;

const GUESTS: &[&str] =
    &["hello", "count", "echo", "monitor", "traps", "dirty", "xsave", "flood", "smp", "sink", "atomic"];
const IMAGE_BASE: &str = "0x100000";

fn run(step: &str, cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{step}: cannot start {cmd:?}: {e} (install binutils)"));
    assert!(status.success(), "{step} failed: {cmd:?}");
}

fn main() {
    let src = Path::new("guests");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=guests/prelude.S");
    println!("cargo:rerun-if-changed=guests/puthex.S");
    for guest in GUESTS {
        let source = src.join(format!("{guest}.S"));
        println!("cargo:rerun-if-changed={}", source.display());
        let obj = out.join(format!("{guest}.o"));
        let elf = out.join(format!("{guest}.elf"));
        let bin = out.join(format!("{guest}.bin"));
        run("assemble", Command::new("as").args(["--64", "-I"]).arg(src).arg("-o").arg(&obj).arg(&source));
        run(
            "link",
            Command::new("ld")
                .args(["-m", "elf_x86_64", "-e", "_start", &format!("-Ttext={IMAGE_BASE}")])
                .arg("-o")
                .arg(&elf)
                .arg(&obj),
        );
        run("objcopy", Command::new("objcopy").args(["-O", "binary"]).arg(&elf).arg(&bin));
    }
}
