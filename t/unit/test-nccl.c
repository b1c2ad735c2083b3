/*
 * test-nccl.c - lib/comm/comm_nccl against lib/comm/comm: each collective on device
 * buffers must give the MPI backend's result on the same data and move the
 * counters as the MPI backend does for the same call.
 *
 * prove runs it as one process (a group of one: copies, nothing counted);
 * t/t0920-nccl.sh runs it under mpiexec -n 2, which needs a GPU per
 * process (NCCL puts one rank on a device).  The group is the world, as
 * a struct hp_comm built here; data are small integers, so that sums are
 * exact in every type.  BF16 and F16, which MPI moves but does not reduce,
 * are reduced here in F32 for the reference.  Without a GPU (or a GPU per
 * process) it skips, saying why; in a build without CUDA or NCCL it checks
 * that the stubs say what the build lacks.  Rank 0 prints one TAP line per
 * check with the verdict of all.
 */
#include <mpi.h>

#include "comm/comm.h"
#include "comm/comm_nccl.h"
#include "base/dtype.h"
#include "tap.h"
#if HP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/ops.h"
#endif

static int rank, world;

/* ok() on rank 0 with the AND of every process's cond */
static void all_ok(int cond, const char *fmt, const char *what)
{
	int mine = cond ? 1 : 0, all = 0;

	MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	if (rank == 0)
		tap_ok(all, fmt, what);
}

#if HP_HAVE_CUDA && HP_HAVE_NCCL

enum coll { AR, AG, RS, A2A, A2AV, BC, NCOLLS };
static const char *coll_name[NCOLLS] = {
	"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "all-to-allv", "broadcast"
};
static const enum hp_dtype types[] = {
	HP_DTYPE_F32, HP_DTYPE_F64, HP_DTYPE_BF16, HP_DTYPE_F16, HP_DTYPE_I32, HP_DTYPE_I64, HP_DTYPE_U8
};

/* mc: the MPI backend; xc: its F32 stand-in for 16-bit reductions; gc: the
 * NCCL group's counters.  All three share one MPI communicator. */
static struct hp_comm mc, xc, gc;
static struct hp_nccl nc;
static int cnt[64], dsp[64];   /* all-to-allv: the same counts both ways */

static void fill(void *b, enum hp_dtype t, size_t n, int salt)
{
	for (size_t i = 0; i < n; i++) {
		int v = (int)(((size_t)rank * 7 + i * 3 + (size_t)salt) % 13) - (t == HP_DTYPE_U8 ? 0 : 6);

		switch (t) {
		case HP_DTYPE_F32: ((float *)b)[i] = (float)v; break;
		case HP_DTYPE_F64: ((double *)b)[i] = v; break;
		case HP_DTYPE_BF16: ((uint16_t *)b)[i] = hp_f32_to_bf16((float)v); break;
		case HP_DTYPE_F16: ((uint16_t *)b)[i] = hp_f32_to_f16((float)v); break;
		case HP_DTYPE_I32: ((int32_t *)b)[i] = v; break;
		case HP_DTYPE_I64: ((int64_t *)b)[i] = v; break;
		default: ((uint8_t *)b)[i] = (uint8_t)v; break;
		}
	}
}

static void zero(struct hp_comm *c)
{
	memset(c->calls, 0, sizeof(c->calls));
	memset(c->bytes, 0, sizeof(c->bytes));
	memset(c->routed, 0, sizeof(c->routed));
}

/* AR and BC work in place on recv, which holds the send data. */
static int run_mpi(struct hp_comm *c, enum coll k, void *send, void *recv, size_t n, enum hp_dtype t,
		   enum hp_red red, struct hp_err *e)
{
	switch (k) {
	case AR: return hp_comm_allreduce(c, recv, n, t, red, e);
	case AG: return hp_comm_allgather(c, send, recv, n, t, e);
	case RS: return hp_comm_reduce_scatter(c, send, recv, n, t, red, e);
	case A2A: return hp_comm_alltoall(c, send, recv, n, t, e);
	case A2AV: return hp_comm_alltoallv(c, send, cnt, dsp, recv, cnt, dsp, t, 1, e);
	default: return hp_comm_bcast(c, recv, n, t, world - 1, e);
	}
}

