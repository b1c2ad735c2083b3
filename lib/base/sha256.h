/*
 * sha256.h - SHA-256 (FIPS 180-4), for the plan hash and checksums.
 *
 * A small, portable implementation: no hardware paths, no allocation.  It
 * is used for identities (a plan's hash, the plan a shard was made for), not
 * for bulk data, so speed is not a goal.
 */
#ifndef HP_SHA256_H
#define HP_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct hp_sha256 {
	uint32_t h[8];
	uint64_t nbytes;           /* message length so far */
	unsigned char buf[64];     /* a partial block */
	size_t nbuf;
};

void hp_sha256_init(struct hp_sha256 *c);
void hp_sha256_update(struct hp_sha256 *c, const void *data, size_t n);
/* Write the 32-byte digest; c must be re-initialised before reuse. */
void hp_sha256_final(struct hp_sha256 *c, unsigned char out[32]);

/* One call: the digest of n bytes as 64 lowercase hex digits and a NUL. */
void hp_sha256_hex(const void *data, size_t n, char out[65]);

#endif
