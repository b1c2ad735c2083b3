/*
 * fuzz-indexed.c - libFuzzer target for the Megatron MMIDIDX reader.
 *
 * Input: a 2-byte little-endian .bin length L, then the .idx bytes; the
 * .bin is L bytes of a fixed pattern.  Both are written to a private
 * temporary directory (the reader maps files) and opened with
 * hp_indexed_open; when the pair is accepted, every sequence is read back.
 * Findings are crashes, sanitizer reports and broken promises of
 * indexed.h: failures are HP_EFORMAT/HP_EIO/HP_EUNSUP with a one-line
 * message, and an accepted index never points outside its .bin.  The seed
 * corpus is fuzz/corpus/indexed/.
 */
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include "format/indexed.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char prefix[256];

static int put(const char *suffix, const void *p, size_t n)
{
	char path[300];
	FILE *f;

	snprintf(path, sizeof(path), "%s%s", prefix, suffix);
	if (!(f = fopen(path, "wb")))
		return -1;
	if (n && fwrite(p, 1, n, f) != n) {
		fclose(f);
		return -1;
	}
	return fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static unsigned char bin[65536];
	static int32_t ids[65536];
	struct hp_indexed d;
	struct hp_err e;
	int rc;

	if (!prefix[0]) {
		char dir[] = "/tmp/hp-fuzz-idx.XXXXXX";
		if (!mkdtemp(dir))
			return 0;
		snprintf(prefix, sizeof(prefix), "%s/d", dir);
		for (size_t i = 0; i < sizeof(bin); i++)
			bin[i] = (unsigned char)(i * 7);
	}
	if (size < 2)
		return 0;
	size_t L = (size_t)data[0] | (size_t)data[1] << 8;
	if (put(".bin", bin, L) || put(".idx", data + 2, size - 2))
		return 0;
	hp_err_clear(&e);
	memset(&d, 0, sizeof(d));
	rc = hp_indexed_open(&d, prefix, &e);
	if (rc) {
		if ((rc != HP_EFORMAT && rc != HP_EIO && rc != HP_EUNSUP) || strchr(e.msg, '\n'))
			__builtin_trap();
		hp_indexed_close(&d);
		return 0;
	}
	for (uint64_t i = 0; i < d.nseq; i++) {
		long n = hp_indexed_read(&d, i, ids, sizeof(ids) / sizeof(ids[0]), &e);
		if (n < 0 && n != HP_EFORMAT && n != HP_EINVAL)
			__builtin_trap();
	}
	hp_indexed_close(&d);
	return 0;
}
