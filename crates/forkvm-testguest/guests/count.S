# count: run ARGS[0] iterations of a hash chain natively in ring 3, publishing the
# iteration counter at COUNTER and the hash at HASH after every step, then print
# "count=<hex> hash=<hex>" and exit 0. The hash depends on every step taken, so a
# snapshot that loses or repeats any state ends with a different line.
#   hash(i+1) = hash(i) * 6364136223846793005 + i + 1, hash(0) = 0
        .include "prelude.S"
        .equ COUNTER, 0x6000
        .equ HASH,    0x6008
main:
        lea     rsi, [rip + started]
        call    puts
        mov     r8, [ARGS]
        mov     rcx, [COUNTER]
        mov     rbx, [HASH]
        mov     r9, 6364136223846793005
1:      cmp     rcx, r8
        jae     2f
        inc     rcx
        imul    rbx, r9
        add     rbx, rcx
        mov     [COUNTER], rcx
        mov     [HASH], rbx
        jmp     1b
2:      lea     rsi, [rip + count_is]
        call    puts
        mov     rax, rcx
        call    puthex
        lea     rsi, [rip + hash_is]
        call    puts
        mov     rax, rbx
        call    puthex
        mov     al, '\n'
        call    putc
        ret
started:  .asciz "counting\n"
count_is: .asciz "count="
hash_is:  .asciz " hash="
