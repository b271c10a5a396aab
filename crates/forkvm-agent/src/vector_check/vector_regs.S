# Vector-register round trips for `vector_check` (Intel syntax, included by asm.rs).
#
# Each `forkvm_vc_<level>(input, output)` loads every register of its level from
# `input`, calls sched_yield (so other processes run and use the same registers), and
# stores them to `output`. Each `forkvm_vh_<level>(input, output, flag)` loads them,
# spins (yielding now and then) until the byte at `flag` turns non-zero, and stores
# them. Layout of both buffers: 32 registers x 64 bytes (xmm/ymm/zmm N at N*64), then
# 8 x 8 bytes of opmask registers at 2048. All vector and opmask registers are
# caller-saved in the System V ABI, so the callers need not preserve them.

# Registers of level sse: load from [rdi], store to [rsi].
.macro load_sse
    movdqu xmm0, xmmword ptr [rdi + 0]
    movdqu xmm1, xmmword ptr [rdi + 64]
    movdqu xmm2, xmmword ptr [rdi + 128]
    movdqu xmm3, xmmword ptr [rdi + 192]
    movdqu xmm4, xmmword ptr [rdi + 256]
    movdqu xmm5, xmmword ptr [rdi + 320]
    movdqu xmm6, xmmword ptr [rdi + 384]
    movdqu xmm7, xmmword ptr [rdi + 448]
    movdqu xmm8, xmmword ptr [rdi + 512]
    movdqu xmm9, xmmword ptr [rdi + 576]
    movdqu xmm10, xmmword ptr [rdi + 640]
    movdqu xmm11, xmmword ptr [rdi + 704]
    movdqu xmm12, xmmword ptr [rdi + 768]
    movdqu xmm13, xmmword ptr [rdi + 832]
    movdqu xmm14, xmmword ptr [rdi + 896]
    movdqu xmm15, xmmword ptr [rdi + 960]
.endm
.macro store_sse
    movdqu xmmword ptr [rsi + 0], xmm0
    movdqu xmmword ptr [rsi + 64], xmm1
    movdqu xmmword ptr [rsi + 128], xmm2
    movdqu xmmword ptr [rsi + 192], xmm3
    movdqu xmmword ptr [rsi + 256], xmm4
    movdqu xmmword ptr [rsi + 320], xmm5
    movdqu xmmword ptr [rsi + 384], xmm6
    movdqu xmmword ptr [rsi + 448], xmm7
    movdqu xmmword ptr [rsi + 512], xmm8
    movdqu xmmword ptr [rsi + 576], xmm9
    movdqu xmmword ptr [rsi + 640], xmm10
    movdqu xmmword ptr [rsi + 704], xmm11
    movdqu xmmword ptr [rsi + 768], xmm12
    movdqu xmmword ptr [rsi + 832], xmm13
    movdqu xmmword ptr [rsi + 896], xmm14
    movdqu xmmword ptr [rsi + 960], xmm15
.endm

# Registers of level avx: load from [rdi], store to [rsi].
.macro load_avx
    vmovdqu ymm0, ymmword ptr [rdi + 0]
    vmovdqu ymm1, ymmword ptr [rdi + 64]
    vmovdqu ymm2, ymmword ptr [rdi + 128]
    vmovdqu ymm3, ymmword ptr [rdi + 192]
    vmovdqu ymm4, ymmword ptr [rdi + 256]
    vmovdqu ymm5, ymmword ptr [rdi + 320]
    vmovdqu ymm6, ymmword ptr [rdi + 384]
    vmovdqu ymm7, ymmword ptr [rdi + 448]
    vmovdqu ymm8, ymmword ptr [rdi + 512]
    vmovdqu ymm9, ymmword ptr [rdi + 576]
    vmovdqu ymm10, ymmword ptr [rdi + 640]
    vmovdqu ymm11, ymmword ptr [rdi + 704]
    vmovdqu ymm12, ymmword ptr [rdi + 768]
    vmovdqu ymm13, ymmword ptr [rdi + 832]
    vmovdqu ymm14, ymmword ptr [rdi + 896]
    vmovdqu ymm15, ymmword ptr [rdi + 960]
