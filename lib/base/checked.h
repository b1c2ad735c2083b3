/*
 * checked.h - size arithmetic that says when it overflows.
 *
 * Every product of sizes that user input reaches (a config's batch and
 * sequence lengths, config.json's dimensions) goes through these before it
 * sizes a buffer or an estimate, in the planner and the runtime alike, so
 * that a huge value is refused by name instead of wrapping into a small
 * allocation.  Each returns 0 with the result in *r, or 1 when the exact
 * result does not fit (a negative operand is an overflow too: sizes are
 * never negative), *r then 0 or the wrapped product, never to be used.
 */
#ifndef HP_CHECKED_H
#define HP_CHECKED_H

#include <stdint.h>

/*
 * The most tokens a micro-batch may hold (2^24, 16M: a million-token
 * context 16 times over).  With config.json's dimensions bounded as
 * lib/config/hfconfig.c bounds them (2^24) and top-k at most 1024, any product of
 * a token count, two dimensions and an element size then fits in 63 bits,
 * which lets lib/model/model.c size each activation in plain size_t arithmetic;
 * their sum is checked by the arena (lib/base/arena.h).
 */
#define HP_MAX_TOKENS ((int64_t)1 << 24)
/* The largest dimension config.json may give (hidden, intermediate and
 * vocabulary sizes, heads x head_dim), experts, and experts per token. */
#define HP_MAX_DIM ((int64_t)1 << 24)
#define HP_MAX_EXPERTS ((int64_t)1 << 16)
#define HP_MAX_TOP_K 1024

static inline int hp_mul_size(int64_t a, int64_t b, int64_t *r)
{
	*r = 0;
	return a < 0 || b < 0 || __builtin_mul_overflow(a, b, r);
}

static inline int hp_add_size(int64_t a, int64_t b, int64_t *r)
{
	*r = 0;
	return a < 0 || b < 0 || __builtin_add_overflow(a, b, r);
}

/* a * b * c */
static inline int hp_mul3_size(int64_t a, int64_t b, int64_t c, int64_t *r)
{
	int64_t ab;

	*r = 0;
	return hp_mul_size(a, b, &ab) || hp_mul_size(ab, c, r);
}

#endif
