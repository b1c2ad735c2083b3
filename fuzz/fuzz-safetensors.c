/*
 * fuzz-safetensors.c - libFuzzer target for the safetensors header parser.
 *
 * The input is a whole file: an 8-byte little-endian header length N, N
 * bytes of header, then the data section.  Inputs too short to hold the
 * length, or whose N runs past the end, are what hp_st_open rejects before
 * parsing (tested in t/unit/test-safetensors.c), so they are skipped here
 * and every run reaches hp_st_parse_header.  Crashes, sanitizer reports and
 * leaks are the findings; the parser's verdict is not checked.
 *
 * What this is not: a test of the mmap path or of model folders (index
 * files go through jansson the same way; their cross-checks are covered by
 * the unit test).  Build with `make fuzz`; the seed corpus is in
 * fuzz/corpus/safetensors/ and t/t0110-safetensors-fuzz.sh runs it.
 */
#include <stddef.h>
#include <stdint.h>

#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What safetensors.h promises of a parsed header; a breach is a finding. */
static void check_invariants(const struct hp_st_file *f, uint64_t data_len)
{
	uint64_t covered = 0;

	for (size_t i = 0; i < f->ntensors; i++)
		covered += f->tensors[i].nbytes;
	if (covered != data_len)
		__builtin_trap();                   /* the tensors tile the data section, as HF's reader asks */
	for (size_t i = 0; i < f->ntensors; i++) {
		const struct hp_st_tensor *t = &f->tensors[i];

		if (hp_st_find(f, t->name) != t)
			__builtin_trap();           /* not sorted, or a duplicate name */
		if (t->begin > t->end || t->end > data_len || t->nbytes != t->end - t->begin ||
		    t->nbytes != (uint64_t)t->numel * hp_dtype_size(t->dtype) || t->data)
			__builtin_trap();
	}
	for (size_t i = 0; i < f->nmeta; i++)
		if (hp_st_meta(f, f->meta_keys[i]) == NULL)
			__builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct hp_st_file f;
	struct hp_err e;
	uint64_t n = 0;

	if (size < 8)
		return 0;
	for (int i = 7; i >= 0; i--)
		n = (n << 8) | data[i];
	if (n > size - 8)
		return 0;
	memset(&f, 0, sizeof(f));
	hp_err_clear(&e);
	if (!hp_st_parse_header(&f, "fuzz", (const char *)data + 8, (size_t)n, size - 8 - n, &e))
		check_invariants(&f, size - 8 - n);
	else if (strncmp(e.msg, "'fuzz': ", 8) || strchr(e.msg, '\n') || f.tensors || f.nmeta)
		__builtin_trap();           /* a message must name the input, on one line */
	hp_st_close(&f);
	return 0;
}
