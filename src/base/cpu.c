/* cpu.c — CPU feature detection, once per process (cpu.h). */
#include "base/cpu.h"

#include <stdatomic.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static int detect_avx2(void) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
    /* F16C (CPUID.1:ECX bit 29) by hand: clang's __builtin_cpu_supports has no name for it */
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static int detect_intel(void) {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") ? 1 : 0;
}
#else
static int detect_avx2(void) { return 0; }
static int detect_intel(void) { return 0; }
#endif

static int cached(_Atomic int *v, int (*detect)(void)) {
    int r = atomic_load_explicit(v, memory_order_relaxed);
    if (r < 0) {
        r = detect();
        atomic_store_explicit(v, r, memory_order_relaxed);
    }
    return r;
}

int mk_cpu_avx2(void) {
    static _Atomic int v = -1;
    return cached(&v, detect_avx2);
}

int mk_cpu_intel(void) {
    static _Atomic int v = -1;
    return cached(&v, detect_intel);
}
