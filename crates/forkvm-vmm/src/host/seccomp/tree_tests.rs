//! The tree layout must decide every call exactly as seccompiler's one chain does. A
//! small interpreter of the instructions seccompiler emits runs both programs on every
//! call number and, for the calls with rules, on arguments made from every constant the
//! rules compare with.

use super::super::{rules, ThreadKind};
use super::*;
use seccompiler::SeccompAction;

const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

/// `struct seccomp_data`, as the kernel lays it out for the filter to load from.
#[derive(Clone, Copy)]
struct Data {
    nr: u32,
    arch: u32,
    args: [u64; 6],
}

impl Data {
    fn word(&self, offset: u32) -> u32 {
        let mut bytes = [0u8; 64];
        bytes[0..4].copy_from_slice(&self.nr.to_ne_bytes());
        bytes[4..8].copy_from_slice(&self.arch.to_ne_bytes());
        for (i, a) in self.args.iter().enumerate() {
            bytes[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let o = offset as usize;
        u32::from_ne_bytes(bytes[o..o + 4].try_into().unwrap())
    }
}

/// Runs `program` on `data`; returns its verdict and how many instructions it took.
fn run(program: &[sock_filter], data: &Data) -> (u32, usize) {
    let (mut pc, mut a, mut steps) = (0usize, 0u32, 0usize);
    loop {
        let i = &program[pc];
        steps += 1;
        pc += 1;
        match i.code {
            0x20 => a = data.word(i.k), // ld [k]
            0x54 => a &= i.k,           // and #k
            0x05 => pc += i.k as usize, // ja
            0x15 | 0x35 | 0x25 | 0x45 => {
                let taken = match i.code {
                    0x15 => a == i.k,  // jeq
                    0x35 => a >= i.k,  // jge
                    0x25 => a > i.k,   // jgt
                    _ => a & i.k != 0, // jset
                };
                pc += if taken { i.jt } else { i.jf } as usize;
            }
            0x06 => return (i.k, steps), // ret #k
            code => panic!("instruction {code:#x} the interpreter does not know"),
        }
    }
}

/// `kind`'s program in both layouts; the chain layout as the list of programs stacked.
fn chain_and_tree(kind: ThreadKind) -> (Vec<BpfProgram>, BpfProgram) {
    let chain = match kind {
        ThreadKind::Control => crate::host::seccomp::process_programs(crate::host::seccomp::Layout::Chain).unwrap(),
        _ => vec![crate::host::seccomp::program(kind, crate::host::seccomp::Layout::Chain).unwrap()],
    };
    let tree = compile(rules::allowed(kind), SeccompAction::Trap, SeccompAction::Allow, TargetArch::x86_64).unwrap();
    (chain, tree)
}

/// The verdict of stacked filters: the kernel takes the most restrictive action, which
/// is the lowest action value read as signed.
fn run_stack(programs: &[BpfProgram], data: &Data) -> u32 {
    programs.iter().map(|p| run(p, data).0).min_by_key(|&v| (v & 0xffff_0000) as i32).unwrap()
}

/// Every argument vector worth trying: all zeros, and each argument in turn set to each
/// constant the program compares with (and to it with high bits set).
fn argument_vectors(program: &[sock_filter]) -> Vec<[u64; 6]> {
    let mut values: Vec<u64> = program.iter().map(|i| u64::from(i.k)).collect();
    values.extend([0, 1, u64::from(u32::MAX)]);
    values.sort_unstable();
    values.dedup();
    let mut out = vec![[0u64; 6]];
    for arg in 0..6 {
        for &v in &values {
            for high in [0u64, 1 << 32] {
                let mut args = [0u64; 6];
                args[arg] = v | high;
                out.push(args);
            }
        }
    }
    out
}

fn numbers() -> Vec<u32> {
    let mut n: Vec<u32> = (0..=600).collect();
    n.extend([0x4000_0000, 0x4000_0001, 0x4000_0200, u32::MAX - 1, u32::MAX]);
    n
}

#[test]
fn the_tree_decides_every_call_as_the_chain_does() {
    for kind in ThreadKind::ALL {
        let (chain, tree) = chain_and_tree(kind);
        let with_rules: Vec<u32> = rules::allowed(kind)
            .into_iter()
            .filter(|(_, call)| *call != rules::Call::Always)
            .map(|(nr, _)| nr as u32)
            .collect();
        let vectors = argument_vectors(&chain.concat());
        for nr in numbers() {
            let tries: &[[u64; 6]] = if with_rules.contains(&nr) { &vectors } else { &vectors[..1] };
            for &args in tries {
                let data = Data { nr, arch: AUDIT_ARCH_X86_64, args };
                assert_eq!(
                    run_stack(&chain, &data),
                    run(&tree, &data).0,
                    "{} filter, call {nr}, args {args:x?}",
                    kind.name()
                );
            }
        }
        // Another architecture is killed by both.
        let foreign = Data { nr: 0, arch: 0x4000_0003, args: [0; 6] };
        assert_eq!(run_stack(&chain, &foreign), run(&tree, &foreign).0);
    }
}

#[test]
fn clone3_fails_with_enosys_in_the_control_filter_only() {
    let clone3 = Data { nr: libc::SYS_clone3 as u32, arch: AUDIT_ARCH_X86_64, args: [0; 6] };
    let (_, control) = chain_and_tree(ThreadKind::Control);
    assert_eq!(run(&control, &clone3).0, u32::from(SeccompAction::Errno(libc::ENOSYS as u32)));
    let (_, vcpu) = chain_and_tree(ThreadKind::Vcpu);
    assert_eq!(run(&vcpu, &clone3).0, u32::from(SeccompAction::Trap));
}

#[test]
fn a_call_walks_a_short_path_through_the_tree() {
    let (chain, tree) = chain_and_tree(ThreadKind::Control);
    let chain = chain.last().unwrap().clone();
    let longest = |p: &[sock_filter]| {
        numbers().into_iter().map(|nr| run(p, &Data { nr, arch: AUDIT_ARCH_X86_64, args: [0; 6] }).1).max().unwrap()
    };
    let (chain_max, tree_max) = (longest(&chain), longest(&tree));
    // The ioctl bucket compares the request with each allowed one; everything else is a
    // handful of comparisons deep.
    let ioctl = Data { nr: libc::SYS_ioctl as u32, arch: AUDIT_ARCH_X86_64, args: [0; 6] };
    let ioctl_steps = run(&tree, &ioctl).1;
    let others = numbers()
        .into_iter()
        .filter(|&nr| nr != libc::SYS_ioctl as u32)
        .map(|nr| run(&tree, &Data { nr, arch: AUDIT_ARCH_X86_64, args: [0; 6] }).1)
        .max()
        .unwrap();
    assert!(others <= 24, "a call other than ioctl took {others} instructions in the tree");
    // `KVM_RUN`, made on every VM exit, is the first request compared.
    let kvm_run = Data { args: [0, u64::from(0xae80u32), 0, 0, 0, 0], ..ioctl };
    let (verdict, kvm_run_steps) = run(&tree, &kvm_run);
    assert_eq!(verdict, u32::from(SeccompAction::Allow));
    assert!(kvm_run_steps <= 16, "KVM_RUN took {kvm_run_steps} instructions");
    assert!(tree_max <= ioctl_steps, "ioctl should be the longest path: {tree_max} > {ioctl_steps}");
    assert!(chain_max > 5 * others, "the chain's longest path {chain_max} vs the tree's {others}");
}

#[test]
fn empty_rules_compile_to_the_mismatch_action() {
    let p = compile(BTreeMap::new(), SeccompAction::Trap, SeccompAction::Allow, TargetArch::x86_64).unwrap();
    let data = Data { nr: 0, arch: AUDIT_ARCH_X86_64, args: [0; 6] };
    assert_eq!(run(&p, &data).0, u32::from(SeccompAction::Trap));
}
