# Shared start-up for every forkvm test guest.
#
# The VMM enters us in 64-bit mode at IMAGE_BASE with the boot GDT, identity-mapped
# page tables whose entries allow user access, and RSI pointing at the argument block.
# Ring-0 code runs through KVM's instruction emulator on PVM hosts (~1000x slower), so
# this prelude does only what must be done in ring 0 -- load our GDT/TSS/IDT, route
# COM1's interrupt, enable the LAPIC -- and then drops to ring 3 with IOPL=3, where the
# program's `main` runs natively and still reaches the serial port with in/out.
#
# Every vCPU enters here, RDI holding its index. vCPU 0 runs `main`. Another vCPU
# (index 1 .. MAX_CPUS-1) takes its own TSS, GDT slot and stacks in AP_AREA and runs
# `ap_main` in ring 3 with RDI still its index, if the guest defines HAVE_AP_MAIN, or
# sleeps for ever. vCPU i's LAPIC-timer vector TIMER_VECTOR+i adds one to TICKS[i], its
# IPI vector IPI_VECTOR+i to IPIS[i] (u64 arrays, published for the VMM's tests).
#
# Services for ring 3 (all preserve registers except the documented outputs):
#   hlt        (in ring 3) sleep until an interrupt arrives, via the #GP handler;
#              with dx = port, cl = mask: unless port dx already shows a bit of cl
#   sti        (in ring 3) interrupts on, natively or through the #GP handler
#   putc       al -> COM1              puts    rsi -> NUL-terminated string
#   puthex     rax -> 16 hex digits    getc    -> al (sleeps with hlt while empty)
#   read_u64   -> rax (8 bytes from COM1, little endian)
#   exit       edi -> debug-exit port (the VMM ends the run with that code)

        .intel_syntax noprefix
        .equ IMAGE_BASE,    0x100000
        .equ ARGS,          0x7000          # u64 argument block written by the VMM
        .equ TSS_BASE,      0x3000          # low page the VMM leaves zeroed
        .equ IOMAP_PORTS,   0x600           # ring 3 may use ports below this
        .equ TSS_LIMIT,     104 + IOMAP_PORTS / 8
        .equ KSTACK_TOP,    0x4ff0          # ring-0 stack (interrupts, exceptions)
        .equ USTACK_TOP,    0x5ff0          # ring-3 stack
        .equ COM1,          0x3f8
        .equ EXIT_PORT,     0x501
        .equ IOAPIC,        0xfec00000
        .equ LAPIC,         0xfee00000
        .equ SERIAL_VECTOR, 0x24
        .equ SEL_KCODE,     0x08
        .equ SEL_UDATA,     0x1b
        .equ SEL_UCODE,     0x23
        .equ SEL_TSS,       0x28            # vCPU i's TSS: SEL_TSS + 16 * i
        .equ MAX_CPUS,      8
        .equ AP_AREA,       0x40000         # vCPU i >= 1: AP_AREA + i * 0x4000 holds
        .equ AP_KSTACK,     0x1ff0          #   its TSS, its ring-0 stack top
        .equ AP_USTACK,     0x3ff0          #   and its ring-3 stack top
        .equ TICKS,         0x6040          # u64 per vCPU: LAPIC timer interrupts
        .equ IPIS,          0x6080          # u64 per vCPU: IPIs received
        .equ TIMER_VECTOR,  0x30            # + vCPU index
        .equ IPI_VECTOR,    0x38            # + vCPU index

        .section .text
        .globl _start
_start:
        cli
        lgdt    [rip + gdt_ptr]
        lidt    [rip + idt_ptr]
        test    edi, edi
        jnz     ap_start
        # 64-bit TSS: rsp0 = KSTACK_TOP; an I/O permission bitmap right after the TSS
        # that allows ring 3 every port below IOMAP_PORTS (the page is zero: all allowed),
        # closed by the required all-ones byte.
        mov     rax, KSTACK_TOP
        mov     [TSS_BASE + 4], rax
        mov     word ptr [TSS_BASE + 102], 104
        mov     byte ptr [TSS_BASE + 104 + IOMAP_PORTS / 8], 0xff
        mov     ax, SEL_TSS
        ltr     ax
        # IOAPIC redirection entry 4 (COM1): vector SERIAL_VECTOR, fixed, edge, to APIC 0.
        mov     rbx, IOAPIC
        mov     dword ptr [rbx], 0x18
        mov     dword ptr [rbx + 0x10], SERIAL_VECTOR
        mov     dword ptr [rbx], 0x19
        mov     dword ptr [rbx + 0x10], 0
        # Mask both legacy PICs: interrupts come through the IOAPIC (on a split irqchip
        # these ports are unclaimed and the writes are dropped).
        mov     al, 0xff
        out     0x21, al
        out     0xa1, al
        # LAPIC: software-enable with spurious vector 0xff.
        mov     rbx, LAPIC
        mov     dword ptr [rbx + 0xf0], 0x1ff
        mov     rsp, KSTACK_TOP
