/* cpu.h — what the x86 CPU under us can run, detected once per process.
 *
 * The SIMD kernels (src/ops/cpu/gemm.c, hc.c, src/num/ggml_quant.c) pick their path per call, and
 * CPUID is slow to ask every time (in a virtual machine it traps to the hypervisor), so the answers
 * are computed on first use and cached (racing first calls compute the same value). On other
 * architectures every answer is 0 and the callers take their scalar code.
 */
#ifndef MK_BASE_CPU_H
#define MK_BASE_CPU_H

/* 1: AVX2, FMA and F16C (the AVX2 kernels' target; OS support for the YMM state is implied). */
int mk_cpu_avx2(void);
/* 1: a GenuineIntel CPU (where an FMA with an f32-subnormal input takes a microcode assist). */
int mk_cpu_intel(void);

#endif