.endm
.macro store_avx
    vmovdqu ymmword ptr [rsi + 0], ymm0
    vmovdqu ymmword ptr [rsi + 64], ymm1
    vmovdqu ymmword ptr [rsi + 128], ymm2
    vmovdqu ymmword ptr [rsi + 192], ymm3
    vmovdqu ymmword ptr [rsi + 256], ymm4
    vmovdqu ymmword ptr [rsi + 320], ymm5
    vmovdqu ymmword ptr [rsi + 384], ymm6
    vmovdqu ymmword ptr [rsi + 448], ymm7
    vmovdqu ymmword ptr [rsi + 512], ymm8
    vmovdqu ymmword ptr [rsi + 576], ymm9
    vmovdqu ymmword ptr [rsi + 640], ymm10
    vmovdqu ymmword ptr [rsi + 704], ymm11
    vmovdqu ymmword ptr [rsi + 768], ymm12
    vmovdqu ymmword ptr [rsi + 832], ymm13
    vmovdqu ymmword ptr [rsi + 896], ymm14
    vmovdqu ymmword ptr [rsi + 960], ymm15
    vzeroupper
.endm

# Registers of level avx512: load from [rdi], store to [rsi].
.macro load_avx512
    vmovdqu64 zmm0, zmmword ptr [rdi + 0]
    vmovdqu64 zmm1, zmmword ptr [rdi + 64]
    vmovdqu64 zmm2, zmmword ptr [rdi + 128]
    vmovdqu64 zmm3, zmmword ptr [rdi + 192]
    vmovdqu64 zmm4, zmmword ptr [rdi + 256]
    vmovdqu64 zmm5, zmmword ptr [rdi + 320]
    vmovdqu64 zmm6, zmmword ptr [rdi + 384]
    vmovdqu64 zmm7, zmmword ptr [rdi + 448]
    vmovdqu64 zmm8, zmmword ptr [rdi + 512]
    vmovdqu64 zmm9, zmmword ptr [rdi + 576]
    vmovdqu64 zmm10, zmmword ptr [rdi + 640]
    vmovdqu64 zmm11, zmmword ptr [rdi + 704]
    vmovdqu64 zmm12, zmmword ptr [rdi + 768]
    vmovdqu64 zmm13, zmmword ptr [rdi + 832]
    vmovdqu64 zmm14, zmmword ptr [rdi + 896]
    vmovdqu64 zmm15, zmmword ptr [rdi + 960]
    vmovdqu64 zmm16, zmmword ptr [rdi + 1024]
    vmovdqu64 zmm17, zmmword ptr [rdi + 1088]
    vmovdqu64 zmm18, zmmword ptr [rdi + 1152]
    vmovdqu64 zmm19, zmmword ptr [rdi + 1216]
    vmovdqu64 zmm20, zmmword ptr [rdi + 1280]
    vmovdqu64 zmm21, zmmword ptr [rdi + 1344]
    vmovdqu64 zmm22, zmmword ptr [rdi + 1408]
    vmovdqu64 zmm23, zmmword ptr [rdi + 1472]
    vmovdqu64 zmm24, zmmword ptr [rdi + 1536]
    vmovdqu64 zmm25, zmmword ptr [rdi + 1600]
    vmovdqu64 zmm26, zmmword ptr [rdi + 1664]
    vmovdqu64 zmm27, zmmword ptr [rdi + 1728]
    vmovdqu64 zmm28, zmmword ptr [rdi + 1792]
    vmovdqu64 zmm29, zmmword ptr [rdi + 1856]
    vmovdqu64 zmm30, zmmword ptr [rdi + 1920]
    vmovdqu64 zmm31, zmmword ptr [rdi + 1984]
    kmovq k0, qword ptr [rdi + 2048]
    kmovq k1, qword ptr [rdi + 2056]
    kmovq k2, qword ptr [rdi + 2064]
    kmovq k3, qword ptr [rdi + 2072]
    kmovq k4, qword ptr [rdi + 2080]
    kmovq k5, qword ptr [rdi + 2088]
    kmovq k6, qword ptr [rdi + 2096]
    kmovq k7, qword ptr [rdi + 2104]
