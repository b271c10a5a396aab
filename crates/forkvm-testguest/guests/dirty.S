# dirty: keep rewriting guest memory, for branch benchmarks that need a guest whose
# pages change under the snapshot. Forever: generation g += 1, then one u64 per 4 KiB
# page of [ARGS[0], ARGS[0] + ARGS[1]) gets g ^ address; g is published at GEN after
# every pass. Prints "dirtying" once at the start. Every other vCPU runs the same
# passes over the same range without publishing (all vCPUs busy for multi-vCPU benches).
        .set    HAVE_AP_MAIN, 1
        .include "prelude.S"
        .equ GEN, 0x6000
main:
        lea     rsi, [rip + started]
        call    puts
        mov     r8, [ARGS]
        mov     r9, [ARGS + 8]
        add     r9, r8
        mov     rax, [GEN]
1:      inc     rax
        mov     rdi, r8
2:      cmp     rdi, r9
        jae     3f
        mov     rdx, rax
        xor     rdx, rdi
        mov     [rdi], rdx
        add     rdi, 4096
        jmp     2b
3:      mov     [GEN], rax
        jmp     1b
started: .asciz "dirtying\n"

ap_main:
        mov     r8, [ARGS]
        mov     r9, [ARGS + 8]
        add     r9, r8
        xor     eax, eax
1:      inc     rax
        mov     rdi, r8
2:      cmp     rdi, r9
        jae     1b
        mov     rdx, rax
        xor     rdx, rdi
        mov     [rdi], rdx
        add     rdi, 4096
        jmp     2b
