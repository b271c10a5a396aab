//! Dockerfiles: read ([`parse`]), evaluated with the build's arguments and context into
//! the steps a build runs ([`plan`]), and what those steps take from the context
//! ([`context`], [`ignore`]). Running the steps, each inside a sandbox, is
//! `forkvm_sandbox::build`'s job; nothing here runs anything.

pub mod context;
pub mod ignore;
pub mod parse;
pub mod plan;
pub mod tar_context;
pub mod tar_mode;
pub mod words;

pub use context::Context;
pub use ignore::IgnoreRules;
pub use parse::{parse, CommandForm, DockerfileError};
pub use plan::{plan, Action, FinalConfig, Plan, Stage, StageBase, Step};

/// The ignore file of a context, if it has one.
pub const IGNORE_FILE: &str = ".dockerignore";

/// The most a Dockerfile or `.dockerignore` may be.
pub const MAX_TEXT: u64 = 1 << 20;

/// Reads the context's `.dockerignore` (none: nothing is left out).
pub fn read_ignore(context: &Context) -> Result<IgnoreRules, DockerfileError> {
    let error = |message| DockerfileError { line: None, message };
    match context.read_small(IGNORE_FILE, MAX_TEXT).map_err(error)? {
        Some(text) => IgnoreRules::parse(&text).map_err(error),
        None => Ok(IgnoreRules::default()),
    }
}
