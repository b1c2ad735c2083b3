/*
 * crc32c.h - CRC-32C (Castagnoli), the checksum of iSCSI, ext4 and SCTP.
 *
 * Reflected polynomial 0x82F63B78, initial value ~0, final xor ~0, so that
 * "123456789" gives 0xE3069283.  It is for bulk data (shards, checkpoints),
 * where SHA-256 would be the bottleneck; it detects corruption, it does not
 * resist tampering.  No allocation, no errors, safe from any thread.
 */
#ifndef HP_CRC32C_H
#define HP_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/*
 * The CRC-32C of n bytes at buf, continuing from crc: pass 0 to start, and
 * the previous result to go on, so that
 *   hp_crc32c(hp_crc32c(0, a, na), b, nb) == hp_crc32c(0, ab, na + nb).
 * Uses the SSE4.2 crc32 instruction when the CPU has it, else a table.
 */
uint32_t hp_crc32c(uint32_t crc, const void *buf, size_t n);

/* The portable path, for tests: the same result as hp_crc32c, from a table. */
uint32_t hp_crc32c_sw(uint32_t crc, const void *buf, size_t n);

/* Which path hp_crc32c takes on this machine: "sse4.2" or "table". */
const char *hp_crc32c_impl(void);

#endif
