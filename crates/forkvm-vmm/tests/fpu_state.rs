//! A vCPU's x87/SSE state lives in its XSAVE area: a saved vCPU reads it from there
//! (`vstate::vcpu_state::FpuState`), not with `KVM_GET_FPU`, and a restore sets it with
//! `KVM_SET_XSAVE` alone. (On this host's kernel what `KVM_SET_FPU` writes does not even
//! reach the guest: it leaves the area's XSTATE_BV alone, so `KVM_GET_XSAVE`, like the
//! guest's XRSTOR, still shows the components' initial state.)

use forkvm_vmm::vstate::vcpu_state::VcpuState;
use kvm_bindings::kvm_xsave;
use kvm_ioctls::{Kvm, VcpuFd};

fn bytes_of(xsave: &kvm_xsave) -> Vec<u8> {
    xsave.region.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn set_bytes(xsave: &mut kvm_xsave, bytes: &[u8]) {
    for (word, chunk) in xsave.region.iter_mut().zip(bytes.chunks_exact(4)) {
        *word = u32::from_le_bytes(chunk.try_into().unwrap());
    }
}

fn vcpu(vm: &kvm_ioctls::VmFd, kvm: &Kvm, id: u64) -> VcpuFd {
    let cpuid = kvm.get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES).unwrap();
    let vcpu = vm.create_vcpu(id).unwrap();
    vcpu.set_cpuid2(&cpuid).unwrap();
    vcpu
}

#[test]
fn the_saved_x87_and_sse_state_comes_from_the_xsave_area_and_comes_back_without_kvm_set_fpu() {
    let kvm = Kvm::new().expect("/dev/kvm (this test needs KVM)");
    let vm = kvm.create_vm().unwrap();
    vm.create_irq_chip().unwrap();
    let cpuid = kvm.get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES).unwrap();
    let first = vcpu(&vm, &kvm, 0);

    // The guest's state as the XSAVE area carries it: x87 and SSE marked present.
    let mut xsave = first.get_xsave().unwrap();
    let mut area = bytes_of(&xsave);
    area[0..2].copy_from_slice(&0x27fu16.to_le_bytes()); // FCW
    area[2..4].copy_from_slice(&0x3800u16.to_le_bytes()); // FSW
    area[4] = 0x81; // abridged tag word
    area[6..8].copy_from_slice(&0x5d9u16.to_le_bytes()); // FOP
    area[8..16].copy_from_slice(&0x1234_5678_9abcu64.to_le_bytes()); // FIP
    area[16..24].copy_from_slice(&0x0fed_cba9_8765u64.to_le_bytes()); // FDP
    area[24..28].copy_from_slice(&0x1fa0u32.to_le_bytes()); // MXCSR
    for i in 0..8 {
        area[32 + 16 * i..32 + 16 * i + 10].fill(i as u8 + 1);
    }
    for i in 0..16 {
        area[160 + 16 * i..176 + 16 * i].fill(0xa0 | i as u8);
    }
    area[512] |= 0b11; // XSTATE_BV: x87, SSE
    set_bytes(&mut xsave, &area);
    // SAFETY: the legacy 4 KiB layout KVM_GET_XSAVE returned, no extra area.
    unsafe { first.set_xsave(&xsave) }.unwrap();

    let saved = VcpuState::save(&first, cpuid.as_slice(), &[]).unwrap();
    let f = &saved.fpu;
    assert_eq!((f.fcw, f.fsw, f.ftwx, f.last_opcode), (0x27f, 0x3800, 0x81, 0x5d9));
    assert_eq!((f.last_ip, f.last_dp, f.mxcsr), (0x1234_5678_9abc, 0x0fed_cba9_8765, 0x1fa0));
    assert_eq!((f.fpr[2][..10].to_vec(), f.fpr[2][10]), (vec![3; 10], 0));
    assert_eq!((f.xmm[0], f.xmm[15]), ([0xa0; 16], [0xaf; 16]));

    // A new vCPU gets all of it from KVM_SET_XSAVE.
    let second = vcpu(&vm, &kvm, 1);
    saved.restore(&second).unwrap();
    let back = bytes_of(&second.get_xsave().unwrap());
    assert_eq!(&back[..512], &area[..512], "x87/SSE state after the restore");
    assert_eq!(back[512] & 0b11, 0b11);
}
