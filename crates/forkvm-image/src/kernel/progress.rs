//! Progress of `make vmlinux`, read from kbuild's short output (`  CC      kernel/fork.o`).
//!
//! kbuild prints one line per command: the command's short name padded to eight columns,
//! then the target. Counting the `CC` lines (C files compiled into the kernel; host tools
//! print `HOSTCC`) against [`ESTIMATED_CC_LINES`] gives a percentage; the first `LD` of
//! `vmlinux.o` (or a `vmlinux` link step) marks linking.

/// Roughly how many `CC` lines a full build of the forkvm configuration prints before
/// linking (789 in all, measured on 6.1.192-3 with `kernel/forkvm.config`). Only used for
/// progress display.
pub const ESTIMATED_CC_LINES: u64 = 790;

/// What one line of make's output means for progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MakeLine {
    /// A C file compiled into the kernel.
    Compile,
    /// The final link has started.
    Link,
    Other,
}

/// Classify one line of `make V=0` output.
pub(crate) fn classify(line: &str) -> MakeLine {
    let mut words = line.split_whitespace();
    match (words.next(), words.next()) {
        (Some("CC"), Some(_)) => MakeLine::Compile,
        (Some("LD"), Some(t)) if is_vmlinux(t) => MakeLine::Link,
        (Some("LINK"), Some(t)) if is_vmlinux(t) => MakeLine::Link,
        _ => MakeLine::Other,
    }
}

fn is_vmlinux(target: &str) -> bool {
    let name = target.rsplit('/').next().unwrap_or(target);
    name == "vmlinux" || name == "vmlinux.o" || name.starts_with(".tmp_vmlinux")
}

/// What a line changed about the build's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Nothing,
    /// One more C file compiled (before linking started).
    Compiled,
    /// Linking started (reported once; `CC` lines after it, such as the version object
    /// rebuilt during the link, are not counted as progress).
    LinkStarted,
}

/// Counts make's output lines.
#[derive(Debug, Default)]
pub(crate) struct Counter {
    pub compiled: u64,
    pub linking: bool,
}

impl Counter {
    pub fn feed(&mut self, line: &str) -> Change {
        match classify(line) {
            MakeLine::Compile => {
                self.compiled += 1;
                if self.linking {
                    Change::Nothing
                } else {
                    Change::Compiled
                }
            }
            MakeLine::Link if !self.linking => {
                self.linking = true;
                Change::LinkStarted
            }
            _ => Change::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_kbuild_lines() {
        assert_eq!(classify("  CC      kernel/fork.o"), MakeLine::Compile);
        assert_eq!(classify("  CC      arch/x86/mm/fault.o"), MakeLine::Compile);
        assert_eq!(classify("  HOSTCC  scripts/kconfig/conf.o"), MakeLine::Other);
        assert_eq!(classify("  AS      arch/x86/entry/entry_64.o"), MakeLine::Other);
        assert_eq!(classify("  AR      kernel/built-in.a"), MakeLine::Other);
        assert_eq!(classify("  LD      vmlinux.o"), MakeLine::Link);
        assert_eq!(classify("  LD      .tmp_vmlinux.kallsyms1"), MakeLine::Link);
        assert_eq!(classify("  LD      arch/x86/boot/setup.elf"), MakeLine::Other);
        assert_eq!(classify("make[1]: Entering directory '/x'"), MakeLine::Other);
        assert_eq!(classify("CC"), MakeLine::Other);
        assert_eq!(classify(""), MakeLine::Other);
    }

    #[test]
    fn counter_counts_compiles_and_reports_linking_once() {
        let mut c = Counter::default();
        let lines = [
            "  CC      a.o",
            "  HOSTCC  b.o",
            "  CC      c.o",
            "  LD      vmlinux.o",
            "  CC      init/version.o",
            "  LD      vmlinux",
        ];
        let changes: Vec<Change> = lines.iter().map(|l| c.feed(l)).collect();
        use Change::*;
        assert_eq!(changes, [Compiled, Nothing, Compiled, LinkStarted, Nothing, Nothing]);
        assert_eq!(c.compiled, 3);
        assert!(c.linking);
    }
}