.ifdef HAVE_RING0_HOOK
        call    ring0_hook              # the guest's own ring-0 work (see traps.S)
.endif
        # iretq frame: SS, RSP, RFLAGS (IOPL=3, IF=0), CS, RIP.
        push    SEL_UDATA
        push    USTACK_TOP
        push    0x3002
        push    SEL_UCODE
        lea     rax, [rip + user_entry]
        push    rax
        iretq

# vCPU rdi >= 1: its own TSS (rsp0, I/O bitmap as above) and stacks, its LAPIC on,
# then ring 3 with interrupts off, like vCPU 0.
ap_start:
        mov     rbx, rdi
        shl     rbx, 14
        add     rbx, AP_AREA
        lea     rax, [rbx + AP_KSTACK]
        mov     [rbx + 4], rax
        mov     word ptr [rbx + 102], 104
        mov     byte ptr [rbx + 104 + IOMAP_PORTS / 8], 0xff
        mov     eax, edi
        shl     eax, 4
        add     eax, SEL_TSS
        ltr     ax
        mov     rax, LAPIC
        mov     dword ptr [rax + 0xf0], 0x1ff
        lea     rsp, [rbx + AP_KSTACK]
        push    SEL_UDATA
        lea     rax, [rbx + AP_USTACK]
        push    rax
        push    0x3002
        push    SEL_UCODE
        lea     rax, [rip + ap_user_entry]
        push    rax
        iretq

ap_user_entry:
        mov     ax, SEL_UDATA
        mov     ds, ax
        mov     es, ax
.ifdef HAVE_AP_MAIN
        jmp     ap_main
.else
        xor     edx, edx
1:      hlt
        jmp     1b
.endif

user_entry:
        mov     ax, SEL_UDATA
        mov     ds, ax
        mov     es, ax
        # COM1: enable the received-data interrupt; OUT2 gates the IRQ on PCs.
        mov     dx, COM1 + 1
        mov     al, 1
        out     dx, al
        mov     dx, COM1 + 4
        mov     al, 0x08
        out     dx, al
        call    main
        xor     edi, edi
        call    exit

# ---- ring-3 services -------------------------------------------------------------

putc:
        push    rdx
        push    rax
1:      mov     dx, COM1 + 5
        in      al, dx
        test    al, 0x20
        jz      1b
        pop     rax
        mov     dx, COM1
        out     dx, al
        pop     rdx
        ret

puts:
        push    rsi
        push    rax
1:      mov     al, [rsi]
        test    al, al
        jz      2f
        call    putc
        inc     rsi
        jmp     1b
2:      pop     rax
        pop     rsi
        ret

        .include "puthex.S"

getc:
        push    rdx
        push    rcx
        mov     cl, 1                   # LSR data ready: the wake condition for hlt
1:      mov     dx, COM1 + 5
        in      al, dx
        test    al, cl
        jnz     2f
        hlt
        jmp     1b
2:      mov     dx, COM1
        in      al, dx
        pop     rcx
        pop     rdx
        ret

read_u64:
        push    rcx
        push    rbx
        xor     ebx, ebx
        xor     ecx, ecx
1:      xor     eax, eax
        call    getc
        movzx   rax, al
        shl     rax, cl
        or      rbx, rax
        add     ecx, 8
        cmp     ecx, 64
        jne     1b
        mov     rax, rbx
        pop     rbx
        pop     rcx
        ret

exit:
        mov     dx, EXIT_PORT
        mov     eax, edi
        out     dx, al
        xor     edx, edx
1:      hlt
        jmp     1b

# ---- ring-0 handlers (fixed offsets so the IDT can be built at assembly time) ------

        .org    0x400
# #GP. A `hlt` in ring 3 raises #GP; we take it as "sleep until an interrupt": halt
# here with interrupts on, then return past the hlt. (PVM hosts turn a ring-3 `int n`
# into #UD and do not switch privilege on `syscall`, so an exception is the one way
# up that works on every host.) Any other #GP is a fault.
# The wake condition is re-checked here, with interrupts off, so a wake-up that
# arrived between ring 3's check and its hlt is not lost: if dx is non-zero, port dx
# is read and the halt skipped when it has any bit of cl set.
gp_handler:
        push    rax
        mov     rax, [rsp + 16]         # rip, past the error code and saved rax
        cmp     byte ptr [rax], 0xfb
        je      4f
        cmp     byte ptr [rax], 0xf4
        jne     2f
        inc     qword ptr [rsp + 16]
        test    dx, dx
        jz      1f
        in      al, dx
        test    al, cl
        jnz     3f
1:      sti
        hlt
        cli
3:      pop     rax
        add     rsp, 8                  # drop the error code
        iretq
2:      pop     rax
        jmp     H_FAULT + 8 * 13