static int run_nccl(enum coll k, void *send, void *recv, size_t n, enum hp_dtype t, enum hp_red red,
		    struct hp_err *e)
{
	switch (k) {
	case AR: return hp_nccl_allreduce(&nc, recv, n, t, red, e);
	case AG: return hp_nccl_allgather(&nc, send, recv, n, t, e);
	case RS: return hp_nccl_reduce_scatter(&nc, send, recv, n, t, red, e);
	case A2A: return hp_nccl_alltoall(&nc, send, recv, n, t, e);
	case A2AV: return hp_nccl_alltoallv(&nc, send, cnt, dsp, recv, cnt, dsp, t, 1, e);
	default: return hp_nccl_bcast(&nc, recv, n, t, world - 1, e);
	}
}

/* Collective k on t both ways: 1 when the results and counters agree. */
static int same(enum coll k, enum hp_dtype t, enum hp_red red)
{
	size_t n = 5, sz = hp_dtype_size(t), sn, rn, at = 0;
	int wide = (k == AR || k == RS) && (t == HP_DTYPE_BF16 || t == HP_DTYPE_F16);
	struct hp_comm *ref = wide ? &xc : &mc;
	void *send, *mres, *gres, *dsend = NULL, *drecv = NULL;
	float *fs = NULL, *fr = NULL;
	struct hp_err e;
	int good;

	for (int j = 0; j < world; j++) {
		cnt[j] = (rank + j) % 3 + 1;
		dsp[j] = (int)at;
		at += (size_t)cnt[j];
	}
	sn = k == AR || k == AG || k == BC ? n : k == A2AV ? at : n * (size_t)world;
	rn = k == AR || k == RS || k == BC ? n : k == A2AV ? at : n * (size_t)world;
	send = calloc(sn, sz);
	mres = calloc(rn, sz);
	gres = calloc(rn, sz);
	fill(send, t, sn, (int)k);
	if (k == AR || k == BC)
		memcpy(mres, send, sn * sz);
	hp_err_clear(&e);
	zero(&mc);
	zero(&xc);
	zero(&gc);

	/* the MPI backend's answer; 16-bit reductions by way of F32 */
	if (wide) {
		fs = calloc(sn, sizeof(float));
		fr = calloc(rn, sizeof(float));
		hp_convert_to_f32(fs, send, t, sn);
		if (k == AR)
			memcpy(fr, fs, sn * sizeof(float));
		good = !run_mpi(&xc, k, fs, fr, n, HP_DTYPE_F32, red, &e);
		hp_convert_from_f32(mres, t, fr, rn);
	} else {
		good = !run_mpi(&mc, k, send, mres, n, t, red, &e);
	}

	/* the NCCL backend's, on the device */
	good &= cudaMalloc(&dsend, sn * sz + 1) == cudaSuccess && cudaMalloc(&drecv, rn * sz + 1) == cudaSuccess &&
		cudaMemcpy(dsend, send, sn * sz, cudaMemcpyHostToDevice) == cudaSuccess &&
		cudaMemset(drecv, 0xa5, rn * sz) == cudaSuccess;
	if (good && (k == AR || k == BC))
		good = cudaMemcpy(drecv, send, sn * sz, cudaMemcpyHostToDevice) == cudaSuccess;
	good = good && !run_nccl(k, dsend, drecv, n, t, red, &e) && !hp_nccl_sync(&nc, &e) &&
	       cudaMemcpy(gres, drecv, rn * sz, cudaMemcpyDeviceToHost) == cudaSuccess &&
	       !memcmp(gres, mres, rn * sz);
	/* the same counts; the F32 stand-in sent twice the bytes */
	for (int o = 0; o < HP_NCOLL; o++)
		good &= gc.calls[o] == ref->calls[o] && gc.bytes[o] * (wide ? 2 : 1) == ref->bytes[o] &&
			gc.routed[o] * (wide ? 2 : 1) == ref->routed[o];
	if (!good)
		fprintf(stderr, "test-nccl: rank %d: %s of %s (op %d) differs%s%s\n", rank, coll_name[k],
			hp_dtype_name(t), (int)red, e.msg[0] ? ": " : "", e.msg);
	cudaFree(dsend);
	cudaFree(drecv);
	free(send); free(mres); free(gres); free(fs); free(fr);
	return good;
}

