# hello: print one line on COM1 from ring 3, then sleep until the VMM stops us.
        .include "prelude.S"
main:
        lea     rsi, [rip + msg]
        call    puts
        xor     edx, edx                # no wake condition: sleep for good
1:      hlt
        jmp     1b
msg:    .asciz  "hello from ring 3\n"
