/*
 * test-comm.c - lib/comm under any number of MPI processes (prove runs it
 * as one; t/t0900-comm.sh runs it under mpiexec -n 4 and -n 8).
 *
 * For the plan of the process count (1: one rank; 4: tp 2 x dp_shard 2; 8:
 * the seed's TP2 x CP2 x EP2 with dp_shard 2 and edp_shard 2 on the MoE
 * fixture), every mesh dim's communicator must hold exactly the ranks of
 * hp_mesh_group, and each collective must give the values computed here
 * from the group lists, and count the bytes hp-plan(5) says it sends.
 * Each process checks; rank 0 prints one TAP line per check with the
 * verdict of all.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "base/dtype.h"
#include "comm/comm.h"
#include "config/config.h"
#include "config/hfconfig.h"
#include "plan/plan.h"
#include "tap.h"

static int rank, world;

/* ok() on rank 0 with the AND of every process's cond */
static void all_ok(int cond, const char *fmt, const char *dim)
{
	int mine = cond ? 1 : 0, all = 0;

	MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	if (rank == 0)
		tap_ok(all, fmt, dim);
}

static struct hp_plan *plan_for(int n)
{
	const char *src = getenv("HP_SRC_DIR");
	const char *acc = n == 8 ? "accelerator: {tp_size: 2, cp_size: 2, ep_size: 2, sequence_parallel: true}\n"
				   "fsdp_config: {dp_shard_size: 2, edp_shard_size: 2}\n" :
			  n == 4 ? "accelerator: {tp_size: 2, sequence_parallel: true}\nfsdp_config: {dp_shard_size: 2}\n" : "";
	char dir[4200], y[8192];
	struct hp_config c;
	struct hp_model_spec s;
	struct hp_plan *p = NULL;
	struct hp_err e;

	snprintf(dir, sizeof(dir), "%s/data/ref/qwen3-moe-a", src ? src : ".");
	snprintf(y, sizeof(y),
		 "model: {_target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained,\n"
		 "        pretrained_model_name_or_path: %s}\n"
		 "training: {train_iters: 1, global_batch_size: %d}\n"
		 "dataset: {_target_: hyper_parallel.data.build_online_text_dataset, data_path: x,\n"
		 "          data_config: {seq_length: 64}}\n%s", dir, 8 * n, acc);
	hp_err_clear(&e);
	if (hp_config_load_buf(&c, "comm.yaml", y, strlen(y), 0, NULL, &e) || hp_hfconfig_load(&s, dir, &e) ||
	    hp_plan_resolve(&p, &c, &s, n, &e))
		fprintf(stderr, "test-comm: %s\n", e.msg);
	hp_config_release(&c);
	return p;
}