.endm
.macro store_avx512
    vmovdqu64 zmmword ptr [rsi + 0], zmm0
    vmovdqu64 zmmword ptr [rsi + 64], zmm1
    vmovdqu64 zmmword ptr [rsi + 128], zmm2
    vmovdqu64 zmmword ptr [rsi + 192], zmm3
    vmovdqu64 zmmword ptr [rsi + 256], zmm4
    vmovdqu64 zmmword ptr [rsi + 320], zmm5
    vmovdqu64 zmmword ptr [rsi + 384], zmm6
    vmovdqu64 zmmword ptr [rsi + 448], zmm7
    vmovdqu64 zmmword ptr [rsi + 512], zmm8
    vmovdqu64 zmmword ptr [rsi + 576], zmm9
    vmovdqu64 zmmword ptr [rsi + 640], zmm10
    vmovdqu64 zmmword ptr [rsi + 704], zmm11
    vmovdqu64 zmmword ptr [rsi + 768], zmm12
    vmovdqu64 zmmword ptr [rsi + 832], zmm13
    vmovdqu64 zmmword ptr [rsi + 896], zmm14
    vmovdqu64 zmmword ptr [rsi + 960], zmm15
    vmovdqu64 zmmword ptr [rsi + 1024], zmm16
    vmovdqu64 zmmword ptr [rsi + 1088], zmm17
    vmovdqu64 zmmword ptr [rsi + 1152], zmm18
    vmovdqu64 zmmword ptr [rsi + 1216], zmm19
    vmovdqu64 zmmword ptr [rsi + 1280], zmm20
    vmovdqu64 zmmword ptr [rsi + 1344], zmm21
    vmovdqu64 zmmword ptr [rsi + 1408], zmm22
    vmovdqu64 zmmword ptr [rsi + 1472], zmm23
    vmovdqu64 zmmword ptr [rsi + 1536], zmm24
    vmovdqu64 zmmword ptr [rsi + 1600], zmm25
    vmovdqu64 zmmword ptr [rsi + 1664], zmm26
    vmovdqu64 zmmword ptr [rsi + 1728], zmm27
    vmovdqu64 zmmword ptr [rsi + 1792], zmm28
    vmovdqu64 zmmword ptr [rsi + 1856], zmm29
    vmovdqu64 zmmword ptr [rsi + 1920], zmm30
    vmovdqu64 zmmword ptr [rsi + 1984], zmm31
    kmovq qword ptr [rsi + 2048], k0
    kmovq qword ptr [rsi + 2056], k1
    kmovq qword ptr [rsi + 2064], k2
    kmovq qword ptr [rsi + 2072], k3
    kmovq qword ptr [rsi + 2080], k4
    kmovq qword ptr [rsi + 2088], k5
    kmovq qword ptr [rsi + 2096], k6
    kmovq qword ptr [rsi + 2104], k7
    vzeroupper
.endm

# sched_yield(); clobbers rax, rcx, r11.
.macro yield_cpu
    mov eax, 24
    syscall
.endm

.globl forkvm_vc_sse
.type forkvm_vc_sse, @function
forkvm_vc_sse:
    load_sse
    yield_cpu
    store_sse
    ret

.globl forkvm_vh_sse
.type forkvm_vh_sse, @function
forkvm_vh_sse:
    load_sse
2:
    mov r8, 20000000
3:
    cmp byte ptr [rdx], 0
    jne 4f
    dec r8
    jnz 3b
    yield_cpu
    jmp 2b
4:
    store_sse
    ret

.globl forkvm_vc_avx
.type forkvm_vc_avx, @function
forkvm_vc_avx:
    load_avx
    yield_cpu
    store_avx
    ret

.globl forkvm_vh_avx
.type forkvm_vh_avx, @function
forkvm_vh_avx:
    load_avx
2:
    mov r8, 20000000
3:
    cmp byte ptr [rdx], 0
    jne 4f
    dec r8
    jnz 3b
    yield_cpu
    jmp 2b
4:
    store_avx
    ret

.globl forkvm_vc_avx512
.type forkvm_vc_avx512, @function
forkvm_vc_avx512:
    load_avx512
    yield_cpu
    store_avx512
    ret

.globl forkvm_vh_avx512
.type forkvm_vh_avx512, @function
forkvm_vh_avx512:
    load_avx512
2:
    mov r8, 20000000
3:
    cmp byte ptr [rdx], 0
    jne 4f
    dec r8
    jnz 3b
    yield_cpu
    jmp 2b
4:
    store_avx512
    ret

