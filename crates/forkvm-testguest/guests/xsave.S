# xsave: XSAVE state through ring 0. On PVM hosts KVM's emulator cannot run xsave/xrstor
# and the VMM completes them (vstate/emulation/); on hardware KVM the CPU runs them.
# Ring 0: CR4.OSXSAVE, XCR0 = x87|SSE|AVX (xsetbv), xrstor from `area_in` (known xmm0 and
# ymm0 upper-half values), xsave into `area_out`. With args[0] != 0 it then runs an xsave
# into unmapped memory, which must raise #PF at that instruction: "!F 000000000000000e <rip>".
# Ring 3 (native): reads ymm0 and checks it and area_out against area_in; prints
# "xsave ok" or "xsave bad", then exits 0.
        .set    HAVE_RING0_HOOK, 1
        .include "prelude.S"
ring0_hook:
        mov     rax, cr4
        or      eax, 1 << 18
        mov     cr4, rax
        xor     ecx, ecx
        xor     edx, edx
        mov     eax, 7
        xsetbv
        lea     rdi, [rip + area_in]
        mov     eax, 7
        xor     edx, edx
        xrstor64 [rdi]
        lea     rdi, [rip + area_out]
        xsave64 [rdi]
        cmp     qword ptr [ARGS], 0
        je      1f
        mov     rdi, 0x10000000000      # 1 TiB: beyond the identity map
        .globl  faulting_xsave
faulting_xsave:
        xsave64 [rdi]
1:      ret

main:
        lea     rdi, [rip + readback]
        vmovdqu [rdi], ymm0
        lea     rbx, [rip + area_in]
        lea     rdx, [rip + area_out]
        # ymm0 as read natively: low half from XMM0 (offset 160), high half from the AVX
        # component (offset 576); the same in the area xsave wrote.
        lea     rsi, [rbx + 160]
        lea     rdi, [rip + readback]
        mov     ecx, 16
        repe cmpsb
        jne     2f
        lea     rsi, [rbx + 576]
        lea     rdi, [rip + readback + 16]
        mov     ecx, 16
        repe cmpsb
        jne     2f
        lea     rsi, [rbx + 160]
        lea     rdi, [rdx + 160]
        mov     ecx, 16
        repe cmpsb
        jne     2f
        lea     rsi, [rbx + 576]
        lea     rdi, [rdx + 576]
        mov     ecx, 16
        repe cmpsb
        jne     2f
        test    byte ptr [rdx + 512], 4  # XSTATE_BV: AVX state in use
        jz      2f
        lea     rsi, [rip + msg_ok]
        jmp     3f
2:      lea     rsi, [rip + msg_bad]
3:      call    puts
        ret

msg_ok:  .asciz "xsave ok\n"
msg_bad: .asciz "xsave bad\n"

        .balign 64
area_in:
        .word   0x037f                  # FCW
        .fill   22, 1, 0
        .long   0x1f80                  # MXCSR at 24
        .long   0xffff                  # MXCSR_MASK
        .fill   128, 1, 0               # 32..160: x87 registers
        .quad   0x1111222233334444, 0x5555666677778888      # xmm0
        .fill   512 - 176, 1, 0
        .quad   7, 0                    # header: XSTATE_BV = x87|SSE|AVX, XCOMP_BV = 0
        .fill   48, 1, 0
        .quad   0x99990000aaaabbbb, 0xccccddddeeeeffff      # ymm0 upper half (576)
        .fill   832 - 592, 1, 0
        .balign 64
area_out:
        .fill   832, 1, 0
readback:
        .fill   32, 1, 0