static void check_all(void)
{
	struct hp_err e;
	int good;

	hp_err_clear(&e);
	good = !hp_nccl_init(&nc, &gc, &e);
	if (!good)
		fprintf(stderr, "test-nccl: rank %d: %s\n", rank, e.msg);
	all_ok(good, "%s: an NCCL communicator over the MPI group, its id broadcast over MPI",
	       world > 1 ? "2+ ranks" : "1 rank");
	if (!good)
		return;
	for (int k = 0; k < NCOLLS; k++) {
		int reduces = k == AR || k == RS;

		good = 1;
		for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
			for (int red = HP_RED_SUM; red <= (reduces ? HP_RED_MIN : HP_RED_SUM); red++)
				good &= same((enum coll)k, types[i], (enum hp_red)red);
		all_ok(good, "%s of F32 F64 BF16 F16 I32 I64 U8 on the device equals the MPI backend's, "
		       "counted alike", coll_name[k]);
	}
	good = hp_nccl_allreduce(&nc, NULL, 1, HP_DTYPE_I16, HP_RED_SUM, &e) == HP_EINVAL &&
	       strstr(e.msg, "I16") && gc.calls[HP_COLL_ALL_REDUCE] == 0;
	all_ok(good, "%s: a type NCCL does not carry is HP_EINVAL, counting nothing", "all-reduce");
	hp_nccl_free(&nc);
	hp_nccl_free(&nc);
}

/* 0 to go on (on the device of the process's rank on its host), or 1
 * after rank 0 printed why this run skips. */
static int pick_device(void)
{
	MPI_Comm host;
	int local, nlocal, ndev = hp_cuda_device_count(), fewest, need;

	MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
	MPI_Comm_rank(host, &local);
	MPI_Comm_size(host, &nlocal);
	MPI_Comm_free(&host);
	MPI_Allreduce(&ndev, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	MPI_Allreduce(&nlocal, &need, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (fewest == 0) {
		if (rank == 0)
			printf("1..0 # skip no CUDA device\n");
		return 1;
	}
	if (fewest < need) {
		if (rank == 0)
			printf("1..0 # skip %d processes on a host with %d CUDA devices (NCCL wants a device per rank)\n",
			       need, fewest);
		return 1;
	}
	all_ok(cudaSetDevice(local) == cudaSuccess, "%s: each process on a device of its own", "cudaSetDevice");
	return 0;
}

#endif

int main(int argc, char **argv)
{
	int rc = 0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
#if HP_HAVE_CUDA && HP_HAVE_NCCL
	if (world > 64) {
		if (rank == 0)
			printf("1..0 # skip test-nccl runs with at most 64 processes\n");
		MPI_Finalize();
		return 0;
	}
	if (pick_device()) {
		MPI_Finalize();
		return 0;
	}
	if (rank == 0) {
		char name[128];
		struct hp_err e;

		if (hp_cuda_device_name(0, name, sizeof(name), &e) == 0)
			tap_diag("device 0: %s", name);
	}
	mc.dim = HP_COMM_WORLD;
	mc.rank = rank;
	mc.size = world;
	mc.comm = MPI_COMM_NULL;
	if (world > 1)
		MPI_Comm_dup(MPI_COMM_WORLD, &mc.comm);
	xc = gc = mc;
	check_all();
	if (mc.comm != MPI_COMM_NULL)
		MPI_Comm_free(&mc.comm);
#else
#if HP_HAVE_CUDA
#define LACKS "a build without NCCL"
#else
#define LACKS "a build without CUDA"
#endif
	{
		struct hp_comm c = { .comm = MPI_COMM_NULL, .dim = HP_COMM_WORLD, .rank = 0, .size = 1 };
		struct hp_nccl n;
		struct hp_err e;

		hp_err_clear(&e);
		all_ok(hp_nccl_init(&n, &c, &e) == HP_EUNSUP && strstr(e.msg, "built without") &&
		       hp_nccl_allreduce(&n, NULL, 1, HP_DTYPE_F32, HP_RED_SUM, &e) == HP_EUNSUP,
		       "%s: every call is HP_EUNSUP, saying what the build lacks", LACKS);
		hp_nccl_free(&n);
	}
#endif
	rc = rank == 0 ? tap_done() : 0;
	MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
	MPI_Finalize();
	return rc;
}
