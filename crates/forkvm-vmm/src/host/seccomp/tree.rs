//! Lays a filter out as a binary search on the system call number, with one short
//! instruction per allowed call, so that installing it and running it stay cheap.
//!
//! seccompiler compiles a filter into one chain: a call's number is compared with every
//! allowed call's in turn, five instructions per call. The kernel pays for that twice. At
//! install it runs the program once per system call number to learn which calls it may
//! allow without running it (the action cache), about 0.45 µs per instruction of chain
//! here: 400 µs for the control filter, in every VMM, before it runs guest code. Then
//! each call the cache cannot answer (every `ioctl`, `KVM_RUN` on each VM exit) walks the
//! chain up to its number. The kernel also translates and JIT-compiles every instruction
//! at install (about 0.1 µs each), so the program's length counts too.
//!
//! The layout ([`compile`]):
//! - the architecture check (seccompiler's, taken from the program it makes for no
//!   calls), then the call's number is loaded once;
//! - a binary tree of `number >= k` comparisons picks a leaf, whose `ja` (32-bit
//!   offset: classic BPF jumps are relative and forward only) reaches the leaf's code;
//! - a leaf of calls allowed with any arguments is one `jeq` per call jumping to a
//!   shared "allow", then "deny";
//! - a call allowed when one 32-bit argument is in a set (`ioctl` requests, the socket
//!   family, a signal) loads that argument once and compares it with each value, in the
//!   order given (`KVM_RUN` first);
//! - a call that fails with an errno (`clone3`) is a leaf of its own returning it;
//! - any other rule is compiled by seccompiler as a filter of that one call, placed as
//!   is (less its architecture check, which already passed).
//!
//! Tests run the result against seccompiler's own chain of the same rules (with the
//! errno calls in a filter of their own, stacked) on every call number and on each
//! argument the rules compare with.

use super::rules::{Call, Rules};
use seccompiler::{sock_filter, BpfProgram, SeccompAction, SeccompFilter, TargetArch};
use std::collections::BTreeMap;

/// Calls allowed with any arguments per leaf: a call walks up to this many comparisons
/// in its leaf; fewer per leaf means more leaves (2 instructions each in the tree).
const CALLS_PER_LEAF: usize = 6;

const LD_W_ABS: u16 = 0x20;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JGE_K: u16 = 0x35;
const RET_K: u16 = 0x06;
/// Where `seccomp_data.nr` lies; argument `i`'s low word is at `16 + 8 i` (little-endian).
const NR_OFFSET: u32 = 0;
const ARGS_OFFSET: u32 = 16;
/// The kernel's limit on a filter's length (`BPF_MAXINSNS`).
const MAX_INSNS: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("seccompiler: {0}")]
    Compile(#[from] seccompiler::BackendError),
    #[error("seccompiler's program for call {0} did not start with its architecture check")]
    UnexpectedPrologue(i64),
    #[error("call {0} is allowed with {1} argument values, more than one jump can skip")]
    TooManyValues(i64, usize),
    #[error("call {0} has argument {1}; calls have 6")]
    NoSuchArgument(i64, u8),
    #[error("the call-number tree needs a jump of {0} instructions, more than a conditional jump holds")]
    TreeTooDeep(usize),
    #[error("the laid-out filter has {0} instructions, more than the kernel takes")]
    TooLong(usize),
}

/// Compiles `rules` with the actions [`SeccompFilter::new`] takes, laid out as a tree
/// (module doc).
pub(super) fn compile(
    rules: Rules,
    mismatch: SeccompAction,
    matched: SeccompAction,
    arch: TargetArch,
) -> Result<BpfProgram, TreeError> {
    // The program for no calls is the architecture check and the mismatch return.
    let empty: BpfProgram = SeccompFilter::new(BTreeMap::new(), mismatch.clone(), matched.clone(), arch)?.try_into()?;
    if rules.is_empty() {
        return Ok(empty);
    }
    let prologue = &empty[..empty.len() - 1];
    let (deny, allow) = (u32::from(mismatch.clone()), u32::from(matched.clone()));

    let mut firsts = Vec::new();
    let mut leaves: Vec<BpfProgram> = Vec::new();
    for leaf in leaves_of(rules) {
        firsts.push(u32::try_from(leaf.first()).expect("call numbers are small"));
        leaves.push(match leaf {
            Leaf::Plain(calls) => plain_leaf(&calls, deny, allow),
            Leaf::Errno(nr, errno) => {
                let fail = u32::from(SeccompAction::Errno(errno));
                arg_in_leaf(nr, None, &[], deny, fail)?
            }
            Leaf::ArgIn { nr, arg, values } => arg_in_leaf(nr, Some(arg), &values, deny, allow)?,
            Leaf::Rules(nr, rules) => {
                let one = BTreeMap::from([(nr, rules)]);
                let program: BpfProgram =
                    SeccompFilter::new(one, mismatch.clone(), matched.clone(), arch)?.try_into()?;
                program.strip_prefix(prologue).ok_or(TreeError::UnexpectedPrologue(nr))?.to_vec()
            }
        });
    }

    let mut out: BpfProgram = prologue.to_vec();
    out.push(stmt(LD_W_ABS, NR_OFFSET));
    // The tree: an inner node per leaf but the first, a `ja` per leaf.
    let tree_end = out.len() + 2 * leaves.len() - 1;
    let mut starts = Vec::with_capacity(leaves.len());
    let mut at = tree_end;
    for l in &leaves {
        starts.push(at);
        at += l.len();
    }
    if at > MAX_INSNS {
        return Err(TreeError::TooLong(at));
    }
    emit_tree(&mut out, &firsts, &starts, 0, leaves.len())?;
    debug_assert_eq!(out.len(), tree_end);
    for l in leaves {
        out.extend(l);
    }
    Ok(out)
}

