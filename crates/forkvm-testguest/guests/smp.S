# smp: every vCPU works at once, in ring 3 with interrupts on, for the VMM's
# multi-vCPU tests (pause, snapshot, fork and branch with several vCPUs in flight).
#   ARGS[0]  number of vCPUs, 1..MAX_CPUS
#   ARGS[1]  LAPIC timer initial count: its period in ns on KVM's 1 GHz APIC bus
#            (0: no timer)
# vCPU i arms its LAPIC timer (periodic, vector TIMER_VECTOR+i; prelude counts TICKS[i])
# and then forever adds BATCH to COUNTERS[i], one at a time. After each batch:
#   - vCPU i >= 1 sends an IPI to vCPU t = (i+1) mod n (vector IPI_VECTOR+t) and waits
#     until IPIS[t] moved: an IPI lost by a snapshot or a fork stops COUNTERS[i];
#   - vCPU 0 polls COM1: 'p' prints "smp" and, per vCPU, " <counter> <ticks> <ipis>"
#     in hex, then a newline; 'x' exits 0.
# vCPU 0 prints "smp ready" once every vCPU checked in at READY[i], with its LAPIC on,
# and only then lets the APs send IPIs (GO): a LAPIC that is not on yet drops them.
        .set    HAVE_AP_MAIN, 1
        .include "prelude.S"
        .equ COUNTERS, 0x6000           # u64 per vCPU
        .equ READY,    0x60c0           # u64 per vCPU
        .equ GO,       0x6100           # u64
        .equ BATCH,    1000000
        .equ ICR_LOW,  LAPIC + 0x300
        .equ ICR_HIGH, LAPIC + 0x310

main:
        xor     edi, edi
        call    arm_timer
        # Wait for every AP; they need no more than a few ring-0 instructions each.
        mov     r8, [ARGS]
        mov     ecx, 1
1:      cmp     rcx, r8
        jae     3f
2:      pause
        cmp     qword ptr [READY + 8 * rcx], 0
        je      2b
        inc     ecx
        jmp     1b
3:      mov     qword ptr [GO], 1
        lea     rsi, [rip + ready_msg]
        call    puts
        sti
bsp_loop:
        mov     ecx, BATCH
1:      inc     qword ptr [COUNTERS]
        dec     ecx
        jnz     1b
        mov     dx, COM1 + 5
        in      al, dx
        test    al, 1
        jz      bsp_loop
        mov     dx, COM1
        in      al, dx
        cmp     al, 'p'
        je      report
        cmp     al, 'x'
        jne     bsp_loop
        xor     edi, edi
        call    exit

report:
        lea     rsi, [rip + smp_msg]
        call    puts
        mov     r8, [ARGS]
        xor     ecx, ecx
1:      cmp     rcx, r8
        jae     2f
        mov     al, ' '
        call    putc
        mov     rax, [COUNTERS + 8 * rcx]
        call    puthex
        mov     al, ' '
        call    putc
        mov     rax, [TICKS + 8 * rcx]
        call    puthex
        mov     al, ' '
        call    putc
        mov     rax, [IPIS + 8 * rcx]
        call    puthex
        inc     ecx
        jmp     1b
2:      mov     al, '\n'
        call    putc
        jmp     bsp_loop

# rdi = this vCPU's index (kept in r12).
ap_main:
        mov     r12, rdi
        call    arm_timer
        mov     qword ptr [READY + 8 * r12], 1
        # The target t = (i+1) mod n, its vector and its APIC id (= its index).
        mov     r13, r12
        inc     r13
        cmp     r13, [ARGS]
        jb      1f
        xor     r13d, r13d
1:      mov     r14d, r13d
        shl     r14d, 24                # ICR high: destination APIC id
        lea     r15d, [r13d + IPI_VECTOR + 0x4000]   # ICR low: fixed, assert
2:      pause
        cmp     qword ptr [GO], 0
        je      2b
        sti
ap_loop:
        mov     ecx, BATCH
1:      inc     qword ptr [COUNTERS + 8 * r12]
        dec     ecx
        jnz     1b
        mov     rbx, [IPIS + 8 * r13]
        mov     rax, ICR_HIGH
        mov     dword ptr [rax], r14d
        mov     rax, ICR_LOW
        mov     dword ptr [rax], r15d
2:      pause
        cmp     rbx, [IPIS + 8 * r13]
        je      2b
        jmp     ap_loop

# Arms this vCPU's LAPIC timer: periodic, vector TIMER_VECTOR + rdi, divide by 1,
# initial count ARGS[1] (nothing when it is 0).
arm_timer:
        mov     rax, [ARGS + 8]
        test    rax, rax
        jz      1f
        mov     rbx, LAPIC
        mov     dword ptr [rbx + 0x3e0], 0xb
        lea     edx, [edi + TIMER_VECTOR + 0x20000]
        mov     dword ptr [rbx + 0x320], edx
        mov     dword ptr [rbx + 0x380], eax
1:      ret

ready_msg: .asciz "smp ready\n"
smp_msg:   .asciz "smp"
