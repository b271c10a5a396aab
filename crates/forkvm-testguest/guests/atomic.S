# atomic: are locked read-modify-write instructions atomic across vCPUs when they run in
# ring 0? On PVM hosts ring-0 code runs in KVM's instruction emulator, and a Linux SMP
# guest depends on `lock inc`, `lock bts`/`btr` on words another vCPU changes at once.
#   ARGS[0]  number of vCPUs, 1..8
#   ARGS[1]  rounds per vCPU
# Every vCPU runs, in ring 0 with interrupts off, ARGS[1] rounds of:
#   lock inc SUM; lock bts FLAGS, i; bt FLAGS, i (must be set); lock btr FLAGS, i;
#   bt FLAGS, i (must be clear)
# counting in LOST[i] each time its own bit was not as it just left it (another vCPU's
# RMW of the same word wrote back a stale copy). vCPU 0 waits for all, then prints
# "atomic <sum> <lost0> <lost1> ..." in hex and exits 0. A correct host prints
# sum = vCPUs x rounds and no lost bit.
        .intel_syntax noprefix
        .equ ARGS,      0x7000
        .equ SUM,       0x6000
        .equ FLAGS,     0x6008
        .equ DONE,      0x6010
        .equ LOST,      0x6040          # u64 per vCPU
        .equ COM1,      0x3f8
        .equ EXIT_PORT, 0x501

        .section .text
        .globl _start
_start:
        cli
        mov     rcx, [ARGS + 8]
1:      lock inc qword ptr [SUM]
        lock bts qword ptr [FLAGS], rdi
        bt      qword ptr [FLAGS], rdi
        jc      2f
        inc     qword ptr [LOST + 8 * rdi]
2:      lock btr qword ptr [FLAGS], rdi
        bt      qword ptr [FLAGS], rdi
        jnc     3f
        inc     qword ptr [LOST + 8 * rdi]
3:      dec     rcx
        jnz     1b
        lock inc qword ptr [DONE]
        test    edi, edi
        jz      report
4:      pause
        jmp     4b

report:
        mov     rax, [ARGS]
1:      pause
        cmp     [DONE], rax
        jne     1b
        lea     rsi, [rip + msg]
2:      lodsb
        test    al, al
        jz      3f
        call    putc
        jmp     2b
3:      mov     al, ' '
        call    putc
        mov     rax, [SUM]
        call    puthex
        xor     ebx, ebx
4:      cmp     rbx, [ARGS]
        jae     5f
        mov     al, ' '
        call    putc
        mov     rax, [LOST + 8 * rbx]
        call    puthex
        inc     ebx
        jmp     4b
5:      mov     al, '\n'
        call    putc
        xor     eax, eax
        mov     dx, EXIT_PORT
        out     dx, al
6:      jmp     6b

# al -> COM1
putc:
        mov     dx, COM1
        out     dx, al
        ret

        .include "puthex.S"

msg:    .asciz  "atomic"
