/*
 * arena.c - bump allocation (see arena.h).
 */
#include <stdint.h>

#include "base/alloc.h"
#include "base/arena.h"
#include "base/err.h"

void hp_arena_init(struct hp_arena *a)
{
	a->base = NULL;
	a->cap = 0;
	a->used = 0;
}

int hp_arena_alloc(struct hp_arena *a, size_t cap)
{
	a->base = hp_zalloc_aligned(cap);
	if (!a->base)
		return HP_ENOMEM;
	a->cap = cap;
	a->used = 0;
	return 0;
}

void hp_arena_reset(struct hp_arena *a)
{
	a->used = 0;
}

void *hp_arena_take(struct hp_arena *a, size_t n)
{
	size_t off;

	/* a count past SIZE_MAX sticks there: no size can be taken from it */
	if (a->used > SIZE_MAX - 63 || n > SIZE_MAX - ((a->used + 63) & ~(size_t)63)) {
		a->used = SIZE_MAX;
		return NULL;
	}
	off = (a->used + 63) & ~(size_t)63;
	a->used = off + n;
	if (!a->base || a->used > a->cap)
		return NULL;
	return a->base + off;
}

void hp_arena_release(struct hp_arena *a)
{
	hp_free_aligned(a->base);
	hp_arena_init(a);
}