/// What one leaf of the tree decides.
enum Leaf {
    /// Calls allowed with any arguments.
    Plain(Vec<u32>),
    ArgIn {
        nr: i64,
        arg: u8,
        values: Vec<u32>,
    },
    Rules(i64, Vec<seccompiler::SeccompRule>),
    Errno(i64, u32),
}

impl Leaf {
    fn first(&self) -> i64 {
        match self {
            Leaf::Plain(calls) => i64::from(calls[0]),
            Leaf::ArgIn { nr, .. } | Leaf::Rules(nr, _) | Leaf::Errno(nr, _) => *nr,
        }
    }
}

/// Cuts `rules`, in call-number order, into leaves: runs of up to [`CALLS_PER_LEAF`]
/// calls allowed with any arguments, and each call with conditions alone.
fn leaves_of(rules: Rules) -> Vec<Leaf> {
    let mut out = Vec::new();
    let mut plain: Vec<u32> = Vec::new();
    for (nr, call) in rules {
        let leaf = match call {
            Call::Always => {
                plain.push(u32::try_from(nr).expect("call numbers are small"));
                if plain.len() == CALLS_PER_LEAF {
                    out.push(Leaf::Plain(std::mem::take(&mut plain)));
                }
                continue;
            }
            Call::ArgIn { arg, values } => Leaf::ArgIn { nr, arg, values },
            Call::Rules(rules) => Leaf::Rules(nr, rules),
            Call::Errno(errno) => Leaf::Errno(nr, errno),
        };
        if !plain.is_empty() {
            out.push(Leaf::Plain(std::mem::take(&mut plain)));
        }
        out.push(leaf);
    }
    if !plain.is_empty() {
        out.push(Leaf::Plain(plain));
    }
    out
}

/// `jeq` per call to the shared "allow" at the end; "deny" when none matched.
fn plain_leaf(calls: &[u32], deny: u32, allow: u32) -> BpfProgram {
    let n = calls.len();
    let mut out: BpfProgram = calls.iter().enumerate().map(|(i, &nr)| jump(JMP_JEQ_K, nr, (n - i) as u8, 0)).collect();
    out.push(stmt(RET_K, deny));
    out.push(stmt(RET_K, allow));
    out
}

/// Call `nr` with argument `arg`'s low word in `values`: check the number (a leaf is
/// reached by any number in its range), load the argument, compare with each value;
/// `allow` when one matched. Without an argument, call `nr` gets `allow` whatever its
/// arguments (an errno leaf passes its errno as `allow`).
fn arg_in_leaf(nr: i64, arg: Option<u8>, values: &[u32], deny: u32, allow: u32) -> Result<BpfProgram, TreeError> {
    let n = values.len();
    let nr32 = u32::try_from(nr).expect("call numbers are small");
    let Some(arg) = arg else {
        return Ok(vec![jump(JMP_JEQ_K, nr32, 1, 0), stmt(RET_K, deny), stmt(RET_K, allow)]);
    };
    if arg >= 6 {
        return Err(TreeError::NoSuchArgument(nr, arg));
    }
    let skip = u8::try_from(n + 1).map_err(|_| TreeError::TooManyValues(nr, n))?;
    let mut out = vec![jump(JMP_JEQ_K, nr32, 0, skip), stmt(LD_W_ABS, ARGS_OFFSET + 8 * u32::from(arg))];
    out.extend(values.iter().enumerate().map(|(i, &v)| jump(JMP_JEQ_K, v, (n - i) as u8, 0)));
    out.push(stmt(RET_K, deny));
    out.push(stmt(RET_K, allow));
    Ok(out)
}

/// Emits the subtree choosing among leaves `lo..hi`: its left half right after the
/// comparison (the "false" branch is the next instruction), then its right half.
fn emit_tree(out: &mut BpfProgram, firsts: &[u32], starts: &[usize], lo: usize, hi: usize) -> Result<(), TreeError> {
    if hi - lo == 1 {
        let next = out.len() + 1;
        out.push(stmt(JMP_JA, (starts[lo] - next) as u32));
        return Ok(());
    }
    let mid = (lo + hi) / 2;
    // The left subtree has 2·(mid−lo)−1 instructions; "true" skips it.
    let skip = 2 * (mid - lo) - 1;
    let jt = u8::try_from(skip).map_err(|_| TreeError::TreeTooDeep(skip))?;
    out.push(jump(JMP_JGE_K, firsts[mid], jt, 0));
    emit_tree(out, firsts, starts, lo, mid)?;
    emit_tree(out, firsts, starts, mid, hi)
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

#[cfg(test)]
#[path = "tree_tests.rs"]
mod tests;
