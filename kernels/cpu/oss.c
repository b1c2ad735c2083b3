/*
 * oss.c - what GPT-OSS adds to a decoder layer, as transformers'
 * modeling_gpt_oss.py computes it: attention sinks, the clamped SwiGLU of
 * its experts, and the experts' biases.  Plain C, one thread; each is the
 * only implementation (no faster variant to hold to it), and
 * t/unit/test-oss.c holds each to its definition written out in double.
 *
 * Attention sinks.  HF concatenates one learned logit per head to every
 * row of scaled, masked scores, subtracts the row's max, takes the softmax
 * and drops the sink's column: the keys' probabilities shrink by the
 * sink's share and nothing is added to the output.  With the keys'
 * log-sum-exp l of a row (what the flash kernels keep), that is
 *     l' = log(exp(l) + exp(s)),   out' = out * exp(l - l'),
 * and the flash backward run with out' and l' is the backward of the whole
 * softmax: P = exp(S - l') are the sink-shrunk probabilities and
 * Di = rowsum(dO * out') = sum_j P_j dP_j.  The sink's own gradient is
 * d s = sum over rows of -p_sink * Di, p_sink = exp(s - l').
 */
#include <math.h>

#include "cpu/ops.h"

void hp_attn_sinks_fwd(float *out, float *lse, const float *sinks, int B, int T, int H, int D)
{
	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			for (int t = 0; t < T; t++) {
				float *l = lse + ((long)b * H + h) * T + t;
				float *o = out + ((long)b * T + t) * H * D + (long)h * D;
				double s = sinks[h], m = *l > s ? *l : s;
				double l2 = m + log(exp(*l - m) + exp(s - m));
				float f = (float)exp(*l - l2);

				for (int d = 0; d < D; d++)
					o[d] *= f;
				*l = (float)l2;
			}
}

void hp_attn_sinks_bwd(float *dsinks, const float *dout, const float *out, const float *lse,
		       const float *sinks, int B, int T, int H, int D)
{
	for (int h = 0; h < H; h++) {
		double acc = 0;

		for (int b = 0; b < B; b++)
			for (int t = 0; t < T; t++) {
				long r = ((long)b * T + t) * H * D + (long)h * D;
				double di = 0;

				for (int d = 0; d < D; d++)
					di += (double)dout[r + d] * out[r + d];
				acc -= exp((double)sinks[h] - lse[((long)b * H + h) * T + t]) * di;
			}
		dsinks[h] += (float)acc;
	}
}

/*
 * GptOssExperts._apply_gate: g = min(gate, limit), u = clamp(up, -limit,
 * limit), h = (u + 1) * g * sigmoid(alpha * g), in float as HF's float32
 * model.  Row r's gate at g[r * ld], its up at u[r * ld]; h is [rows, I].
 * The clamps pass the gradient where the input lies within them, ends
 * included (torch.clamp's backward).
 */
void hp_glu_clamp_fwd(float *h, const float *g, const float *u, long ld, long rows, int I, float alpha,
		      float limit)
{
	for (long r = 0; r < rows; r++)
		for (int i = 0; i < I; i++) {
			float gc = fminf(g[r * ld + i], limit), uc = fmaxf(fminf(u[r * ld + i], limit), -limit);
			float sg = 1.0f / (1.0f + expf(-alpha * gc));

			h[r * I + i] = (uc + 1.0f) * (gc * sg);
		}
}

void hp_glu_clamp_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, long ld, long rows,
		      int I, float alpha, float limit)
{
	for (long r = 0; r < rows; r++)
		for (int i = 0; i < I; i++) {
			float gv = g[r * ld + i], uv = u[r * ld + i], d = dh[r * I + i];
			float gc = fminf(gv, limit), uc = fmaxf(fminf(uv, limit), -limit);
			float sg = 1.0f / (1.0f + expf(-alpha * gc));

			dg[r * ld + i] = gv <= limit ? d * (uc + 1.0f) * (sg + gc * alpha * sg * (1.0f - sg)) : 0.0f;
			du[r * ld + i] = uv >= -limit && uv <= limit ? d * (gc * sg) : 0.0f;
		}
}

/* Expert x's rows off[x] .. off[x+1] of x (row stride ld) get bias + x * bs
 * added to their first n columns; the backward sums them into db. */
void hp_bias_grouped_fwd(float *x, long ld, const float *bias, size_t bs, const int32_t *off, int nx, int n)
{
	for (int e = 0; e < nx; e++)
		for (long r = off[e]; r < off[e + 1]; r++)
			for (int j = 0; j < n; j++)
				x[r * ld + j] += bias[(size_t)e * bs + j];
}

/* Each column summed in row order, in double; rows walked in memory order
 * for a block of columns at a time, so that a wide row is read once. */
void hp_bias_grouped_bwd(float *db, size_t bs, const float *dx, long ld, const int32_t *off, int nx, int n)
{
	enum { BLK = 256 };
	double s[BLK];

	for (int e = 0; e < nx; e++)
		for (int j0 = 0; j0 < n; j0 += BLK) {
			int nb = n - j0 < BLK ? n - j0 : BLK;

			for (int j = 0; j < nb; j++)
				s[j] = 0;
			for (long r = off[e]; r < off[e + 1]; r++)
				for (int j = 0; j < nb; j++)
					s[j] += dx[r * ld + j0 + j];
			for (int j = 0; j < nb; j++)
				db[(size_t)e * bs + j0 + j] += (float)s[j];
		}
}
