# sink: reads COM1's data register in a tight loop, without waiting for LSR, and checks
# that the bytes that are not zero arrive in the order 1, 2, .., 255, 1, 2, .. . It
# publishes how many arrived at RECEIVED and how many broke the order at GAPS. Nearly
# every VM exit is then an IN that took a byte from the FIFO: a copy of the VM made
# while one was not finished would read the next byte in its place (a gap).
        .include "prelude.S"
        .equ RECEIVED, 0x6000
        .equ GAPS,     0x6008
main:
        lea     rsi, [rip + started]
        call    puts
        xor     ebx, ebx                # the last byte in order
        mov     dx, COM1
1:      in      al, dx
        test    al, al
        jz      1b
        inc     bl
        jnz     2f
        mov     bl, 1
2:      cmp     al, bl
        je      3f
        inc     qword ptr [GAPS]
        mov     bl, al
3:      inc     qword ptr [RECEIVED]
        jmp     1b
started: .asciz "sinking\n"
