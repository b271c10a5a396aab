# traps: runs `fwait` then `int3` in ring 0, before ever reaching ring 3. On PVM hosts
# KVM's emulator cannot execute either; the VMM completes them (vstate/emulation.rs).
# Expected console: "!F 0000000000000003 <address after the int3>" (the #BP trap).
        .set    HAVE_RING0_HOOK, 1
        .include "prelude.S"
ring0_hook:
        fwait
        .globl  int3_at
int3_at:
        int3
        ret
main:
        ret
