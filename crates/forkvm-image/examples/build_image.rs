//! Builds a template's image: `cargo run -p forkvm-image --example build_image -- templates/tiny.toml AGENT_BIN`.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cache = forkvm_image::kernel::cache_dir();
    match forkvm_image::rootfs::ensure_image(args[1].as_ref(), args[2].as_ref(), &cache) {
        Ok(img) => println!("{}", serde_json::to_string_pretty(&img).unwrap()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1)
        }
    }
}
