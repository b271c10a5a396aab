# flood: print ARGS[0] bytes to COM1 as fast as the CPU can, with `rep outsb` from a
# 4 KiB buffer of text lines (one VM exit per buffer), then "flood done\n" and exit 0.
# A guest that prints without end: the VMM's console log must stay bounded.
        .include "prelude.S"
        .equ CHUNK, 4096
main:
        # Fill the buffer with lines "flood flood ... \n" (64 bytes each).
        lea     rdi, [rip + buffer]
        xor     ecx, ecx
1:      mov     eax, ecx
        and     eax, 63
        cmp     eax, 63
        mov     al, '\n'
        je      2f
        mov     al, 'f'
2:      mov     [rdi + rcx], al
        inc     ecx
        cmp     ecx, CHUNK
        jb      1b
        mov     r8, [ARGS]
        mov     dx, COM1
3:      test    r8, r8
        jz      5f
        mov     rcx, CHUNK
        cmp     r8, rcx
        jae     4f
        mov     rcx, r8
4:      sub     r8, rcx
        lea     rsi, [rip + buffer]
        rep     outsb
        jmp     3b
5:      lea     rsi, [rip + done]
        call    puts
        ret
done:   .asciz "flood done\n"
        .balign 4096
buffer: .skip CHUNK
