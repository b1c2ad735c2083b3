/*
 * embedding.c - token embedding lookup and its scatter-add gradient.
 * Ids are assumed validated by the caller (the data reader checks them
 * against the vocabulary).
 */
#include <limits.h>

#include "cpu/ops.h"

void hp_embedding_fwd(float *out, const int32_t *ids, const float *table, long N, int C)
{
	hp_embedding_fwd_range(out, ids, table, N, C, 0, INT_MAX);
}

void hp_embedding_bwd(float *dtable, const float *dout, const int32_t *ids, long N, int C, int pad)
{
	hp_embedding_bwd_range(dtable, dout, ids, N, C, 0, INT_MAX, pad);
}
