//! Dockerfiles on arbitrary text: what `forkvm template build` reads before any step
//! runs. The input (at most 64 KiB, UTF-8 only) is parsed; when it parses, it is
//! planned against an empty build context in the process's scratch directory with the
//! variable `X` set by `--build-arg`. Neither may panic; a plan never selects a COPY
//! source (the context is empty: a COPY fails by name or copies nothing); a stage starts
//! from and copies from earlier stages only, and the stages needed are in order and end
//! with the last; every error names a line inside the file or none; and the words lexer,
//! fed each line, never panics.

#![no_main]

use forkvm_image::dockerfile::{self, words, IgnoreRules};
use libfuzzer_sys::fuzz_target;

const MAX_INPUT: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    let lines = text.lines().count().max(1);
    let vars = |n: &str| (n == "X").then(|| "x y".to_string());
    for line in text.lines().take(64) {
        let _ = words::words(line, &vars);
        let _ = words::pairs(line, &vars, true);
    }
    let parsed = match dockerfile::parse(text) {
        Ok(p) => p,
        Err(e) => {
            assert!(e.line.is_none_or(|l| l >= 1 && l <= lines + 1), "line {:?} of {lines}: {e}", e.line);
            return;
        }
    };
    let context = forkvm_fuzz::fresh_dir("dockerfile");
    let args = [("X".to_string(), "1".to_string())].into_iter().collect();
    match dockerfile::plan(&parsed, &args, &dockerfile::Context::Dir(context), &IgnoreRules::default()) {
        Ok(plan) => {
            for (i, stage) in plan.stages.iter().enumerate() {
                if let dockerfile::StageBase::Stage(b) = stage.base {
                    assert!(b < i, "stage {i} starts from stage {b}, not an earlier one");
                }
                for s in &stage.steps {
                    match &s.action {
                        dockerfile::Action::Run { .. } => {}
                        dockerfile::Action::Copy { set, .. } => assert!(
                            set.entries.is_empty() && set.archives.is_empty(),
                            "a COPY found a source in an empty context"
                        ),
                        dockerfile::Action::CopyFrom { stage: from, .. } => {
                            assert!(*from < i, "stage {i} copies from stage {from}, not an earlier one")
                        }
                    }
                }
            }
            let last = plan.stages.len() - 1;
            assert!(plan.needed.windows(2).all(|w| w[0] < w[1]), "needed out of order: {:?}", plan.needed);
            assert_eq!(plan.needed.last(), Some(&last), "the last stage is needed");
        }
        Err(e) => assert!(e.line.is_none_or(|l| l >= 1 && l <= lines + 1), "line {:?} of {lines}: {e}", e.line),
    }
});
