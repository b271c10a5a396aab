//! Build (or find in the cache) the forkvm guest kernel and print its path; progress
//! goes to stderr as plain lines. The CLI's `forkvm image kernel` does the same with a
//! progress bar; this example needs no CLI.
//!
//! `cargo run --release -p forkvm-image --example ensure_kernel`

use forkvm_image::kernel::{ensure_kernel, BuildEvent};

fn main() {
    let mut last_percent = u64::MAX;
    let result = ensure_kernel(&mut |e| match e {
        BuildEvent::Compiling { done, estimated_total, elapsed } => {
            let percent = (done * 100 / estimated_total.max(1)).min(99);
            if percent / 10 != last_percent / 10 {
                last_percent = percent;
                eprintln!("compiling: {done} files (~{percent}%), {:.0} s", elapsed.as_secs_f64());
            }
        }
        other => eprintln!("{other:?}"),
    });
    match result {
        Ok(path) => println!("{}", path.display()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
