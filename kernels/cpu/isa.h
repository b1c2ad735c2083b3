/*
 * isa.h - the instruction-set level hp's own CPU kernels dispatch on.
 *
 * Three levels, each a superset of the one before:
 *   baseline  x86-64-v2 (the build's target; SSE4.2, no FMA), or any
 *             other architecture: plain C and vector extensions
 *   avx2      x86-64-v3: AVX2 and FMA
 *   avx512    x86-64-v4: AVX-512 F, BW, CD, DQ and VL
 *
 * The level in use is the highest the CPU has, capped by HP_CPU: one
 * machine can run every level at or below its own, which is how the test
 * suite covers all three on one AVX-512 host.  HP_CPU asks for a ceiling,
 * not a floor: HP_CPU=avx512 on an AVX2 CPU runs avx2.
 *
 * What the level changes: hp_sgemm (kernels/cpu/gemm.c), the tiled
 * attention work items (attntile.c) and AdamW (adamw.c).  The vector
 * helpers of vec.h are cloned for x86-64-v3 and picked by the loader, not
 * by HP_CPU: they compute the same bits on every machine by construction.
 *
 * Reproducibility, per level: every kernel's result depends on its inputs
 * only, never on the thread count.  Across levels: avx2 and avx512 give
 * identical bits everywhere (same operations in the same order, fused
 * multiply-adds in both); baseline has no FMA, so its GEMM rounds each
 * product and each sum (its own bits, within the same error bounds).
 *
 * HP_CPU is read on every call (it is cheap), so that tests can change it
 * between calls; a value other than the three names is a usage error that
 * every tool reports at start-up (hp_cpu_env_check).
 */
#ifndef HP_KERNELS_CPU_ISA_H
#define HP_KERNELS_CPU_ISA_H

enum hp_cpu_level {
	HP_CPU_BASELINE = 0,
	HP_CPU_AVX2 = 1,
	HP_CPU_AVX512 = 2,
};

/* The highest level this CPU supports (HP_CPU ignored). */
int hp_cpu_level_max(void);

/* The level in use: hp_cpu_level_max() capped by HP_CPU. */
int hp_cpu_level(void);

/* "baseline", "avx2" or "avx512". */
const char *hp_cpu_level_name(int level);

/* 0 when HP_CPU is unset, empty or one of the three names; else -1, with
 * *value set to what it holds. */
int hp_cpu_env_check(const char **value);

#endif
