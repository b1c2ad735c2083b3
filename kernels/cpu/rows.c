/*
 * rows.c - the model's bookkeeping between kernels, on the host: the
 * vocabulary-parallel embedding, rows gathered and scattered by an index
 * (HF's index_select for the experts' rows, and expert parallelism's
 * regrouping), the MoE block's weighted combine and its backward, residual
 * adds and bias sums.  The CPU backend runs them, and the CUDA backend's
 * host emulation (lib/backend/cuda_emu.c) runs the same ones, so the emulated GPU
 * adds what the CPU adds in the order the CPU adds it.
 */
#include "cpu/ops.h"
#include "cpu/pool.h"

void hp_embedding_fwd_range(float *out, const int32_t *ids, const float *table, long N, int C, int v0, int V)
{
	for (long n = 0; n < N; n++) {
		int t = ids[n] - v0;

		if (t >= 0 && t < V)
			memcpy(out + n * C, table + (long)t * C, (size_t)C * sizeof(float));
		else
			memset(out + n * C, 0, (size_t)C * sizeof(float));
	}
}

void hp_embedding_bwd_range(float *dtable, const float *dout, const int32_t *ids, long N, int C, int v0, int V,
			    int pad)
{
	for (long n = 0; n < N; n++) {
		int t = ids[n] - v0;

		if (t < 0 || t >= V || ids[n] == pad)   /* padding_idx: no gradient */
			continue;
		float *row = dtable + (long)t * C;
		const float *d = dout + n * C;
		for (int c = 0; c < C; c++)
			row[c] += d[c];
	}
}

void hp_rows_gather(float *dst, const float *src, const int32_t *idx, long R, int C)
{
	for (long r = 0; r < R; r++)
		memcpy(dst + r * C, src + (long)idx[r] * C, sizeof(float) * (size_t)C);
}

void hp_rows_scatter(float *dst, const float *src, const int32_t *idx, long R, int C)
{
	for (long r = 0; r < R; r++)
		memcpy(dst + (long)idx[r] * C, src + r * C, sizeof(float) * (size_t)C);
}

void hp_heads_bcast(float *dst, int ldd, const float *src, int lds, long N, int H, int w)
{
	for (long n = 0; n < N; n++)
		for (int h = 0; h < H; h++)
			memcpy(dst + (n * H + h) * ldd, src + n * lds, sizeof(float) * (size_t)w);
}

void hp_heads_sum(float *dst, int ldd, const float *src, int lds, long N, int H, int w)
{
	for (long n = 0; n < N; n++) {
		float *d = dst + n * ldd;

		memcpy(d, src + n * H * lds, sizeof(float) * (size_t)w);
		for (int h = 1; h < H; h++) {
			const float *x = src + (n * H + h) * lds;

			for (int i = 0; i < w; i++)
				d[i] += x[i];
		}
	}
}

void hp_moe_combine(float *out, const float *ye, const float *wsel, const int32_t *row_tok,
		    const int32_t *row_slot, long N, int K, int C)
{
	memset(out, 0, sizeof(float) * (size_t)N * C);
	for (long r = 0; r < N * K; r++) {
		long t = row_tok[r];
		float wt = wsel[t * K + row_slot[r]];
		const float *y = ye + r * C;
		float *o = out + t * C;
		for (int c = 0; c < C; c++)
			o[c] += y[c] * wt;
	}
}

void hp_moe_combine_bwd(float *dye, float *dwsel, const float *dout, const float *ye, const float *wsel,
			const int32_t *row_tok, const int32_t *row_slot, long R, int K, int C)
{
	for (long r = 0; r < R; r++) {
		long t = row_tok[r];
		int k = row_slot[r];
		float wt = wsel[t * K + k];
		const float *d = dout + t * C, *y = ye + r * C;
		float *dy = dye + r * C;
		double dot = 0;
		for (int c = 0; c < C; c++) {
			dy[c] = d[c] * wt;
			dot += (double)d[c] * y[c];
		}
		dwsel[t * K + k] = (float)dot;
	}
}

void hp_moe_scatter_add(float *dx, const float *dxe, const int32_t *row_tok, long R, int C)
{
	for (long r = 0; r < R; r++) {
		float *d = dx + (long)row_tok[r] * C;
		const float *x = dxe + r * C;
		for (int c = 0; c < C; c++)
			d[c] += x[c];
	}
}

/* The element-wise passes below run over the pool's threads (pool.h):
 * each element is computed alone, so any split gives the same bits.  At
 * two threads they were single-threaded time in every step (the residual
 * adds; the gradient clip's scale over all the parameters). */
struct ew_args { float *x; const float *a, *b; float s; };

static void add_range(void *p, long i0, long i1)
{
	const struct ew_args *e = p;

	for (long i = i0; i < i1; i++)
		e->x[i] = e->a[i] + e->b[i];
}

void hp_residual_add(float *x, const float *a, const float *b, long n)
{
	struct ew_args e = { .x = x, .a = a, .b = b };

	hp_parallel_for(n, HP_POOL_GRAIN, 16, add_range, &e);
}

static void scale_range(void *p, long i0, long i1)
{
	const struct ew_args *e = p;

	for (long i = i0; i < i1; i++)
		e->x[i] *= e->s;
}

void hp_scale(float *x, float s, long n)
{
	struct ew_args e = { .x = x, .s = s };

	hp_parallel_for(n, HP_POOL_GRAIN, 16, scale_range, &e);
}

void hp_bias_add(float *x, const float *bias, long N, int C)
{
	for (long n = 0; n < N; n++)
		for (int c = 0; c < C; c++)
			x[n * C + c] += bias[c];
}

void hp_bias_grad(float *db, const float *x, long N, int C)
{
	for (long n = 0; n < N; n++)
		for (int c = 0; c < C; c++)
			db[c] += x[n * C + c];
}

void hp_max_into(float *x, const float *y, long n)
{
	for (long i = 0; i < n; i++)
		if (y[i] > x[i])
			x[i] = y[i];
}

void hp_add_into_f64(double *x, const double *y, long n)
{
	for (long i = 0; i < n; i++)
		x[i] += y[i];
}
