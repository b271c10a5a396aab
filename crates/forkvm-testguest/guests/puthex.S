# puthex: rax -> COM1 as 16 hex digits, through the including guest's `putc` (al -> COM1);
# preserves every register putc does. Shared by the prelude (ring 3) and `atomic` (ring 0).
puthex:
        push    rax
        push    rcx
        push    rbx
        mov     rbx, rax
        mov     ecx, 16
1:      rol     rbx, 4
        mov     al, bl
        and     al, 0xf
        add     al, '0'
        cmp     al, '9'
        jbe     2f
        add     al, 'a' - '9' - 1
2:      call    putc
        dec     ecx
        jnz     1b
        pop     rbx
        pop     rcx
        pop     rax
        ret
