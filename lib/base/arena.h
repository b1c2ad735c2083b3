/*
 * arena.h - one allocation per lifetime, handed out as aligned slices.
 *
 * Weights, gradients, optimizer state and activations each live in one
 * arena sized up front (plan the sizes with a NULL-base dry run: call
 * hp_arena_take on an arena with base == NULL to count bytes, then
 * hp_arena_alloc to reserve exactly that much and take again).  There is no
 * per-slice free: release the arena.  Slices are 64-byte aligned.
 */
#ifndef HP_ARENA_H
#define HP_ARENA_H

#include <stddef.h>

struct hp_arena {
	unsigned char *base;   /* owned; NULL while measuring */
	size_t cap;            /* bytes reserved */
	size_t used;           /* bytes handed out (or counted) */
};

/* An empty, measuring arena. */
void hp_arena_init(struct hp_arena *a);
/* Reserve cap bytes (zeroed); returns 0 or HP_ENOMEM. */
int hp_arena_alloc(struct hp_arena *a, size_t cap);
/* Rewind without freeing. */
void hp_arena_reset(struct hp_arena *a);
/* A slice of n bytes: NULL while measuring (base NULL) or when full.  A
 * count that would pass SIZE_MAX stays at SIZE_MAX (used is then not a
 * size: the sizes that led there overflow). */
void *hp_arena_take(struct hp_arena *a, size_t n);
void hp_arena_release(struct hp_arena *a);

#endif
