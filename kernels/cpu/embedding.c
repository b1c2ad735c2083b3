/*
 * embedding.c - token embedding lookup and its scatter-add gradient.
 * Ids are assumed validated by the caller (the data reader checks them
 * against the vocabulary).
 */
#include "cpu/ops.h"

void hp_embedding_fwd(float *out, const int32_t *ids, const float *table, long N, int C)
{
	for (long n = 0; n < N; n++)
		memcpy(out + n * C, table + (long)ids[n] * C, (size_t)C * sizeof(float));
}

void hp_embedding_bwd(float *dtable, const float *dout, const int32_t *ids, long N, int C, int pad)
{
	for (long n = 0; n < N; n++) {
		if (ids[n] == pad)
			continue;
		float *row = dtable + (long)ids[n] * C;
		const float *d = dout + n * C;
		for (int c = 0; c < C; c++)
			row[c] += d[c];
	}
}