static void check_dim(struct hp_comms *cs, const struct hp_plan *p, int d)
{
	struct hp_comm *c = &cs->dim[d];
	const char *name = hp_comm_dim_name(d);
	int g[64], n, me, good;
	struct hp_err e;

	if (d == HP_COMM_WORLD) {
		n = world;
		for (int i = 0; i < n; i++)
			g[i] = i;
	} else {
		n = hp_mesh_group(p->size, (enum hp_dim)d, rank, g);
	}
	for (me = 0; me < n && g[me] != rank; me++)
		;
	hp_err_clear(&e);
	hp_comms_reset(cs);
	/* the communicator is the group, in coordinate order */
	good = c->size == n && c->rank == me;
	if (n > 1) {
		int wr, sz;

		MPI_Comm_size(c->comm, &sz);
		MPI_Comm_rank(c->comm, &wr);
		good &= sz == n && wr == me;
	}
	all_ok(good, "%s: the communicator is the plan's group, in coordinate order", name);

	/* all-reduce: sum and max of (world rank + 1) over the group */
	float v[3] = { (float)rank + 1, 2.0f * rank, -1.0f * rank };
	double sum = 0;
	int mx = 0;
	for (int i = 0; i < n; i++) {
		sum += g[i] + 1;
		mx = g[i] > mx ? g[i] : mx;
	}
	good = !hp_comm_allreduce(c, v, 3, HP_DTYPE_F32, HP_RED_SUM, &e) && v[0] == (float)sum;
	int32_t iv = rank;
	good &= !hp_comm_allreduce(c, &iv, 1, HP_DTYPE_I32, HP_RED_MAX, &e) && iv == mx;
	good &= c->calls[HP_COLL_ALL_REDUCE] == (n > 1 ? 2 : 0) &&
		c->bytes[HP_COLL_ALL_REDUCE] == (n > 1 ? 12 + 4 : 0);
	all_ok(good, "%s: all-reduce sums and maxes over the group and counts 16 bytes", name);

	/* all-gather: two values per rank, in group order */
	float mine[2] = { (float)rank, 10.0f * rank }, got[128];
	good = !hp_comm_allgather(c, mine, got, 2, HP_DTYPE_F32, &e);
	for (int i = 0; i < n; i++)
		good &= got[2 * i] == (float)g[i] && got[2 * i + 1] == 10.0f * g[i];
	good &= c->bytes[HP_COLL_ALL_GATHER] == (n > 1 ? 8 : 0);
	/* bf16 words travel untouched */
	uint16_t hw = (uint16_t)(0x3f80 + rank), hg[64];
	good &= !hp_comm_allgather(c, &hw, hg, 1, HP_DTYPE_BF16, &e);
	for (int i = 0; i < n; i++)
		good &= hg[i] == 0x3f80 + g[i];
	all_ok(good, "%s: all-gather (F32 and BF16) in group order, counting the rank's piece", name);

	/* reduce-scatter: block j of rank r is 100 r + j; this rank gets sum over r of 100 r + me */
	float rs[64], out[2];
	for (int j = 0; j < n; j++)
		rs[2 * j] = rs[2 * j + 1] = 100.0f * rank + j;
	double want = 0;
	for (int i = 0; i < n; i++)
		want += 100.0 * g[i] + me;
	good = !hp_comm_reduce_scatter(c, rs, out, 2, HP_DTYPE_F32, HP_RED_SUM, &e) &&
	       out[0] == (float)want && out[1] == (float)want &&
	       c->bytes[HP_COLL_REDUCE_SCATTER] == (n > 1 ? 8 * n : 0);
	all_ok(good, "%s: reduce-scatter gives each rank its block's sum, counting the whole input", name);

	/* all-to-all: block j of rank r is 1000 r + j; block i received is 1000 g[i] + me */
	int32_t a2a[64], back[64];
	for (int j = 0; j < n; j++)
		a2a[j] = 1000 * rank + j;
	good = !hp_comm_alltoall(c, a2a, back, 1, HP_DTYPE_I32, &e);
	for (int i = 0; i < n; i++)
		good &= back[i] == 1000 * g[i] + me;
	good &= c->bytes[HP_COLL_ALL_TO_ALL] == (n > 1 ? 4 * n : 0);
	all_ok(good, "%s: all-to-all exchanges blocks by group rank", name);

	/* all-to-allv: rank i sends (i + j) % 3 + 1 values 10000 i + 100 j + k to j */
	int sc[64], sd[64], rc[64], rd[64], at = 0, bt = 0;
	int32_t sv[256], rv[256];
	for (int j = 0; j < n; j++) {
		sc[j] = (me + j) % 3 + 1;
		sd[j] = at;
		for (int k = 0; k < sc[j]; k++)
			sv[at++] = 10000 * rank + 100 * j + k;
		rc[j] = (j + me) % 3 + 1;
		rd[j] = bt;
		bt += rc[j];
	}
	good = !hp_comm_alltoallv(c, sv, sc, sd, rv, rc, rd, HP_DTYPE_I32, 1, &e);
	for (int i = 0; i < n; i++)
		for (int k = 0; k < rc[i]; k++)
			good &= rv[rd[i] + k] == 10000 * g[i] + 100 * me + k;
	good &= c->bytes[HP_COLL_ALL_TO_ALLV] == (n > 1 ? 4 * at : 0) &&
		c->routed[HP_COLL_ALL_TO_ALLV] == c->bytes[HP_COLL_ALL_TO_ALLV];
	all_ok(good, "%s: all-to-allv with uneven counts, its bytes marked routed", name);
}

