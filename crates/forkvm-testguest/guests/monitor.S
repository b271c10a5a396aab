# monitor: optionally fill memory with a pattern, then serve a tiny binary protocol
# on COM1 so tests and benchmarks can poke at guest memory from the host.
#
# Arguments: ARGS[0] = fill base, ARGS[1] = fill length in bytes (0: no fill),
#            ARGS[2] = pattern seed. Word at address a gets seed ^ a.
# Commands (one byte, then u64 little-endian operands); every reply is a line:
#   'p'                 -> "pong\n"
#   'w' addr value      -> stores the u64,            "ok\n"
#   'r' addr            -> "=<16 hex digits>\n"
#   's' addr len        -> "=<hex>\n": sum of the u64 words in [addr, addr+len)
#   'f' addr len seed   -> fills like at start,       "ok\n"
#   'W' addr value      -> stores the low 32 bits,    "ok\n"  (device registers)
#   'R' addr            -> "=<16 hex digits>\n": the 32-bit word at addr
#   'n' addr value count-> stores the 32-bit value count times, "ok\n" (a
#                          notification storm on a device register)
        .include "prelude.S"
main:
        mov     rdi, [ARGS]
        mov     rcx, [ARGS + 8]
        mov     rdx, [ARGS + 16]
        call    fill
        lea     rsi, [rip + ready]
        call    puts
next:   call    getc
        cmp     al, 'p'
        je      do_ping
        cmp     al, 'w'
        je      do_write
        cmp     al, 'r'
        je      do_read
        cmp     al, 's'
        je      do_sum
        cmp     al, 'f'
        je      do_fill
        cmp     al, 'W'
        je      do_write32
        cmp     al, 'R'
        je      do_read32
        cmp     al, 'n'
        je      do_repeat32
        lea     rsi, [rip + unknown]
        call    puts
        jmp     next
do_ping:
        lea     rsi, [rip + pong]
        call    puts
        jmp     next
do_write:
        call    read_u64
        mov     rdi, rax
        call    read_u64
        mov     [rdi], rax
        jmp     reply_ok
do_read:
        call    read_u64
        mov     rax, [rax]
        jmp     reply_value
do_sum:
        call    read_u64
        mov     rdi, rax
        call    read_u64
        mov     rcx, rax
        shr     rcx, 3
        xor     eax, eax
1:      test    rcx, rcx
        jz      reply_value
        add     rax, [rdi]
        add     rdi, 8
        dec     rcx
        jmp     1b
do_fill:
        call    read_u64
        mov     rdi, rax
        call    read_u64
        mov     rcx, rax
        call    read_u64
        mov     rdx, rax
        call    fill
        jmp     reply_ok
do_write32:
        call    read_u64
        mov     rdi, rax
        call    read_u64
        mov     [rdi], eax
        jmp     reply_ok
do_read32:
        call    read_u64
        mov     eax, [rax]
        jmp     reply_value
do_repeat32:
        call    read_u64
        mov     rdi, rax
        call    read_u64
        mov     rdx, rax
        call    read_u64
        mov     rcx, rax
1:      test    rcx, rcx
        jz      reply_ok
        mov     [rdi], edx
        dec     rcx
        jmp     1b
reply_ok:
        lea     rsi, [rip + ok]
        call    puts
        jmp     next
reply_value:
        push    rax
        mov     al, '='
        call    putc
        pop     rax
        call    puthex
        mov     al, '\n'
        call    putc
        jmp     next

# fill: rdi = base, rcx = length in bytes, rdx = seed; word at a = seed ^ a.
fill:
        shr     rcx, 3
1:      test    rcx, rcx
        jz      2f
        mov     rax, rdx
        xor     rax, rdi
        mov     [rdi], rax
        add     rdi, 8
        dec     rcx
        jmp     1b
2:      ret

ready:   .asciz "ready\n"
pong:    .asciz "pong\n"
ok:      .asciz "ok\n"
unknown: .asciz "?\n"
