# echo: copy every byte received on COM1 back to COM1; sleep while there is none.
        .include "prelude.S"
main:
        lea     rsi, [rip + msg]
        call    puts
1:      call    getc
        call    putc
        jmp     1b
msg:    .asciz  "echo ready\n"
