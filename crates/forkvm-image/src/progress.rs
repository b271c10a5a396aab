//! [`ProgressView`]: a build's [`BuildEvent`]s shown on stderr, as a bar while the
//! kernel compiles on a terminal, as a line per 10 % otherwise. What the CLI and the
//! benchmarks show while they wait for an image or kernel build.

use crate::kernel::BuildEvent;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// Renders [`BuildEvent`]s on stderr.
#[derive(Debug)]
pub struct ProgressView {
    /// Set when stderr is a terminal and compiling has started.
    bar: Option<ProgressBar>,
    terminal: bool,
    /// Last 10 % step printed in plain mode.
    last_step: u64,
}

impl Default for ProgressView {
    fn default() -> Self {
        Self::new()
    }
}

impl ProgressView {
    pub fn new() -> Self {
        ProgressView { bar: None, terminal: std::io::stderr().is_terminal(), last_step: u64::MAX }
    }

    pub fn show(&mut self, e: &BuildEvent) {
        match e {
            BuildEvent::Cached { .. } => {}
            BuildEvent::Waiting { lock } => self.line(&format!("waiting for another build ({})", lock.display())),
            BuildEvent::Extracting { tarball } => self.line(&format!("extracting {}", tarball.display())),
            BuildEvent::Patching { name, index, count } => self.line(&format!("patch {index}/{count}: {name}")),
            BuildEvent::Configuring => self.line("configuring (tinyconfig + forkvm.config)"),
            BuildEvent::Compiling { done, estimated_total, elapsed } => {
                if self.terminal {
                    let bar = self.bar.get_or_insert_with(|| new_bar(*estimated_total));
                    if *done > bar.length().unwrap_or(0) {
                        bar.set_length(*done);
                    }
                    bar.set_position(*done);
                } else {
                    let step = done * 10 / estimated_total.max(&1);
                    if step != self.last_step {
                        self.last_step = step;
                        eprintln!(
                            "compiling: {done}/~{estimated_total} files, {}",
                            fmt_duration(elapsed.as_secs_f64())
                        );
                    }
                }
            }
            BuildEvent::Linking { elapsed } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                self.line(&format!("linking vmlinux ({} so far)", fmt_duration(elapsed.as_secs_f64())));
            }
            BuildEvent::Done { .. } => {}
        }
    }

    fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

fn new_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template("compiling [{bar:40}] {pos}/~{len} files, {elapsed_precise}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(500));
    bar
}

/// Seconds as a person reads them: `12.3 s`, `8m 12s`.
pub fn fmt_duration(seconds: f64) -> String {
    let s = seconds.round() as u64;
    if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{seconds:.1} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(fmt_duration(12.34), "12.3 s");
        assert_eq!(fmt_duration(492.0), "8m 12s");
    }
}
