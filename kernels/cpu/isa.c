/*
 * isa.c - the CPU's instruction-set level and the HP_CPU cap (see isa.h).
 */
#include <stdlib.h>
#include <string.h>

#include "cpu/isa.h"

static const char *const level_names[] = { "baseline", "avx2", "avx512" };

const char *hp_cpu_level_name(int level)
{
	return level >= HP_CPU_BASELINE && level <= HP_CPU_AVX512 ? level_names[level] : "?";
}

int hp_cpu_level_max(void)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(HP_NO_CLONES)
#if defined(__clang__)
	/* clang 14 knows the features, not the level names */
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
	    __builtin_cpu_supports("avx512vl"))
		return HP_CPU_AVX512;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		return HP_CPU_AVX2;
#else
	if (__builtin_cpu_supports("x86-64-v4"))
		return HP_CPU_AVX512;
	if (__builtin_cpu_supports("x86-64-v3"))
		return HP_CPU_AVX2;
#endif
#endif
	return HP_CPU_BASELINE;
}

/* The level HP_CPU names: -1 when unset or empty, -2 for any other value. */
static int env_level(const char **value)
{
	const char *s = getenv("HP_CPU");

	if (value)
		*value = s;
	if (!s || !*s)
		return -1;
	for (int l = HP_CPU_BASELINE; l <= HP_CPU_AVX512; l++)
		if (!strcmp(s, level_names[l]))
			return l;
	return -2;
}

int hp_cpu_level(void)
{
	int max = hp_cpu_level_max(), cap = env_level(NULL);

	/* no cap when unset; an invalid value was refused at start-up */
	return cap >= 0 && cap < max ? cap : max;
}

int hp_cpu_env_check(const char **value)
{
	return env_level(value) == -2 ? -1 : 0;
}