/* The MPICH trap (DESIGN.md §7): a 1 MiB all-reduce with the yielding wait
 * against the blocking call; a diag, not a test (timings are noisy). */
static void trap_diag(struct hp_comms *cs)
{
	size_t n = 1 << 18;
	float *b = calloc(n, sizeof(float));
	double t0, t1, t2;
	struct hp_err e;

	if (!b || world < 2) {
		free(b);
		return;
	}
	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	for (int i = 0; i < 10; i++)
		hp_comm_allreduce(&cs->dim[HP_COMM_WORLD], b, n, HP_DTYPE_F32, HP_RED_SUM, &e);
	t1 = MPI_Wtime();
	for (int i = 0; i < 10; i++)
		MPI_Allreduce(MPI_IN_PLACE, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	t2 = MPI_Wtime();
	if (rank == 0)
		tap_diag("1 MiB all-reduce over %d ranks: %.1f ms yielding, %.1f ms blocking MPI_Allreduce",
			 world, (t1 - t0) * 100, (t2 - t1) * 100);
	free(b);
}

/* rank r's element i of a bf16 sum's input: bf16 values of magnitudes
 * 2^-8 .. 2^24, either sign, so that fp32 partial sums lose bits and only
 * the rule's order (rank 0, 1, ...) gives its bits; element 0 is 2^25, 1,
 * -2^25 (then 0) over the ranks: 0 in rank order, 1 in others */
static float sum_in(int r, size_t i)
{
	uint64_t x = 0x9e3779b97f4a7c15ull * (i + 1) ^ (uint64_t)(r + 1) * 0xbf58476d1ce4e5b9ull;

	if (i == 0)
		return r == 0 ? 33554432.0f : r == 1 ? 1.0f : r == 2 ? -33554432.0f : 0.0f;
	x ^= x >> 31, x *= 0x94d049bb133111ebull, x ^= x >> 29;
	return hp_bf16_to_f32(hp_f32_to_bf16(ldexpf((float)(x % 255) / 128.0f - 1.0f, (int)(x >> 40) % 33 - 8)));
}

/*
 * The emulated CUDA backend's collectives over the world (bf16 mode: its
 * bf16 values are bf16's): a bf16 reduce-scatter and all-reduce give
 * hp_bf16_sum_ranks's bits (one rule on every path, backend.h); the bytes
 * count as the one collective; a started reduce-scatter's result is not
 * there before wait (NaN), and a write to its send buffer in flight is an
 * error at wait (what would race with NCCL on a GPU).
 */
static void check_backend(struct hp_comms *cs)
{
	struct hp_comm *c = &cs->dim[HP_COMM_WORLD];
	struct hp_backend *b = NULL;
	struct hp_err e;
	size_t n = 1001, k = (size_t)world, es;
	int rc, good = 1;

	hp_err_clear(&e);
	if (hp_backend_cuda_open(&b, 0, 1, HP_EMULATE_BF16, &e)) {
		all_ok(0, "%s: the emulated CUDA backend opens", "world");
		return;
	}
	es = b->esize(b, HP_DTYPE_BF16);
	float *h = malloc(2 * k * n * sizeof(float)), *want = malloc(n * sizeof(float));
	uint16_t *in = malloc(k * n * 2), *sum = malloc(n * 2);
	void *send = b->alloc(b, k * n * es, &e), *recv = b->alloc(b, 2 * k * n * es + 64, &e);
	int64_t before = c->bytes[HP_COLL_REDUCE_SCATTER], arb = c->bytes[HP_COLL_ALL_REDUCE];

	/* reduce-scatter: block j of rank r is r's elements j n .. */
	for (size_t j = 0; j < k; j++)
		for (size_t i = 0; i < n; i++)
			h[j * n + i] = sum_in(rank, j * n + i);
	for (size_t r = 0; r < k; r++)
		for (size_t i = 0; i < n; i++)
			in[r * n + i] = hp_f32_to_bf16(sum_in((int)r, (size_t)rank * n + i));
	hp_bf16_sum_ranks(sum, in, (int)k, n, n);
	for (size_t i = 0; i < n; i++)
		want[i] = hp_bf16_to_f32(sum[i]);
	b->upload(b, send, h, k * n * es, &e);
	rc = b->reduce_scatter(b, c, send, recv, n, HP_DTYPE_BF16, HP_RED_SUM, &e);
	b->download(b, h, recv, n * es, &e);
	good = !rc && !memcmp(h, want, n * sizeof(float));
	all_ok(good, "%s: a bf16 reduce-scatter on the emulated device gives hp_bf16_sum_ranks's bits", "world");
	all_ok(c->bytes[HP_COLL_REDUCE_SCATTER] - before == (int64_t)(k * n * 2),
	       "%s: and counts k n bf16 bytes as one reduce-scatter", "world");

	/* all-reduce: every rank's n elements (buffer 2 k ceil(n / k)) */
	for (size_t i = 0; i < n; i++)
		h[i] = sum_in(rank, i);
	for (size_t r = 0; r < k; r++)
		for (size_t i = 0; i < n; i++)
			in[r * n + i] = hp_f32_to_bf16(sum_in((int)r, i));
	hp_bf16_sum_ranks(sum, in, (int)k, n, n);
	for (size_t i = 0; i < n; i++)
		want[i] = hp_bf16_to_f32(sum[i]);
	b->upload(b, recv, h, n * es, &e);
	rc = b->allreduce(b, c, recv, n, HP_DTYPE_BF16, HP_RED_SUM, &e);
	b->download(b, h, recv, n * es, &e);
	good = !rc && !memcmp(h, want, n * sizeof(float));
	all_ok(good, "%s: a bf16 all-reduce on the emulated device gives hp_bf16_sum_ranks's bits", "world");
	all_ok(c->bytes[HP_COLL_ALL_REDUCE] - arb == (int64_t)(n * 2) &&
	       c->bytes[HP_COLL_REDUCE_SCATTER] - before == (int64_t)(k * n * 2),
	       "%s: and counts n bf16 bytes as one all-reduce", "world");

	/* started: nothing before wait; a write in flight is an error */
	struct hp_breq r;
	memset(&r, 0, sizeof(r));
	rc = b->ireduce_scatter(b, c, send, recv, n, HP_DTYPE_F32, HP_RED_SUM, &r, &e);
	b->download(b, h, recv, n * sizeof(float), &e);
	good = !rc && isnan(h[0]) && isnan(h[n - 1]);
	rc = b->wait(b, &r, &e);
	b->download(b, h, recv, n * sizeof(float), &e);
	all_ok(good && !rc && !isnan(h[0]), "%s: a started reduce-scatter's result is NaN until wait", "world");
	rc = b->ireduce_scatter(b, c, send, recv, n, HP_DTYPE_F32, HP_RED_SUM, &r, &e);
	float seven = 7.0f;   /* element 0 of no rank's block 0 */
	b->upload(b, send, &seven, sizeof(seven), &e);
	hp_err_clear(&e);
	rc = rc ? rc : b->wait(b, &r, &e);
	all_ok(rc && strstr(e.msg, "was written while the collective was in flight"),
	       "%s: a write to a started reduce-scatter's send buffer is an error at wait", "world");
	b->req_free(b, &r);
	b->free(b, send);
	b->free(b, recv);
	free(h), free(want), free(in), free(sum);
	b->close(b);
}

int main(int argc, char **argv)
{
	struct hp_comms cs;
	struct hp_plan *p;
	struct hp_err e;
	int bad, rc;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	if (world != 1 && world != 4 && world != 8) {
		if (rank == 0)
			printf("1..0 # skip test-comm runs with 1, 4 or 8 processes\n");
		MPI_Finalize();
		return 0;
	}
	p = plan_for(world);
	hp_err_clear(&e);
	bad = !p || hp_comms_init(&cs, MPI_COMM_WORLD, p->size, &e);
	all_ok(!bad, "%s: communicators split from the plan", world == 8 ? "seed layout" : "layout");
	if (!bad) {
		for (int d = 0; d <= HP_NDIM; d++)
			check_dim(&cs, p, d);
		trap_diag(&cs);
		if (world > 1)
			check_backend(&cs);
		hp_comms_free(&cs);
	}
	hp_plan_free(p);
	rc = rank == 0 ? tap_done() : 0;
	MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
	MPI_Finalize();
	return rc;
}