# `sti` in ring 3 (IOPL=3 allows it, but PVM hosts raise #GP): set IF in the frame.
4:      inc     qword ptr [rsp + 16]
        or      qword ptr [rsp + 32], 0x200
        pop     rax
        add     rsp, 8
        iretq

        .org    0x480
serial_handler:                         # COM1 interrupt: acknowledge and return
        push    rax
        mov     rax, LAPIC + 0xb0
        mov     dword ptr [rax], 0
        pop     rax
        iretq

        .org    0x500
# One 8-byte stub per CPU exception: push the vector, join the common reporter.
fault_stubs:
        .irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        .balign 8
        push    \v
        jmp     fault_common
        .endr

# Prints "!F <vector> <rip>" (rip of the faulting instruction, found past the error
# code for the exceptions that push one) and reports EXIT_CODE_FAULT.
fault_common:
        mov     dx, COM1
        mov     al, '!'
        out     dx, al
        mov     al, 'F'
        out     dx, al
        pop     rbx                     # vector
        mov     rcx, [rsp]              # rip, unless an error code was pushed
        cmp     rbx, 8
        je      1f
        cmp     rbx, 10
        jb      2f
        cmp     rbx, 14
        ja      2f
1:      mov     rcx, [rsp + 8]
2:      mov     rax, rbx
        call    k_puthex
        mov     rax, rcx
        call    k_puthex
        mov     al, '\n'
        out     dx, al
        mov     dx, EXIT_PORT
        mov     al, 0xfe
        out     dx, al
3:      cli
        hlt
        jmp     3b

# ring-0 " <16 hex digits>" of rax on COM1 (dx = COM1)
k_puthex:
        mov     rsi, rax
        mov     al, ' '
        out     dx, al
        mov     edi, 16
1:      rol     rsi, 4
        mov     al, sil
        and     al, 0xf
        add     al, '0'
        cmp     al, '9'
        jbe     2f
        add     al, 'a' - '9' - 1
2:      out     dx, al
        dec     edi
        jnz     1b
        ret

        .org    0x800
# One 16-byte stub per vCPU for its timer vector, then one per vCPU for its IPI vector:
# count it, acknowledge it, return.
smp_stubs:
        .irp i, 0,1,2,3,4,5,6,7
        .balign 16
        inc     qword ptr [TICKS + 8 * \i]
        jmp     eoi_return
        .endr
        .irp i, 0,1,2,3,4,5,6,7
        .balign 16
        inc     qword ptr [IPIS + 8 * \i]
        jmp     eoi_return
        .endr
eoi_return:
        push    rax
        mov     rax, LAPIC + 0xb0
        mov     dword ptr [rax], 0
        pop     rax
        iretq

        .org    0x980
        .equ H_GP,     IMAGE_BASE + 0x400
        .equ H_SERIAL, IMAGE_BASE + 0x480
        .equ H_FAULT,  IMAGE_BASE + 0x500   # + 8 * vector
        .equ H_SMP,    IMAGE_BASE + 0x800   # + 16 * (vector - TIMER_VECTOR)

.macro IDT_GATE addr, dpl
        .word   (\addr) & 0xffff
        .word   SEL_KCODE
        .byte   0
        .byte   0x8e | (\dpl << 5)
        .word   ((\addr) >> 16) & 0xffff
        .long   0
        .long   0
.endm

        .balign 16
idt:
        .irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12
        IDT_GATE (H_FAULT+8*\v), 0
        .endr
        IDT_GATE H_GP, 0
        .irp v, 14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        IDT_GATE (H_FAULT+8*\v), 0
        .endr
        .rept SERIAL_VECTOR - 32
        .quad 0, 0
        .endr
        IDT_GATE H_SERIAL, 0
        .rept TIMER_VECTOR - SERIAL_VECTOR - 1
        .quad 0, 0
        .endr
        .irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        IDT_GATE (H_SMP+16*\v), 0
        .endr
idt_end:

        .balign 16
gdt:
        .quad   0
        .quad   0x00af9b000000ffff      # 0x08 kernel code, 64-bit
        .quad   0x00cf93000000ffff      # 0x10 kernel data
        .quad   0x00cff3000000ffff      # 0x18 user data (DPL 3)
        .quad   0x00affb000000ffff      # 0x20 user code, 64-bit (DPL 3)
        .quad   0x0000890000000000 | TSS_LIMIT | (TSS_BASE << 16)   # 0x28 TSS (base < 16 MiB)
        .quad   0
        .irp i, 1,2,3,4,5,6,7                                       # 0x38.. vCPU i's TSS
        .quad   0x0000890000000000 | TSS_LIMIT | ((AP_AREA + \i * 0x4000) << 16)
        .quad   0
        .endr
gdt_end:

gdt_ptr:
        .word   gdt_end - gdt - 1
        .quad   gdt
idt_ptr:
        .word   idt_end - idt - 1
        .quad   idt
