//! Architecture support. forkvm runs x86-64 guests only.

pub mod x86_64;
