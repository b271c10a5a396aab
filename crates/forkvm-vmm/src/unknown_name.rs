//! The error of parsing a named choice (a CPU template, an irqchip mode, a branch mode)
//! from text: which kind of name, what was given and the names there are.

/// `given` names no `what`; `known` lists the names there are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}; known: {known}")]
pub struct UnknownName {
    pub what: &'static str,
    pub given: String,
    pub known: &'static str,
}

impl UnknownName {
    pub fn new(what: &'static str, given: &str, known: &'static str) -> UnknownName {
        UnknownName { what, given: given.to_string(), known }
    }
}
