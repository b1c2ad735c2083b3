/*
 * backend_cuda.c - the CUDA backend (backend.h) over the kernels of
 * kernels/cuda/ops.h.
 *
 * Compiled twice: here, against the GPU's kernels (in a CUDA build only),
 * and by backend_cuda_emu.c with HP_CUDA_EMU, against their host
 * emulation (lib/backend/cuda_emu.c, every build), so that what this file adds to
 * the kernels runs in CI: the bf16 operands the tensor cores read, made
 * from fp32 activations into scratch that grows to the largest call; the
 * bf16 working copy of the weights (up to four registered regions, one
 * per model); the deterministic embedding backward's grouping; context
 * parallel attention as flash attention over a row prefix; the host
 * sums of the cross-entropy; and the collectives, through NCCL (the
 * streams ordered by events) or host-staged over MPI.
 *
 * Host-staged collectives: the device buffer comes to a host staging
 * buffer, MPI carries it (lib/comm/comm.c, so every call is counted there as
 * on the CPU), and the result goes back.  This path serves device buffers
 * where NCCL cannot: ranks that share a GPU, builds without NCCL, the
 * emulation.  bf16 sums follow one rule on both paths (backend.h): the
 * ranks' values travel as they are (an all-to-all or all-gather) and are
 * added up in fp32 in rank order and rounded once, after NCCL by a kernel
 * (hp_cuda_bf16_sum_ranks), host-staged on the host by its reference
 * (hp_bf16_sum_ranks, the same bits; test-cuda holds them to each other),
 * so NCCL, the staged path and the emulation agree.
 *
 * Reserved ranges (reserve, commit, release; copy_only): FSDP's model
 * arrays, granules of device memory mapped while a unit is held
 * (hp_cuda_vm_*), each counted in dev_bytes as a GPU holds it; the
 * working copy of a reserved weights region is reserved with it and
 * follows its commits.  The operand scratch is made once, for the
 * largest operands of the model's layout (prepare), so that what a run
 * holds is what hp-plan counts.  kernel_launches counts every call that
 * puts work on the device (L()).
 *
 * Errors: an op that cannot report one (a scratch allocation, a cuBLAS
 * call) keeps the first in st->err; sync, get and download return it.
 */
#include <math.h>

#include "backend/backend.h"
#include "base/alloc.h"
#include "base/crc32c.h"
#include "comm/comm.h"
#include "comm/comm_nccl.h"
#include "cuda/ops.h"

/* the two compilations' constructors (hp_backend_cuda_open picks) */
int hp_backend_cuda_emu_new(struct hp_backend **bp, int round_bf16, struct hp_err *e);
int hp_backend_cuda_gpu_new(struct hp_backend **bp, int dev, int shared, struct hp_err *e);

#if defined(HP_CUDA_EMU) || defined(HP_HAVE_CUDA)

#if !defined(HP_CUDA_EMU) && defined(HP_HAVE_NCCL)
#define USE_NCCL 1
#else
#define USE_NCCL 0
#endif

enum { S_X, S_DY, S_Q, S_K, S_V, S_O, S_DO, S_DQ, S_DK, S_DV, S_LSE, S_SEG, S_DI, S_ORD, S_START,
       S_W, NSCR };
#define NREGION 4
#define NEV 16
#define NSPARSE (3 * NREGION)
#define RING_BYTES ((size_t)8 << 20)
#define RING_MAX (RING_BYTES / 8)   /* larger uploads are not the step's: pageable */
#define PROF_MAX 16384
#define RING_MARKS 256

struct cu {
	struct hp_backend b;
	char name[96];
	int rc;                      /* the first error an op could not return */
	struct hp_err err;
	struct { float *base; size_t n; hp_bf16 *wb; } reg[NREGION];
	void *scr[NSCR];             /* device scratch, grown on demand */
	size_t cap[NSCR];
	void *host;                  /* host scratch (embedding groups, staging, stats) */
	size_t hcap;
	int shared;                  /* other ranks use this GPU too */
	int nccl;                    /* the collectives go through NCCL */
	struct hp_nccl nc[HP_NDIM + 1];
	void *ev[NEV];
	int evi;
	struct hp_breq greq;         /* the blocking all-gather's */
	struct hp_breq rreq;         /* the blocking reduce-scatter's */
	int comm_want;               /* HP_CUDA_COMM: 0 unset, 1 nccl, 2 staged */
	/* what dev_alloc handed out, for b.dev_bytes; retired: outgrown
	 * scratch kept until k_close */
	struct blk { void *p; size_t bytes; int retired; } *blk;
	int nblk, capblk;
	/* reserved ranges (k_reserve, and the working copies of reserved
	 * weights): n elements of es bytes here, each counted as ec bytes (the
	 * GPU's: the emulation holds a bf16 value in 4), in granules of G
	 * counted bytes, granule g mapped while ref[g] > 0 */
	struct sparse { char *base; size_t n, es, ec, G, ng, bytes; uint32_t *ref; } sp[NSPARSE];
	/* the upload ring (up): pinned bytes, the next free one, and a mark
	 * after each upload from [lo, hi) that the stream may not have run */
	char *ring;
	size_t rhead;
	struct rmark { void *mk; size_t lo, hi; int live; } rm[RING_MARKS];
	int rnext;
	/* the kernel profile (b.profile): marks, and each one's family */
	void *timer;
	unsigned char pfam[PROF_MAX];
	int np;
};

static struct cu *cu_of(struct hp_backend *b)
{
	return (struct cu *)b;
}

/* L(hp_cuda_f)(...): a call that puts work on the device (a kernel, a
 * library call, a copy or a memset), counted in b.kernel_launches; c is
 * the backend in scope */
#define L(f) (c->b.kernel_launches++, prof(c, #f), f)
#define LB(f) (cu_of(b)->b.kernel_launches++, prof(cu_of(b), #f), f)   /* b the backend in scope */

/* With b.profile: a timing mark before each launch, and its family
 * (backend.h, kernel_times); launches past PROF_MAX marks in one reading
 * count with the last one's. */
static void prof(struct cu *c, const char *fn)
{
	struct hp_err e;

	if (!c->b.profile || c->np >= PROF_MAX)
		return;
	if (!c->timer && !(c->timer = hp_cuda_timer_new(PROF_MAX + 1, &e))) {
		c->b.profile = 0;
		return;
	}
	c->pfam[c->np] = (unsigned char)hp_kfam_of(fn);
	hp_cuda_timer_mark(c->timer, c->np++);
}

static void keep(struct cu *c, int rc)
{
	if (rc && !c->rc)
		c->rc = rc;
}

/* Before the host waits for the compute stream: with NCCL, the stream
 * waits (through events) for the groups' collectives, and one that a
 * stopped peer never joins would hold cudaStreamSynchronize forever; poll
 * the stream instead, under training.collective_timeout_s, watching the
 * groups for NCCL's errors (comm_nccl.h).  Nothing to do without NCCL: the
 * host-staged collectives are MPI's, and wait in lib/comm/comm.c. */
static int dev_idle(struct cu *c, struct hp_err *e)
{
#if USE_NCCL
	if (c->nccl)
		return hp_nccl_wait_stream(hp_cuda_stream(), c->nc, HP_NDIM + 1, e);
#endif
	return 0;
}

/* The host waits for the compute stream. */
static int dev_sync(struct cu *c, struct hp_err *e)
{
	int rc = dev_idle(c, e);

	c->b.host_syncs++;
	return rc ? rc : hp_cuda_sync(e);
}

static void count(struct cu *c, ptrdiff_t bytes)
{
	c->b.dev_bytes += (size_t)bytes;
	if (c->b.dev_bytes > c->b.dev_bytes_peak)
		c->b.dev_bytes_peak = c->b.dev_bytes;
}

/* bytes of device memory (zeroed), counted in b.dev_bytes as counted
 * bytes: what a GPU holds for it (a bf16 array's 2 bytes an element, 4 in
 * the emulation's memory) */
static void *dev_alloc_as(struct cu *c, size_t bytes, size_t counted, struct hp_err *e)
{
	void *p;

	if (c->nblk == c->capblk) {
		int cap = c->capblk ? 2 * c->capblk : 64;
		struct blk *nb = hp_realloc(c->blk, (size_t)cap * sizeof(*nb));

		if (!nb) {
			hp_err_set(e, HP_ENOMEM, "cuda: out of host memory counting device memory");
			return NULL;
		}
		c->blk = nb;
		c->capblk = cap;
	}
	if (!(p = hp_cuda_alloc(bytes, e)))
		return NULL;
	c->blk[c->nblk++] = (struct blk){ p, counted, 0 };
	count(c, (ptrdiff_t)counted);
	return p;
}

static void *dev_alloc(struct cu *c, size_t bytes, struct hp_err *e)
{
	return dev_alloc_as(c, bytes, bytes, e);
}

/* the GPU's bytes for n bf16 values and an end of e bytes */
#define BF16_BYTES(n, e) ((n) * 2 + (e))

static void dev_free(struct cu *c, void *p)
{
	if (!p)
		return;
	for (int i = c->nblk - 1; i >= 0; i--)
		if (c->blk[i].p == p) {
			count(c, -(ptrdiff_t)c->blk[i].bytes);
			c->blk[i] = c->blk[--c->nblk];
			break;
		}
	hp_cuda_free(p);
}

/* p is no longer used, but kernels in flight may still read it: freed at
 * k_close, not now (cudaFree waits for the whole device, and NCCL forbids
 * that while its collectives may be in flight); still counted as held */
static void dev_retire(struct cu *c, void *p)
{
	for (int i = 0; i < c->nblk; i++)
		if (c->blk[i].p == p)
			c->blk[i].retired = 1;
}

/* Device scratch slot i of at least bytes; NULL (error kept) on failure.
 * It grows to the largest call and stays: only the first step allocates,
 * and what it outgrows is retired, not freed. */
static void *scr_as(struct cu *c, int i, size_t bytes, size_t counted)
{
	if (bytes <= c->cap[i] && c->scr[i])
		return c->scr[i];
	if (c->scr[i])
		dev_retire(c, c->scr[i]);
	c->cap[i] = 0;
	if (!(c->scr[i] = dev_alloc_as(c, bytes + 64, counted + 64, &c->err))) {
		keep(c, c->err.code ? c->err.code : HP_ECUDA);
		return NULL;
	}
	c->cap[i] = bytes;
	return c->scr[i];
}

static void *scr(struct cu *c, int i, size_t bytes)
{
	return scr_as(c, i, bytes, bytes);
}

static hp_bf16 *bscr(struct cu *c, int i, size_t n)
{
	return scr_as(c, i, n * sizeof(hp_bf16), BF16_BYTES(n, 0));
}

/* What each scratch slot holds for operands up to z: its elements, and
 * whether they are bf16 (else bytes); as the ops below take them. */
static void slot_need(const struct hp_op_sizes *z, size_t n[NSCR], int bf[NSCR])
{
	memset(n, 0, NSCR * sizeof(*n));
	memset(bf, 0, NSCR * sizeof(*bf));
	n[S_X] = z->lin_x;
	n[S_DY] = z->lin_dy;
	n[S_Q] = n[S_O] = n[S_DO] = n[S_DQ] = z->att_q;
	n[S_K] = n[S_V] = n[S_DK] = n[S_DV] = z->att_kv;
	for (int i = S_X; i <= S_DV; i++)
		bf[i] = 1;
	if (z->cp_L > 0) {
		n[S_LSE] = (size_t)z->cp_B * z->cp_Hq * z->cp_L * sizeof(float);
		n[S_DI] = hp_cuda_flash_scratch(z->cp_B, z->cp_L, z->cp_Hq) * sizeof(float) + 4;
		n[S_SEG] = (size_t)z->cp_B * z->cp_L * sizeof(int32_t);
	}
	n[S_ORD] = n[S_START] = z->tokens ? z->tokens * sizeof(int32_t) + 4 : 0;
}

static int k_prepare(struct hp_backend *b, const struct hp_op_sizes *z, struct hp_err *e)
{
	struct cu *c = cu_of(b);
	size_t n[NSCR];
	int bf[NSCR];

	slot_need(z, n, bf);
	for (int i = 0; i < NSCR; i++)
		if (n[i] && !(bf[i] ? (void *)bscr(c, i, n[i]) : scr(c, i, n[i])))
			return hp_err_set(e, c->rc ? c->rc : HP_ECUDA, "%s", c->err.msg);
	return 0;
}

#ifdef HP_CUDA_EMU   /* one definition, in every build */
size_t hp_backend_cuda_scratch_bytes(const struct hp_op_sizes *z)
{
	size_t n[NSCR], sum = 0;
	int bf[NSCR];

	slot_need(z, n, bf);
	for (int i = 0; i < NSCR; i++)
		if (n[i])
			sum += (bf[i] ? BF16_BYTES(n[i], 0) : n[i]) + 64;   /* scr_as's end */
	return sum;
}
#endif

/* Host memory *p of *cap bytes, grown to at least bytes; NULL when that
 * failed (*p then NULL too). */
static void *host_grow(void **p, size_t *cap, size_t bytes)
{
	if (bytes > *cap || !*p) {
		hp_free(*p);
		*cap = 0;
		if (!(*p = hp_malloc(bytes + 64)))
			return NULL;
		*cap = bytes;
	}
	return *p;
}

/* Host scratch of at least bytes. */
static void *hscr(struct cu *c, size_t bytes)
{
	if (!host_grow(&c->host, &c->hcap, bytes))
		keep(c, hp_err_set(&c->err, HP_ENOMEM, "cuda: out of host memory for %zu MiB of staging",
				   bytes >> 20));
	return c->host;
}

/* x (n floats) as bf16 operands in slot i */
static const hp_bf16 *as_bf16(struct cu *c, int i, const float *x, size_t n)
{
	hp_bf16 *y = bscr(c, i, n);

	if (y && n)
		L(hp_cuda_f32_to_bf16)(y, x, n);
	return y;
}

/* The working copy of weight W (O*K floats): from its registered region,
 * else converted now. */
/* The working copy of [w, w + n) when a registered region holds it, else NULL. */
static hp_bf16 *region_wb(struct cu *c, const float *w, size_t n)
{
	for (int i = 0; i < NREGION; i++)
		if (c->reg[i].wb && w >= c->reg[i].base && w + n <= c->reg[i].base + c->reg[i].n)
			return c->reg[i].wb + (w - c->reg[i].base);
	return NULL;
}

static const hp_bf16 *wb_of(struct cu *c, const float *W, size_t n)
{
	const hp_bf16 *wb = region_wb(c, W, n);

	return wb ? wb : as_bf16(c, S_W, W, n);
}

/* ---- memory ---- */

static void *k_alloc(struct hp_backend *b, size_t bytes, struct hp_err *e)
{
	return dev_alloc(cu_of(b), bytes ? bytes : 1, e);
}

static void *k_alloc_as(struct hp_backend *b, size_t bytes, size_t counted, struct hp_err *e)
{
	return dev_alloc_as(cu_of(b), bytes ? bytes : 1, counted ? counted : 1, e);
}

/* ---- reserved ranges ---- */

/* The reserved range that holds p, or NULL. */
static struct sparse *sparse_of(struct cu *c, const void *p)
{
	for (int i = 0; i < NSPARSE; i++)
		if (c->sp[i].base && (const char *)p >= c->sp[i].base &&
		    (const char *)p < c->sp[i].base + c->sp[i].n * c->sp[i].es)
			return &c->sp[i];
	return NULL;
}

/* n elements of es bytes, counted as ec each, nothing mapped */
static void *sp_new(struct cu *c, size_t n, size_t es, size_t ec, struct hp_err *e)
{
	struct sparse *s = NULL;
	size_t G;

	for (int i = 0; i < NSPARSE && !s; i++)
		if (!c->sp[i].base)
			s = &c->sp[i];
	if (!s) {
		hp_err_set(e, HP_EINVAL, "cuda: more than %d reserved ranges", NSPARSE);
		return NULL;
	}
	if (!n)
		n = 1;
	/* whole granules as they are counted (ec bytes an element) and as they
	 * are held (es: the emulation holds bf16 in 4), so that unmapping the
	 * last granule stays inside the range */
	size_t G0 = (size_t)HP_CUDA_GRANULE, bytes = (n * ec + G0 - 1) / G0 * (G0 / ec * es);
	if (!(s->base = hp_cuda_vm_reserve(bytes, &G, e)))
		return NULL;
	s->bytes = bytes;
	s->n = n;
	s->es = es;
	s->ec = ec;
	s->G = G;
	s->ng = (n * ec + G - 1) / G;
	if (!(s->ref = hp_calloc(s->ng, sizeof(*s->ref)))) {
		hp_cuda_vm_free(s->base, bytes);
		memset(s, 0, sizeof(*s));
		hp_err_set(e, HP_ENOMEM, "cuda: out of host memory for a reserved range");
		return NULL;
	}
	return s->base;
}

static void sp_free(struct cu *c, struct sparse *s)
{
	if (!s->base)
		return;
	for (size_t g = 0; g < s->ng; g++)
		if (s->ref[g])
			count(c, -(ptrdiff_t)s->G);
	hp_cuda_vm_free(s->base, s->bytes);
	hp_free(s->ref);
	memset(s, 0, sizeof(*s));
}

/* Granule g's memory, in this memory's bytes. */
static char *sp_at(const struct sparse *s, size_t g, size_t *bytes)
{
	*bytes = s->G / s->ec * s->es;
	return s->base + g * *bytes;
}

/* Elements [i0, i1) of s committed (dir 1) or released (-1): each granule
 * they touch counts one more or one less span; a granule is mapped (zero)
 * at its first and unmapped at its last, and a released span's bytes in a
 * granule that stays are zeroed, as release promises. */
static int sp_span(struct cu *c, struct sparse *s, size_t i0, size_t i1, int dir, struct hp_err *e)
{
	size_t g0 = i0 * s->ec / s->G, g1 = (i1 * s->ec + s->G - 1) / s->G, bytes;
	int rc;

	for (size_t g = g0; g < g1 && g < s->ng; g++) {
		char *at = sp_at(s, g, &bytes);

		if (dir > 0) {
			if (!s->ref[g]++) {
				if ((rc = hp_cuda_vm_map(at, bytes, e))) {
					s->ref[g]--;
					return rc;
				}
				count(c, (ptrdiff_t)s->G);
			}
			continue;
		}
		if (!s->ref[g])
			continue;
		if (--s->ref[g]) {
			char *lo = s->base + i0 * s->es, *hi = s->base + i1 * s->es;

			lo = lo > at ? lo : at;
			hi = hi < at + bytes ? hi : at + bytes;
			L(hp_cuda_zero)(lo, (size_t)(hi - lo));
			continue;
		}
		hp_cuda_vm_unmap(at, bytes);
		count(c, -(ptrdiff_t)s->G);
	}
	return 0;
}

/* [p, p + bytes) of a reserved range, and the same span of its working
 * copy when it is a weights region, committed or released */
static int sp_both(struct cu *c, struct sparse *s, const void *p, size_t bytes, int dir, struct hp_err *e)
{
	size_t i0 = (size_t)((const char *)p - s->base) / s->es, i1 = i0 + (bytes + s->es - 1) / s->es;
	int rc;

	if (i1 > s->n)
		i1 = s->n;
	if ((rc = sp_span(c, s, i0, i1, dir, e)))
		return rc;
	for (int i = 0; i < NREGION; i++) {
		struct sparse *w = c->reg[i].wb ? sparse_of(c, c->reg[i].wb) : NULL;
		/* the region's floats, and the span's, from s->base on */
		size_t r0 = (size_t)((char *)c->reg[i].base - s->base) / sizeof(float), r1 = r0 + c->reg[i].n;
		size_t f0 = i0 * s->es / sizeof(float), f1 = (i1 * s->es + 3) / sizeof(float);

		if (!w || sparse_of(c, c->reg[i].base) != s)
			continue;
		f0 = f0 > r0 ? f0 : r0;
		f1 = f1 < r1 ? f1 : r1;
		if (f0 < f1 && (rc = sp_span(c, w, f0 - r0, f1 - r0, dir, e)))
			return rc;
	}
	return 0;
}

static void *k_reserve(struct hp_backend *b, size_t bytes, struct hp_err *e)
{
	return sp_new(cu_of(b), bytes, 1, 1, e);
}

static int k_commit(struct hp_backend *b, void *p, size_t bytes, struct hp_err *e)
{
	struct cu *c = cu_of(b);
	struct sparse *s = bytes ? sparse_of(c, p) : NULL;

	return s ? sp_both(c, s, p, bytes, 1, e) : 0;
}

static void k_release(struct hp_backend *b, void *p, size_t bytes)
{
	struct cu *c = cu_of(b);
	struct sparse *s = bytes ? sparse_of(c, p) : NULL;

	if (s)
		keep(c, sp_both(c, s, p, bytes, -1, &c->err));
	else if (bytes)
		L(hp_cuda_zero)(p, bytes);
}

static void k_free(struct hp_backend *b, void *p)
{
	struct cu *c = cu_of(b);
	struct sparse *s = p ? sparse_of(c, p) : NULL;

	if (s)
		sp_free(c, s);
	else
		dev_free(c, p);
}

/* A copy from the host's pageable memory: the driver may wait for the
 * stream before it stages the bytes (CUDA's API synchronization
 * behavior), so it counts as the host waiting for the device. */
static int up_pageable(struct cu *c, void *dst, const void *src, size_t bytes, struct hp_err *e)
{
	c->b.host_syncs++;
	return L(hp_cuda_upload)(dst, src, bytes, e);
}

/* The host waits for mark k if the stream has not passed it; it is dead after. */
static int ring_retire(struct cu *c, struct rmark *k, struct hp_err *e)
{
	int rc = 0;

	if (k->live && !hp_cuda_mark_passed(k->mk)) {
		c->b.host_syncs++;
		rc = hp_cuda_mark_wait(k->mk, e);
	}
	k->live = 0;
	return rc;
}

/*
 * The step's uploads (a micro-batch's ids, targets and positions, routing
 * and embedding tables) go through a ring of pinned memory: copied there,
 * queued on the stream, a mark recorded after.  The host waits only where
 * it would overwrite bytes whose copy the stream has not run yet, which a
 * ring several steps' worth of uploads long makes the exception (and
 * counts when it happens).  Larger uploads (weights, checkpoints,
 * host-staged collectives) come from pageable memory, and wait.
 */
static int up(struct cu *c, void *dst, const void *src, size_t bytes, struct hp_err *e)
{
	size_t at;
	struct rmark *k;
	int rc;

	if (!bytes)
		return 0;
	if (bytes > RING_MAX)
		return up_pageable(c, dst, src, bytes, e);
	if (!c->ring) {
		if (!(c->ring = hp_cuda_host_alloc(RING_BYTES, e)))
			return HP_ECUDA;
		for (int i = 0; i < RING_MARKS; i++)
			if (!(c->rm[i].mk = hp_cuda_mark_new(e)))
				return HP_ECUDA;
	}
	at = c->rhead + bytes > RING_BYTES ? 0 : c->rhead;
	for (int i = 0; i < RING_MARKS; i++)
		if (c->rm[i].live && c->rm[i].lo < at + bytes && at < c->rm[i].hi && (rc = ring_retire(c, &c->rm[i], e)))
			return rc;
	k = &c->rm[c->rnext];
	if ((rc = ring_retire(c, k, e)))
		return rc;
	memcpy(c->ring + at, src, bytes);
	if ((rc = L(hp_cuda_upload)(dst, c->ring + at, bytes, e)) || (rc = hp_cuda_mark_record(k->mk, e)))
		return rc;
	k->lo = at;
	k->hi = at + bytes;
	k->live = 1;
	c->rnext = (c->rnext + 1) % RING_MARKS;
	c->rhead = (at + bytes + 255) & ~(size_t)255;
	return 0;
}

static int k_upload(struct hp_backend *b, void *dst, const void *src, size_t bytes, struct hp_err *e)
{
	return up(cu_of(b), dst, src, bytes, e);
}

static int k_download(struct hp_backend *b, void *dst, const void *src, size_t bytes, struct hp_err *e)
{
	struct cu *c = cu_of(b);
	int rc;

	if (c->rc)
		return hp_err_set(e, c->rc, "%s", c->err.msg);
	if (!bytes)
		return 0;
	/* the download waits for the stream */
	c->b.host_syncs++;
	return (rc = dev_idle(c, e)) ? rc : L(hp_cuda_download)(dst, src, bytes, e);
}

static void k_copy(struct hp_backend *b, void *dst, const void *src, size_t bytes)
{
	if (bytes && dst != src)
		LB(hp_cuda_copy)(dst, src, bytes);
}

static void k_copy2d(struct hp_backend *b, void *dst, size_t dpitch, const void *src, size_t spitch,
		     size_t width, size_t rows)
{
	if (width && rows)
		LB(hp_cuda_copy2d)(dst, dpitch, src, spitch, width, rows);
}

static void k_zero(struct hp_backend *b, void *p, size_t bytes)
{
	if (bytes)
		LB(hp_cuda_zero)(p, bytes);
}

/* device memory stays with its buffer: nothing to give back */
static void k_discard(struct hp_backend *b, void *p, size_t bytes)
{
}

static int k_sync(struct hp_backend *b, struct hp_err *e)
{
	struct cu *c = cu_of(b);

	if (c->rc)
		return hp_err_set(e, c->rc, "%s", c->err.msg);
	return dev_sync(c, e);
}

static int k_put(struct hp_backend *b, const struct hp_i32 *x, size_t n, struct hp_err *e)
{
	return up(cu_of(b), x->d, x->h, n * sizeof(int32_t), e);
}

static int k_get(struct hp_backend *b, const struct hp_i32 *x, size_t n, struct hp_err *e)
{
	return k_download(b, x->h, x->d, n * sizeof(int32_t), e);
}

static size_t k_esize(struct hp_backend *b, enum hp_dtype t)
{
	return t == HP_DTYPE_BF16 ? sizeof(hp_bf16) : hp_dtype_size(t);
}

static void k_convert(struct hp_backend *b, void *dst, enum hp_dtype dt, const void *src, enum hp_dtype st, size_t n)
{
	if (dt == st)
		k_copy(b, dst, src, n * k_esize(b, dt));
	else if (dt == HP_DTYPE_BF16)
		LB(hp_cuda_f32_to_bf16)(dst, src, n);
	else
		LB(hp_cuda_bf16_to_f32)(dst, src, n);
}

static void k_acc(struct hp_backend *b, float *dst, const void *src, enum hp_dtype st, size_t n)
{
	if (st == HP_DTYPE_BF16)
		LB(hp_cuda_add_bf16)(dst, src, n);
	else
		LB(hp_cuda_acc)(dst, src, n);
}

/* n 0: the region at base is gone (its model released); its copy goes too,
 * so that memory the device hands out again is never taken for it */
static int k_weights(struct hp_backend *b, float *base, size_t n, struct hp_err *e)
{
	struct cu *c = cu_of(b);

	if (!n) {
		for (int i = 0; i < NREGION; i++)
			if (c->reg[i].wb && c->reg[i].base == base) {
				k_free(b, c->reg[i].wb);
				memset(&c->reg[i], 0, sizeof(c->reg[i]));
			}
		return 0;
	}
	for (int i = 0; i < NREGION; i++)
		if (!c->reg[i].wb) {
			struct sparse *ws = sparse_of(c, base);

			if (ws && !(c->reg[i].wb = sp_new(c, n, sizeof(hp_bf16), 2, e)))
				return e->code;
			if (!ws && !(c->reg[i].wb = dev_alloc_as(c, n * sizeof(hp_bf16) + 64, BF16_BYTES(n, 64), e)))
				return e->code;
			c->reg[i].base = base;
			c->reg[i].n = n;
			return 0;
		}
	return hp_err_set(e, HP_EINVAL, "cuda: more than %d models on one backend", NREGION);
}

/* what of [w, w + n) a region holds follows in its working copy */
static void k_weights_changed(struct hp_backend *b, const float *w, size_t n)
{
	struct cu *c = cu_of(b);

	for (int i = 0; i < NREGION; i++) {
		const float *lo = c->reg[i].base, *hi = lo + c->reg[i].n;

		lo = w > lo ? w : lo;
		hi = w + n < hi ? w + n : hi;
		if (c->reg[i].wb && lo < hi)
			L(hp_cuda_f32_to_bf16)(c->reg[i].wb + (lo - c->reg[i].base), lo, (size_t)(hi - lo));
	}
}

static int k_copy_only(struct hp_backend *b, float *w, size_t n, int dir, const void *src, enum hp_dtype st,
		       struct hp_err *e)
{
	struct cu *c = cu_of(b);
	hp_bf16 *wb = n ? region_wb(c, w, n) : NULL;
	struct sparse *s = wb ? sparse_of(c, wb) : NULL;
	int rc;

	if (!s)
		return 0;   /* no reserved copy: the fp32 weights serve */
	if (dir == 0) {
		if (st == HP_DTYPE_BF16)
			k_copy(b, wb, src, n * sizeof(hp_bf16));
		else
			L(hp_cuda_f32_to_bf16)(wb, src, n);
		return 1;
	}
	rc = sp_span(c, s, (size_t)(wb - (hp_bf16 *)s->base), (size_t)(wb - (hp_bf16 *)s->base) + n, dir, e);
	return rc ? rc : 1;
}

/* ---- ops ---- */

static void k_linear_fwd(struct hp_backend *b, float *y, const float *x, const float *W, const float *bias, long N,
			 int K, int O)
{
	struct cu *c = cu_of(b);
	const hp_bf16 *xb, *wb;

	if (N <= 0 || O <= 0)
		return;
	if (!(xb = as_bf16(c, S_X, x, (size_t)N * K)) || !(wb = wb_of(c, W, (size_t)O * K)))
		return;
	keep(c, L(hp_cuda_linear_fwd)(y, xb, wb, bias, N, K, O, &c->err));
}

static void k_linear_bwd(struct hp_backend *b, float *dx, float *dW, float *db, const float *dy, const float *x,
			 const float *W, long N, int K, int O, int accumulate)
{
	struct cu *c = cu_of(b);
	const hp_bf16 *dyb, *xb, *wb;

	if (N <= 0)
		return;
	if (!(dyb = as_bf16(c, S_DY, dy, (size_t)N * O)) || !(xb = as_bf16(c, S_X, x, (size_t)N * K)) ||
	    !(wb = wb_of(c, W, (size_t)O * K)))
		return;
	keep(c, L(hp_cuda_linear_bwd)(dx, dW, db, dyb, xb, wb, N, K, O, accumulate, &c->err));
}

static void k_rmsnorm_fwd(struct hp_backend *b, float *y, float *rstd, const float *x, const float *w, long N, int C,
			  float eps)
{
	LB(hp_cuda_rmsnorm_fwd)(y, rstd, x, w, N, C, eps);
}

static void k_rmsnorm_bwd(struct hp_backend *b, float *dx, float *dw, const float *dy, const float *x, const float *w,
			  const float *rstd, long N, int C, int accumulate)
{
	LB(hp_cuda_rmsnorm_bwd)(dx, dw, dy, x, w, rstd, N, C, accumulate);
}

/* fused_rmsnorm: the residual add, then the norm (two kernels on the GPU) */
static void k_rmsnorm_res_fwd(struct hp_backend *b, float *h, float *y, float *rstd, const float *a, const float *bb,
			      const float *w, long N, int C, float eps)
{
	if (bb)
		LB(hp_cuda_add)(h, a, bb, (size_t)N * C);
	else if (h != a)
		LB(hp_cuda_copy)(h, a, (size_t)N * C * sizeof(float));
	LB(hp_cuda_rmsnorm_fwd)(y, rstd, h, w, N, C, eps);
}

static void k_rope_fwd(struct hp_backend *b, float *x, const int32_t *pos, const float *cos_t, const float *sin_t,
		       long N, int H, int ld, int Dr, int inter)
{
	LB(hp_cuda_rope_fwd)(x, pos, cos_t, sin_t, N, H, ld, Dr, inter);
}

static void k_rope_bwd(struct hp_backend *b, float *dx, const int32_t *pos, const float *cos_t, const float *sin_t,
		       long N, int H, int ld, int Dr, int inter)
{
	LB(hp_cuda_rope_bwd)(dx, pos, cos_t, sin_t, N, H, ld, Dr, inter);
}

static void k_swiglu_fwd(struct hp_backend *b, float *h, const float *g, const float *u, long n)
{
	if (n > 0)
		LB(hp_cuda_swiglu_fwd)(h, g, u, (size_t)n);
}

static void k_swiglu_bwd(struct hp_backend *b, float *dg, float *du, const float *dh, const float *g, const float *u,
			 long n)
{
	if (n > 0)
		LB(hp_cuda_swiglu_bwd)(dg, du, dh, g, u, (size_t)n);
}

static void k_swiglu_rows_fwd(struct hp_backend *b, float *h, const float *gu, long rows, int I)
{
	LB(hp_cuda_swiglu_rows_fwd)(h, gu, rows, I);
}

static void k_swiglu_rows_bwd(struct hp_backend *b, float *dgu, const float *dh, const float *gu, long rows, int I)
{
	LB(hp_cuda_swiglu_rows_bwd)(dgu, dh, gu, rows, I);
}

static void k_sinks_fwd(struct hp_backend *b, float *out, float *lse, const float *sinks, int B, int T, int H,
			int D)
{
	LB(hp_cuda_sinks_fwd)(out, lse, sinks, B, T, H, D);
}

static void k_sinks_bwd(struct hp_backend *b, float *dsinks, const float *dout, const float *out, const float *lse,
			const float *sinks, int B, int T, int H, int D)
{
	LB(hp_cuda_sinks_bwd)(dsinks, dout, out, lse, sinks, B, T, H, D);
}

/* Qwen3-Next / Qwen3.5 */
static void k_conv1d_silu_fwd(struct hp_backend *b, float *y, const float *x, const float *w, const int32_t *seg,
			      int B, int T, int C, int K)
{
	LB(hp_cuda_conv1d_silu_fwd)(y, x, w, seg, B, T, C, K);
}

static void k_conv1d_silu_bwd(struct hp_backend *b, float *dx, float *dw, const float *dy, const float *x,
			      const float *w, const int32_t *seg, int B, int T, int C, int K)
{
	LB(hp_cuda_conv1d_silu_bwd)(dx, dw, dy, x, w, seg, B, T, C, K);
}

static void k_l2norm_fwd(struct hp_backend *b, float *y, float *rinv, const float *x, long N, int D)
{
	LB(hp_cuda_l2norm_fwd)(y, rinv, x, N, D);
}

static void k_l2norm_bwd(struct hp_backend *b, float *dx, const float *dy, const float *y, const float *rinv, long N,
			 int D)
{
	LB(hp_cuda_l2norm_bwd)(dx, dy, y, rinv, N, D);
}

static void k_gdn_gates_fwd(struct hp_backend *b, float *beta, float *g, const float *bb, const float *a,
			    const float *A_log, const float *dt_bias, long N, int H)
{
	LB(hp_cuda_gdn_gates_fwd)(beta, g, bb, a, A_log, dt_bias, N, H);
}

static void k_gdn_gates_bwd(struct hp_backend *b, float *dbb, float *da, float *dA_log, float *ddt_bias,
			    const float *dbeta, const float *dg, const float *bb, const float *a, const float *A_log,
			    const float *dt_bias, long N, int H)
{
	LB(hp_cuda_gdn_gates_bwd)(dbb, da, dA_log, ddt_bias, dbeta, dg, bb, a, A_log, dt_bias, N, H);
}

_Static_assert(HP_CUDA_GDR_CHUNK == HP_GDR_CHUNK, "the saved states' spacing");

/* a unit of the CPU's size for each block (the kernel's working set is
 * smaller), so that the emulation runs the CPU kernel on the same bytes */
static size_t k_gdr_scratch(struct hp_backend *b, int B, int Hv, int Dk, int Dv)
{
	(void)b;
	return (size_t)B * Hv * hp_gdr_unit_floats(Dk, Dv);
}

static void k_gdr_fwd(struct hp_backend *b, float *out, float *saved, const float *q, const float *k, const float *v,
		      const float *g, const float *beta, const int32_t *seg, float *scratch, int B, int T, int Hv,
		      int Hk, int Dk, int Dv, float scale)
{
	LB(hp_cuda_gdr_fwd)(out, saved, q, k, v, g, beta, seg, scratch, hp_gdr_unit_floats(Dk, Dv), B, T, Hv, Hk, Dk,
			    Dv, scale);
}

static void k_gdr_bwd(struct hp_backend *b, float *dq, float *dk, float *dv, float *dg, float *dbeta,
		      const float *dout, const float *saved, const float *q, const float *k, const float *v,
		      const float *g, const float *beta, const int32_t *seg, float *scratch, int B, int T, int Hv,
		      int Hk, int Dk, int Dv, float scale)
{
	LB(hp_cuda_gdr_bwd)(dq, dk, dv, dg, dbeta, dout, saved, q, k, v, g, beta, seg, scratch,
			    hp_gdr_unit_floats(Dk, Dv), B, T, Hv, Hk, Dk, Dv, scale);
}

static void k_rmsnorm_gated_fwd(struct hp_backend *b, float *y, float *rstd, const float *x, const float *z,
				const float *w, long N, int D, float eps)
{
	LB(hp_cuda_rmsnorm_gated_fwd)(y, rstd, x, z, w, N, D, eps);
}

static void k_rmsnorm_gated_bwd(struct hp_backend *b, float *dx, float *dz, float *dw, const float *dy,
				const float *x, const float *z, const float *w, const float *rstd, long N, int D)
{
	LB(hp_cuda_rmsnorm_gated_bwd)(dx, dz, dw, dy, x, z, w, rstd, N, D);
}

static void k_sigmoid_gate_fwd(struct hp_backend *b, float *y, const float *x, const float *gate, long n)
{
	LB(hp_cuda_sigmoid_gate_fwd)(y, x, gate, n);
}

static void k_sigmoid_gate_bwd(struct hp_backend *b, float *dx, float *dgate, const float *dy, const float *x,
			       const float *gate, long n)
{
	LB(hp_cuda_sigmoid_gate_bwd)(dx, dgate, dy, x, gate, n);
}

static void k_sigmoid_gate_rows_fwd(struct hp_backend *b, float *y, const float *x, const float *gate, long T, int C)
{
	LB(hp_cuda_sigmoid_gate_rows_fwd)(y, x, gate, T, C);
}

static void k_sigmoid_gate_rows_bwd(struct hp_backend *b, float *dx, float *dgate, const float *dy, const float *x,
				    const float *gate, long T, int C)
{
	LB(hp_cuda_sigmoid_gate_rows_bwd)(dx, dgate, dy, x, gate, T, C);
}

static void k_glu_clamp_fwd(struct hp_backend *b, float *h, const float *g, const float *u, long ld, long rows,
			    int I, float alpha, float limit)
{
	LB(hp_cuda_glu_clamp_fwd)(h, g, u, ld, rows, I, alpha, limit);
}

static void k_glu_clamp_bwd(struct hp_backend *b, float *dg, float *du, const float *dh, const float *g,
			    const float *u, long ld, long rows, int I, float alpha, float limit)
{
	LB(hp_cuda_glu_clamp_bwd)(dg, du, dh, g, u, ld, rows, I, alpha, limit);
}

static void k_bias_grouped_fwd(struct hp_backend *b, float *x, long ld, const float *bias, size_t bs,
			       const int32_t *off, int nx, int n, long R)
{
	LB(hp_cuda_bias_grouped_fwd)(x, ld, bias, bs, off, nx, n, R);
}

static void k_bias_grouped_bwd(struct hp_backend *b, float *db, size_t bs, const float *dx, long ld,
			       const int32_t *off, int nx, int n)
{
	LB(hp_cuda_bias_grouped_bwd)(db, bs, dx, ld, off, nx, n);
}

static int k_flash_supports(struct hp_backend *b, int D)
{
	return hp_cuda_flash_supports(D);
}

/* flash attention on fp32 q, k, v: bf16 operands, the output back in fp32 */
static void k_flash_fwd(struct hp_backend *b, float *out, float *lse, const float *q, const float *k, const float *v,
			const int32_t *seg, int B, int T, int Hq, int Hkv, int D)
{
	struct cu *c = cu_of(b);
	size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D;
	const hp_bf16 *qb, *kb, *vb;
	hp_bf16 *ob;

	if (!nq || !(qb = as_bf16(c, S_Q, q, nq)) || !(kb = as_bf16(c, S_K, k, nk)) ||
	    !(vb = as_bf16(c, S_V, v, nk)) || !(ob = bscr(c, S_O, nq)))
		return;
	L(hp_cuda_flash_fwd)(ob, lse, qb, kb, vb, seg, B, T, Hq, Hkv, D);
	L(hp_cuda_bf16_to_f32)(out, ob, nq);
}

static void k_flash_bwd(struct hp_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *out,
			const float *lse, const float *q, const float *k, const float *v, const int32_t *seg,
			float *scratch, int B, int T, int Hq, int Hkv, int D)
{
	struct cu *c = cu_of(b);
	size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D;
	const hp_bf16 *qb, *kb, *vb, *ob, *dob;
	hp_bf16 *dqb, *dkb, *dvb;

	if (!nq || !(qb = as_bf16(c, S_Q, q, nq)) || !(kb = as_bf16(c, S_K, k, nk)) ||
	    !(vb = as_bf16(c, S_V, v, nk)) || !(ob = as_bf16(c, S_O, out, nq)) ||
	    !(dob = as_bf16(c, S_DO, dout, nq)) || !(dqb = bscr(c, S_DQ, nq)) || !(dkb = bscr(c, S_DK, nk)) ||
	    !(dvb = bscr(c, S_DV, nk)))
		return;
	L(hp_cuda_flash_bwd)(dqb, dkb, dvb, dob, ob, lse, qb, kb, vb, seg, scratch, B, T, Hq, Hkv, D);
	L(hp_cuda_bf16_to_f32)(dq, dqb, nq);
	L(hp_cuda_bf16_to_f32)(dk, dkb, nk);
	L(hp_cuda_bf16_to_f32)(dv, dvb, nk);
}

static size_t k_flash_scratch(struct hp_backend *b, int B, int T, int H, int D)
{
	return hp_cuda_flash_scratch(B, T, H);
}

/* the GPU has no eager attention: the model runs flash (has_eager 0); a
 * caller that asks anyway gets flash with P's room holding lse */
static void k_attention_fwd(struct hp_backend *b, float *out, float *P, const float *q, const float *k,
			    const float *v, const int32_t *seg, int B, int T, int Hq, int Hkv, int D)
{
	k_flash_fwd(b, out, P, q, k, v, seg, B, T, Hq, Hkv, D);
}

static void k_attention_bwd(struct hp_backend *b, float *dq, float *dk, float *dv, const float *dout, const float *P,
			    const float *q, const float *k, const float *v, const int32_t *seg, float *scratch,
			    int B, int T, int Hq, int Hkv, int D)
{
	keep(cu_of(b), hp_err_set(&cu_of(b)->err, HP_EINVAL, "cuda: the eager attention's backward has no "
				  "kernel here (the model runs flash attention on this backend)"));
}

/*
 * Context parallelism, the K/V all-gather mode: the chunk of Tq queries at
 * q0 against the keys of their whole rows is flash attention over each
 * row's prefix of L = q0 + Tq tokens, the queries padded with zero rows
 * before q0 (their outputs dropped; in the backward their lse is +inf and
 * their dout zero, so they add nothing to dK, dV).  The tensor-core kernel
 * serves every layout this way, at the cost of the padded rows.
 */
struct prefix {
	hp_bf16 *q, *k, *v;
	int32_t *seg;
	size_t L, QD, KD;
};

static int prefix_in(struct cu *c, struct prefix *x, const float *q, const float *k, const float *v,
		     const int32_t *seg, int B, int Tq, int S, int q0, int Hq, int Hkv, int D)
{
	size_t L = (size_t)q0 + Tq, QD = (size_t)Hq * D, KD = (size_t)Hkv * D, es = sizeof(hp_bf16);

	x->L = L;
	x->QD = QD;
	x->KD = KD;
	if (!(x->q = bscr(c, S_Q, (size_t)B * L * QD)) || !(x->k = bscr(c, S_K, (size_t)B * L * KD)) ||
	    !(x->v = bscr(c, S_V, (size_t)B * L * KD)) ||
	    (seg && !(x->seg = scr(c, S_SEG, (size_t)B * L * sizeof(int32_t)))))
		return -1;
	if (!seg)
		x->seg = NULL;
	for (int b = 0; b < B; b++) {
		L(hp_cuda_zero)(x->q + (size_t)b * L * QD, (size_t)q0 * QD * es);
		L(hp_cuda_f32_to_bf16)(x->q + ((size_t)b * L + q0) * QD, q + (size_t)b * Tq * QD, (size_t)Tq * QD);
		L(hp_cuda_f32_to_bf16)(x->k + (size_t)b * L * KD, k + (size_t)b * S * KD, L * KD);
		L(hp_cuda_f32_to_bf16)(x->v + (size_t)b * L * KD, v + (size_t)b * S * KD, L * KD);
		if (seg) {
			L(hp_cuda_zero)(x->seg + (size_t)b * L, (size_t)q0 * sizeof(int32_t));
			L(hp_cuda_copy)(x->seg + (size_t)b * L + q0, seg + (size_t)b * Tq, (size_t)Tq * sizeof(int32_t));
		}
	}
	return 0;
}

static void k_cp_attention_fwd(struct hp_backend *b, float *out, float *P, float *lse, const float *q,
			       const float *k, const float *v, const int32_t *seg, int B, int Tq, int S, int q0,
			       int Hq, int Hkv, int D)
{
	struct cu *c = cu_of(b);
	struct prefix x;
	hp_bf16 *ob;
	float *lseL;

	if (!lse) {
		keep(c, hp_err_set(&c->err, HP_EINVAL, "cuda: context-parallel attention keeps lse, not P"));
		return;
	}
	if (prefix_in(c, &x, q, k, v, seg, B, Tq, S, q0, Hq, Hkv, D) || !(ob = bscr(c, S_O, (size_t)B * x.L * x.QD)) ||
	    !(lseL = scr(c, S_LSE, (size_t)B * Hq * x.L * sizeof(float))))
		return;
	L(hp_cuda_flash_fwd)(ob, lseL, x.q, x.k, x.v, x.seg, B, (int)x.L, Hq, Hkv, D);
	for (int bb = 0; bb < B; bb++)
		L(hp_cuda_bf16_to_f32)(out + (size_t)bb * Tq * x.QD, ob + ((size_t)bb * x.L + q0) * x.QD, (size_t)Tq * x.QD);
	/* lse [B, Hq, Tq]: the last Tq of each (b, h) row of [B, Hq, L] */
	L(hp_cuda_copy2d)(lse, (size_t)Tq * sizeof(float), lseL + q0, x.L * sizeof(float), (size_t)Tq * sizeof(float),
		       (size_t)B * Hq);
}

static void k_cp_attention_bwd(struct hp_backend *b, float *dq, float *dk, float *dv, const float *dout,
			       const float *out, const float *P, const float *lse, const float *q, const float *k,
			       const float *v, const int32_t *seg, float *scratch, int B, int Tq, int S, int q0,
			       int Hq, int Hkv, int D)
{
	struct cu *c = cu_of(b);
	struct prefix x;
	hp_bf16 *ob, *dob, *dqb, *dkb, *dvb;
	float *lseL, *di;
	size_t es = sizeof(hp_bf16);

	if (prefix_in(c, &x, q, k, v, seg, B, Tq, S, q0, Hq, Hkv, D) || !(ob = bscr(c, S_O, (size_t)B * x.L * x.QD)) ||
	    !(dob = bscr(c, S_DO, (size_t)B * x.L * x.QD)) || !(dqb = bscr(c, S_DQ, (size_t)B * x.L * x.QD)) ||
	    !(dkb = bscr(c, S_DK, (size_t)B * x.L * x.KD)) || !(dvb = bscr(c, S_DV, (size_t)B * x.L * x.KD)) ||
	    !(lseL = scr(c, S_LSE, (size_t)B * Hq * x.L * sizeof(float))) ||
	    !(di = scr(c, S_DI, hp_cuda_flash_scratch(B, (int)x.L, Hq) * sizeof(float) + 4)))
		return;
	for (int bb = 0; bb < B; bb++) {
		size_t at = (size_t)bb * x.L * x.QD, pad = (size_t)q0 * x.QD;

		L(hp_cuda_zero)(ob + at, pad * es);
		L(hp_cuda_zero)(dob + at, pad * es);
		L(hp_cuda_f32_to_bf16)(ob + at + pad, out + (size_t)bb * Tq * x.QD, (size_t)Tq * x.QD);
		L(hp_cuda_f32_to_bf16)(dob + at + pad, dout + (size_t)bb * Tq * x.QD, (size_t)Tq * x.QD);
	}
	/* the padded queries: lse +inf, probability 0 */
	L(hp_cuda_fill_inf)(lseL, (size_t)B * Hq * x.L);
	L(hp_cuda_copy2d)(lseL + q0, x.L * sizeof(float), lse, (size_t)Tq * sizeof(float), (size_t)Tq * sizeof(float),
		       (size_t)B * Hq);
	L(hp_cuda_flash_bwd)(dqb, dkb, dvb, dob, ob, lseL, x.q, x.k, x.v, x.seg, di, B, (int)x.L, Hq, Hkv, D);
	for (int bb = 0; bb < B; bb++) {
		L(hp_cuda_bf16_to_f32)(dq + (size_t)bb * Tq * x.QD, dqb + ((size_t)bb * x.L + q0) * x.QD,
				    (size_t)Tq * x.QD);
		L(hp_cuda_bf16_to_f32)(dk + (size_t)bb * S * x.KD, dkb + (size_t)bb * x.L * x.KD, x.L * x.KD);
		L(hp_cuda_bf16_to_f32)(dv + (size_t)bb * S * x.KD, dvb + (size_t)bb * x.L * x.KD, x.L * x.KD);
		L(hp_cuda_zero)(dk + ((size_t)bb * S + x.L) * x.KD, (S - x.L) * x.KD * sizeof(float));
		L(hp_cuda_zero)(dv + ((size_t)bb * S + x.L) * x.KD, (S - x.L) * x.KD * sizeof(float));
	}
}

static size_t k_cp_attention_scratch(struct hp_backend *b, int S)
{
	return 1;   /* its own (S_DI) */
}

static void k_router_topk(struct hp_backend *b, float *probs, int32_t *sel, float *wsel, long N, int E, int K,
			  int norm)
{
	LB(hp_cuda_router_topk)(probs, sel, wsel, probs, N, E, K, norm);
}

static void k_router_bwd(struct hp_backend *b, float *dprob, const float *probs, const int32_t *sel,
			 const float *wsel, const float *dwsel, const double *aux, double aux_grad, long N, int E,
			 int K, int norm)
{
	LB(hp_cuda_router_bwd)(dprob, probs, sel, wsel, dwsel, aux_grad != 0 ? aux : NULL, aux ? aux_grad : 0, N, E,
			       K, norm);
}

static void k_router_group_fwd(struct hp_backend *b, float *probs, int32_t *sel, float *wsel, const float *bias,
			       long N, int E, int K, int G, int TG, int norm, float scale, int mask_zero)
{
	LB(hp_cuda_router_group_fwd)(probs, sel, wsel, bias, N, E, K, G, TG, norm, scale, mask_zero);
}

static void k_router_group_bwd(struct hp_backend *b, float *dlogits, const float *probs, const int32_t *sel,
			       const float *dwsel, long N, int E, int K, int norm, float scale)
{
	LB(hp_cuda_router_group_bwd)(dlogits, probs, sel, dwsel, N, E, K, norm, scale);
}

static void k_moe_route(struct hp_backend *b, int32_t *off, int32_t *row_tok, int32_t *row_slot, int32_t *tok_rows,
			int32_t *bad, int32_t *sel, long N, int E, int K)
{
	LB(hp_cuda_moe_route)(off, row_tok, row_slot, tok_rows, bad, sel, N, E, K);
}

static void k_moe_aux_acc(struct hp_backend *b, double *FP, const float *probs, const int32_t *off, long N, int E)
{
	LB(hp_cuda_moe_aux_acc)(FP, probs, off, N, E);
}

static void k_moe_aux_fin(struct hp_backend *b, double *FP, double *aux, double *acc, int E, double n, double div)
{
	LB(hp_cuda_moe_aux_fin)(FP, aux, acc, E, n, div);
}

/* every expert's rows as bf16 operands at once, every expert's working
 * copy from one region (the experts lie ws apart in it) */
static void k_grouped_fwd(struct hp_backend *b, float *y, const float *x, const float *W, size_t ws,
			  const int32_t *off, int nx, long R, int K, int O)
{
	struct cu *c = cu_of(b);
	const hp_bf16 *xb, *wb;

	if (R <= 0 || O <= 0 || nx <= 0)
		return;
	if (!(xb = as_bf16(c, S_X, x, (size_t)R * K)) || !(wb = wb_of(c, W, (size_t)(nx - 1) * ws + (size_t)O * K)))
		return;
	keep(c, L(hp_cuda_grouped_fwd)(y, xb, wb, ws, off, nx, R, K, O, &c->err));
}

static void k_grouped_bwd(struct hp_backend *b, float *dx, float *dW, size_t gs, const float *dy, const float *x,
			  const float *W, size_t ws, const int32_t *off, int nx, long R, int K, int O, int accumulate)
{
	struct cu *c = cu_of(b);
	const hp_bf16 *dyb, *xb, *wb;

	if (R <= 0 || nx <= 0)
		return;
	if (!(dyb = as_bf16(c, S_DY, dy, (size_t)R * O)) || !(xb = as_bf16(c, S_X, x, (size_t)R * K)) ||
	    !(wb = wb_of(c, W, (size_t)(nx - 1) * ws + (size_t)O * K)))
		return;
	keep(c, L(hp_cuda_grouped_bwd)(dx, dW, gs, dyb, xb, wb, ws, off, nx, R, K, O, accumulate, &c->err));
}

/* The targets counted (the ignored aside) on the host's copy: 0, or -1
 * for one outside [0, V). */
static int count_targets(const struct hp_i32 *targets, long N, int V, long *count)
{
	*count = 0;
	for (long n = 0; n < N; n++) {
		int t = targets->h[n];

		if (t == HP_IGNORE_INDEX)
			continue;
		if (t < 0 || t >= V)
			return -1;
		++*count;
	}
	return 0;
}

/* The count and range check on the host's targets, the sum on the device. */
static int k_ce_fwd(struct hp_backend *b, double *loss_sum, long *count, const float *logits,
		    const struct hp_i32 *targets, long N, int V)
{
	struct cu *c = cu_of(b);

	if (count_targets(targets, N, V, count))
		return -1;
	keep(c, L(hp_cuda_ce_loss)(loss_sum, logits, targets->d, N, V, &c->err));
	return 0;
}

static void k_ce_bwd(struct hp_backend *b, float *dlogits, const float *logits, const int32_t *targets, long N, int V,
		     float scale)
{
	LB(hp_cuda_ce_bwd)(dlogits, logits, targets, N, V, scale);
}

static void k_vp_ce_max(struct hp_backend *b, float *mx, const float *logits, long N, int Vl)
{
	LB(hp_cuda_vp_ce_max)(mx, logits, N, Vl);
}

static void k_vp_ce_sums(struct hp_backend *b, double *stats, const float *logits, const float *mx,
			 const int32_t *targets, long N, int Vl, int v0)
{
	LB(hp_cuda_vp_ce_sums)(stats, logits, mx, targets, N, Vl, v0);
}

/* the loss from the statistics onto the device's sum (hp_vp_ce_loss); the
 * count and the targets' range from the host's copy of the targets */
static int k_vp_ce_loss(struct hp_backend *b, double *loss_sum, long *count, const double *stats, const float *mx,
			const struct hp_i32 *targets, long N, int V)
{
	struct cu *c = cu_of(b);

	if (count_targets(targets, N, V, count))
		return -1;
	keep(c, L(hp_cuda_vp_ce_loss)(loss_sum, stats, mx, targets->d, N, &c->err));
	return 0;
}

static void k_vp_ce_bwd(struct hp_backend *b, float *dlogits, const float *logits, const double *stats,
			const float *mx, const int32_t *targets, long N, int Vl, int v0, float scale)
{
	LB(hp_cuda_vp_ce_bwd)(dlogits, logits, stats, mx, targets, N, Vl, v0, scale);
}

static void k_embed_fwd(struct hp_backend *b, float *out, const struct hp_i32 *ids, const float *table, long N,
			int C, int v0, int V)
{
	LB(hp_cuda_embedding_fwd)(out, ids->d, table, N, C, v0, V);
}

/* (id, index) order: a total order, so any correct sort gives the same
 * result a stable sort by id would */
static int tok_less(const int32_t *ids, int32_t a, int32_t b)
{
	return ids[a] < ids[b] || (ids[a] == ids[b] && a < b);
}

static void tok_sift(int32_t *o, const int32_t *ids, long i, long n)
{
	for (;;) {
		long ch = 2 * i + 1;
		if (ch >= n)
			break;
		if (ch + 1 < n && tok_less(ids, o[ch], o[ch + 1]))
			ch++;
		if (!tok_less(ids, o[i], o[ch]))
			break;
		int32_t t = o[i];
		o[i] = o[ch];
		o[ch] = t;
		i = ch;
	}
}

/* The tokens grouped by id for hp_cuda_embedding_bwd: the ids in [v0, v0 +
 * V) other than pad, sorted by (id, index) in place (heap sort), and where
 * each id's group starts; returns the number of groups. */
static int embed_groups(int32_t *order, int32_t *starts, const int32_t *ids, long N, int v0, int V, int pad)
{
	long kept = 0;
	int nu = 0;

	for (long i = 0; i < N; i++)
		if (ids[i] - v0 >= 0 && ids[i] - v0 < V && ids[i] != pad)
			order[kept++] = (int32_t)i;
	for (long i = kept / 2 - 1; i >= 0; i--)
		tok_sift(order, ids, i, kept);
	for (long n = kept - 1; n > 0; n--) {
		int32_t t = order[0];
		order[0] = order[n];
		order[n] = t;
		tok_sift(order, ids, 0, n);
	}
	for (long i = 0; i < kept; i++)
		if (i == 0 || ids[order[i]] != ids[order[i - 1]])
			starts[nu++] = (int32_t)i;
	starts[nu] = (int32_t)kept;
	return nu;
}

static int k_embed_bwd(struct hp_backend *b, float *dtable, const float *dout, const struct hp_i32 *ids, long N,
		       int C, int v0, int V, int pad, struct hp_err *e)
{
	struct cu *c = cu_of(b);
	size_t bytes = (size_t)N * sizeof(int32_t);
	int32_t *h = hscr(c, 2 * bytes + sizeof(int32_t)), *od, *sd;
	int nu, rc;

	if (!h || !(od = scr(c, S_ORD, bytes + 4)) || !(sd = scr(c, S_START, bytes + 4)))
		return hp_err_set(e, c->rc ? c->rc : HP_ENOMEM, "%s", c->err.msg);
	nu = embed_groups(h, h + N, ids->h, N, v0, V, pad);
	/* up copies the host scratch (to its ring, or pageable): the next call may reuse it */
	if ((rc = up(c, od, h, bytes, e)) || (rc = up(c, sd, h + N, (size_t)(nu + 1) * sizeof(int32_t), e)))
		return rc;
	if (nu)
		L(hp_cuda_embedding_bwd)(dtable, dout, ids->d, od, sd, nu, C, v0);
	return 0;
}

static void k_add(struct hp_backend *b, float *x, const float *a, const float *bb, long n)
{
	if (n > 0)
		LB(hp_cuda_add)(x, a, bb, (size_t)n);
}

static void k_add_bias(struct hp_backend *b, float *x, const float *bias, long N, int C)
{
	LB(hp_cuda_add_bias)(x, bias, N, C);
}

static void k_colsum(struct hp_backend *b, float *db, const float *x, long N, int C)
{
	LB(hp_cuda_colsum)(db, x, N, C);
}

static void k_max(struct hp_backend *b, float *x, const float *y, long n)
{
	if (n > 0)
		LB(hp_cuda_max)(x, y, (size_t)n);
}

static void k_add_f64(struct hp_backend *b, double *x, const double *y, long n)
{
	if (n > 0)
		LB(hp_cuda_add_f64)(x, y, (size_t)n);
}

static void k_bcast_heads(struct hp_backend *b, float *dst, int ldd, const float *src, int lds, long N, int H, int w)
{
	LB(hp_cuda_heads_bcast)(dst, ldd, src, lds, N, H, w);
}

static void k_sum_heads(struct hp_backend *b, float *dst, int ldd, const float *src, int lds, long N, int H, int w)
{
	LB(hp_cuda_heads_sum)(dst, ldd, src, lds, N, H, w);
}

static void k_gather_rows(struct hp_backend *b, float *dst, const float *src, const int32_t *idx, long R, int C)
{
	LB(hp_cuda_gather_rows)(dst, src, idx, R, C);
}

static void k_scatter_rows(struct hp_backend *b, float *dst, const float *src, const int32_t *idx, long R, int C)
{
	LB(hp_cuda_scatter_rows)(dst, src, idx, R, C);
}

static void k_moe_combine(struct hp_backend *b, float *out, const float *ye, const float *wsel,
			  const struct hp_route *rt, long N, int K, int C)
{
	LB(hp_cuda_combine)(out, ye, wsel, rt->tok_rows, rt->row_slot, N, K, C);
}

static void k_moe_combine_bwd(struct hp_backend *b, float *dye, float *dwsel, const float *dout, const float *ye,
			      const float *wsel, const struct hp_route *rt, long N, int K, int C)
{
	LB(hp_cuda_combine_bwd)(dye, dwsel, dout, ye, wsel, rt->row_tok, rt->row_slot, N * K, K, C);
}

static void k_moe_scatter_add(struct hp_backend *b, float *dx, const float *dxe, const struct hp_route *rt, long N,
			      int K, int C)
{
	LB(hp_cuda_scatter_add_rows)(dx, dxe, rt->tok_rows, N, K, C);
}

static int k_sumsq_acc(struct hp_backend *b, double *acc, const float *x, size_t n, struct hp_err *e)
{
	struct cu *c = cu_of(b);

	if (c->rc)
		return hp_err_set(e, c->rc, "%s", c->err.msg);
	return n ? L(hp_cuda_sumsq)(acc, x, n, e) : 0;
}

static void k_scale(struct hp_backend *b, float *x, float s, size_t n)
{
	if (n)
		LB(hp_cuda_scale)(x, s, n);
}

/* the working copy follows where w is a registered region's */
static void k_adamw(struct hp_backend *b, float *w, const float *g, float *m, float *v, size_t n,
		    const struct hp_adamw_hparams *h, int decay, const float *cg)
{
	hp_bf16 *wb = region_wb(cu_of(b), w, n);

	if (n)
		LB(hp_cuda_adamw)(w, wb, g, m, v, n, h->lr, h->beta1, h->beta2, h->eps, h->weight_decay, h->step, decay,
				  cg);
}

static void k_clip_gate(struct hp_backend *b, float *g, size_t n, float *cg, const double *ss, const double *loss,
			const double *aux, const int32_t *bad, double max_norm, int check)
{
	LB(hp_cuda_clip_gate)(g, n, cg, ss, loss, aux, bad, max_norm, check);
}

/* ---- collectives ---- */

/*
 * Host-staged: the wire carries the buffer's elements as they are in
 * device memory, except bf16 held in fp32 (the emulation), which travels
 * as F32 while counting as BF16; a reduction of bf16 sums in fp32 on the
 * host and rounds once.
 */
static enum hp_dtype wire_of(enum hp_dtype t)
{
	return t == HP_DTYPE_BF16 && sizeof(hp_bf16) == sizeof(float) ? HP_DTYPE_F32 : t;
}

/* A collective whose counting is done here (the wire type differs). */
static void quiet(struct hp_comm *c, int on)
{
	c->quiet += on ? 1 : -1;
}

/* ... counted here, unless a caller counts it as the call it is part of */
static void tally(struct hp_comm *c, enum hp_coll op, uint64_t bytes, int routed)
{
	if (!c->quiet)
		hp_comm_count(c, op, bytes, routed);
}

#if USE_NCCL
static struct hp_nccl *nccl_of(struct cu *c, struct hp_comm *cm)
{
	return c->nccl && cm->dim >= 0 && cm->dim <= HP_NDIM && c->nc[cm->dim].c == cm ? &c->nc[cm->dim] : NULL;
}

static void *next_ev(struct cu *c)
{
	c->evi = (c->evi + 1) % NEV;
	return c->ev[c->evi];
}

/* nc's stream after the compute so far */
static int nc_in(struct cu *c, struct hp_nccl *nc, struct hp_err *e)
{
	return hp_nccl_order(hp_cuda_stream(), nc->stream, next_ev(c), e);
}

/* the compute after nc's stream */
static int nc_out(struct cu *c, struct hp_nccl *nc, struct hp_err *e)
{
	return hp_nccl_order(nc->stream, hp_cuda_stream(), next_ev(c), e);
}

/* A started collective's end on nc's stream, marked with r's own event
 * (made on first use): wait makes the compute stream wait for it alone,
 * not for what nc's stream took on after (a later reduce-scatter). */
static int req_mark(struct hp_nccl *nc, struct hp_breq *r, struct hp_err *e)
{
	int rc = r->ev ? 0 : hp_nccl_event_new(&r->ev, e);

	return rc ? rc : hp_nccl_mark(nc->stream, r->ev, e);
}
#define NCCL_CALL(call) do { \
		struct hp_nccl *nc_ = nccl_of(c, cm); \
		if (nc_) { \
			int rc_ = nc_in(c, nc_, e); \
			if (!rc_) \
				rc_ = (call); \
			return rc_ ? rc_ : nc_out(c, nc_, e); \
		} \
	} while (0)
#define NC nc_
#else
#define NCCL_CALL(call) do { } while (0)
#endif

/* A fp32 all-reduce host-staged: MPI sums it on the host. */
static int staged_allreduce(struct cu *c, struct hp_comm *cm, void *buf, size_t n, enum hp_dtype t, int op,
			    struct hp_err *e)
{
	size_t es = k_esize(&c->b, t);
	char *h = hscr(c, n * es);
	int rc;

	if (!h)
		return hp_err_set(e, c->rc, "%s", c->err.msg);
	if ((rc = k_download(&c->b, h, buf, n * es, e)) || (rc = hp_comm_allreduce(cm, h, n, t, (enum hp_red)op, e)))
		return rc;
	return k_upload(&c->b, buf, h, n * es, e);
}

/*
 * The emulation's check of a started collective's ordering: on a GPU NCCL
 * reads the send buffer and writes recv while the compute stream runs on,
 * so the compute must not write the one or read the other before wait.
 * The staged path has copied the sent bytes by then, so the emulation
 * would not notice: it fills recv with NaN until wait (a read too early
 * brings NaN into the numbers) and compares the send buffer's crc at wait
 * with the one at the start (a write in between is an error).  Device
 * memory is the host's there.  Nothing on a GPU.
 */
static void emu_started(struct hp_breq *r, const void *send, size_t sbytes, void *recv, size_t rbytes)
{
#ifdef HP_CUDA_EMU
	r->sent = send;
	r->sent_bytes = sbytes;
	r->crc = hp_crc32c(0, send, sbytes);
	memset(recv, 0xff, rbytes);
#else
	(void)r, (void)send, (void)sbytes, (void)recv, (void)rbytes;
#endif
}

static int emu_landed(const struct hp_breq *r, struct hp_err *e)
{
#ifdef HP_CUDA_EMU
	if (r->sent && hp_crc32c(0, r->sent, r->sent_bytes) != r->crc)
		return hp_err_set(e, HP_EINVAL, "cuda emulation: a collective's send buffer (%zu bytes) was written "
				  "while the collective was in flight, which races with NCCL on a GPU", r->sent_bytes);
#else
	(void)r, (void)e;
#endif
	return 0;
}

/* The bf16 rule on the host (staged collectives): k blocks of n, one after
 * another, summed into out (which may be in).  hp_bf16_sum_ranks on a
 * GPU's bf16; the emulation's twin of the kernel on its fp32 shadows,
 * which is a host function there. */
static void host_sum_ranks(hp_bf16 *out, const hp_bf16 *in, int k, size_t n)
{
#ifdef HP_CUDA_EMU
	hp_cuda_bf16_sum_ranks(out, in, k, n, n);
#else
	hp_bf16_sum_ranks(out, in, k, n, n);
#endif
}

static int k_ireduce_scatter(struct hp_backend *b, struct hp_comm *cm, const void *send, void *recv, size_t n,
			     enum hp_dtype t, int op, struct hp_breq *r, struct hp_err *e)
{
	struct cu *c = cu_of(b);
	size_t es = k_esize(b, t), k = (size_t)cm->size;
	int bf = t == HP_DTYPE_BF16, rc;

	r->active = 0;
	r->req = MPI_REQUEST_NULL;
	r->nc = r->sum = NULL;
	r->sent = NULL;
	if (k <= 1) {
		k_copy(b, recv, send, n * es);
		return 0;
	}
	if (bf && op != HP_RED_SUM)
		return hp_err_set(e, HP_EUNSUP, "cuda: a bf16 reduce-scatter sums only");
	r->active = 1;
	r->sum = bf ? recv : NULL;
	r->k = (int)k;
	r->n = n;
#if USE_NCCL
	struct hp_nccl *nc = nccl_of(c, cm);
	if (nc) {
		r->nc = nc;
		if ((rc = nc_in(c, nc, e)) || (rc = hp_nccl_reduce_scatter(nc, send, recv, n, t, (enum hp_red)op, e)))
			return rc;
		return req_mark(nc, r, e);
	}
#else
	(void)c;
#endif
	/* host-staged: the blocks (bf16: summed on the host by the rule in
	 * wait) or MPI's fp32 sum land in the stage after the sent blocks; n
	 * go up */
	r->recv = recv;
	r->off = k * n * es;
	r->bytes = n * es;
	if (!host_grow(&r->stage, &r->cap, r->off + (bf ? k * n * es : r->bytes)))
		return hp_err_set(e, HP_ENOMEM, "cuda: out of host memory staging a reduce-scatter of %zu MiB",
				  (k * n * es) >> 20);
	if ((rc = k_download(b, r->stage, send, k * n * es, e)))
		return rc;
	emu_started(r, send, k * n * es, recv, r->bytes);
	if (!bf)
		return hp_comm_ireduce_scatter(cm, r->stage, (char *)r->stage + r->off, n, t, (enum hp_red)op,
					       &r->req, e);
	quiet(cm, 1);
	rc = hp_comm_ialltoall(cm, r->stage, (char *)r->stage + r->off, n, wire_of(t), &r->req, e);
	quiet(cm, 0);
	if (!rc)
		tally(cm, HP_COLL_REDUCE_SCATTER, (uint64_t)k * n * hp_dtype_size(t), 0);
	return rc;
}

static int k_wait(struct hp_backend *b, struct hp_breq *r, struct hp_err *e)
{
	char *got = (char *)r->stage + r->off;
	int rc;

	if (!r->active)
		return 0;
	r->active = 0;
#if USE_NCCL
	if (r->nc) {
		/* the compute after the collective's end; a bf16 sum's blocks
		 * added up where they landed */
		if (!(rc = hp_nccl_after(hp_cuda_stream(), r->ev, e)) && r->sum) {
			struct cu *c = cu_of(b);

			L(hp_cuda_bf16_sum_ranks)(r->sum, r->sum, r->k, r->n, r->n);
		}
		return rc;
	}
#endif
	if (r->req != MPI_REQUEST_NULL)
		hp_comm_wait(&r->req);
	if ((rc = emu_landed(r, e)))
		return rc;
	if (r->sum)
		host_sum_ranks((hp_bf16 *)got, (const hp_bf16 *)got, r->k, r->n);
	/* the upload has read the stage when it returns (a copy into the
	 * pinned ring, or CUDA's staging of pageable memory), and the
	 * request's next use starts with a download, which waits for the
	 * stream: no wait here */
	return k_upload(b, r->recv, got, r->bytes, e);
}

static int k_reduce_scatter(struct hp_backend *b, struct hp_comm *cm, const void *send, void *recv, size_t n,
			    enum hp_dtype t, int op, struct hp_err *e)
{
	struct hp_breq *r = &cu_of(b)->rreq;
	int rc = k_ireduce_scatter(b, cm, send, recv, n, t, op, r, e);

	return rc ? rc : k_wait(b, r, e);
}

#if USE_NCCL
static int k_iallgather(struct hp_backend *b, struct hp_comm *cm, const void *send, void *recv, size_t n,
			enum hp_dtype t, struct hp_breq *r, struct hp_err *e);

/* A bf16 sum over ranks by the rule (backend.h) over NCCL: a
 * reduce-scatter of chunks of ceil(n / k) (buf padded with zeros to k
 * chunks; the blocks land after them, summed on the device), then an
 * all-gather of the sums back into buf; counted as the one all-reduce it
 * is. */
static int nccl_bf16_allreduce(struct cu *c, struct hp_comm *cm, void *buf, size_t n, struct hp_err *e)
{
	struct hp_backend *b = &c->b;
	size_t k = (size_t)cm->size, ch = (n + k - 1) / k, es = k_esize(b, HP_DTYPE_BF16);
	char *blocks = (char *)buf + k * ch * es;
	int rc;

	if (k * ch > n)
		k_zero(b, (char *)buf + n * es, (k * ch - n) * es);
	quiet(cm, 1);
	rc = k_reduce_scatter(b, cm, buf, blocks, ch, HP_DTYPE_BF16, HP_RED_SUM, e);
	if (!rc && !(rc = k_iallgather(b, cm, blocks, buf, ch, HP_DTYPE_BF16, &c->greq, e)))
		rc = k_wait(b, &c->greq, e);
	quiet(cm, 0);
	if (!rc)
		tally(cm, HP_COLL_ALL_REDUCE, (uint64_t)n * hp_dtype_size(HP_DTYPE_BF16), 0);
	return rc;
}
#endif

/* The same host-staged: every rank's n values gathered on the host and
 * summed there by the rule. */
static int staged_bf16_allreduce(struct cu *c, struct hp_comm *cm, void *buf, size_t n, struct hp_err *e)
{
	size_t k = (size_t)cm->size, es = k_esize(&c->b, HP_DTYPE_BF16);
	char *h = hscr(c, (k + 1) * n * es);
	int rc;

	if (!h)
		return hp_err_set(e, c->rc, "%s", c->err.msg);
	if ((rc = k_download(&c->b, h, buf, n * es, e)))
		return rc;
	quiet(cm, 1);
	rc = hp_comm_allgather(cm, h, h + n * es, n, wire_of(HP_DTYPE_BF16), e);
	quiet(cm, 0);
	if (rc)
		return rc;
	tally(cm, HP_COLL_ALL_REDUCE, (uint64_t)n * hp_dtype_size(HP_DTYPE_BF16), 0);
	host_sum_ranks((hp_bf16 *)h, (const hp_bf16 *)(h + n * es), (int)k, n);
	return k_upload(&c->b, buf, h, n * es, e);
}

static int k_allreduce(struct hp_backend *b, struct hp_comm *cm, void *buf, size_t n, enum hp_dtype t, int op,
		       struct hp_err *e)
{
	struct cu *c = cu_of(b);

	if (cm->size <= 1 || !n)
		return 0;
	if (t == HP_DTYPE_BF16) {
		if (op != HP_RED_SUM)
			return hp_err_set(e, HP_EUNSUP, "cuda: a bf16 all-reduce sums only");
#if USE_NCCL
		if (nccl_of(c, cm))
			return nccl_bf16_allreduce(c, cm, buf, n, e);
#endif
		return staged_bf16_allreduce(c, cm, buf, n, e);
	}
	NCCL_CALL(hp_nccl_allreduce(NC, buf, n, t, (enum hp_red)op, e));
	return staged_allreduce(c, cm, buf, n, t, op, e);
}

/* Start an all-gather: staged, the shard comes to the host now and MPI
 * runs while the host goes on; the result goes up in wait.  NCCL: queued
 * on the group's stream, which the compute waits for in wait. */
static int k_iallgather(struct hp_backend *b, struct hp_comm *cm, const void *send, void *recv, size_t n,
			enum hp_dtype t, struct hp_breq *r, struct hp_err *e)
{
	struct cu *c = cu_of(b);
	size_t es = k_esize(b, t);
	enum hp_dtype w = wire_of(t);
	int rc;

	r->active = 0;
	r->req = MPI_REQUEST_NULL;
	r->nc = r->sum = NULL;
	r->sent = NULL;
	if (cm->size <= 1) {
		k_copy(b, recv, send, n * es);
		return 0;
	}
	r->active = 1;
#if USE_NCCL
	struct hp_nccl *nc = nccl_of(c, cm);
	if (nc) {
		r->nc = nc;
		if ((rc = nc_in(c, nc, e)) || (rc = hp_nccl_allgather(nc, send, recv, n, t, e)))
			return rc;
		return req_mark(nc, r, e);
	}
#endif
	r->recv = recv;
	r->off = n * es;
	r->bytes = (size_t)cm->size * n * es;
	/* the request keeps its staging for the next gather (hp_backend.req_free) */
	if (!host_grow(&r->stage, &r->cap, r->off + r->bytes))
		return hp_err_set(e, HP_ENOMEM, "cuda: out of host memory staging an all-gather of %zu MiB",
				  r->bytes >> 20);
	if ((rc = k_download(b, r->stage, send, n * es, e)))
		return rc;
	emu_started(r, send, n * es, recv, r->bytes);
	if (w != t)
		quiet(cm, 1);
	rc = hp_comm_iallgather(cm, r->stage, (char *)r->stage + r->off, n, w, &r->req, e);
	if (w != t) {
		quiet(cm, 0);
		if (!rc)
			tally(cm, HP_COLL_ALL_GATHER, (uint64_t)n * hp_dtype_size(t), 0);
	}
	(void)c;
	return rc;
}

static void k_req_free(struct hp_backend *b, struct hp_breq *r)
{
#if USE_NCCL
	if (r->ev)
		hp_nccl_event_free(r->ev);
	r->ev = NULL;
#endif
	hp_free(r->stage);
	r->stage = NULL;
	r->cap = 0;
}

/* started and finished at once, on the backend's own request (its staging reused) */
static int k_allgather(struct hp_backend *b, struct hp_comm *cm, const void *send, void *recv, size_t n,
		       enum hp_dtype t, struct hp_err *e)
{
	struct hp_breq *r = &cu_of(b)->greq;
	int rc = k_iallgather(b, cm, send, recv, n, t, r, e);

	return rc ? rc : k_wait(b, r, e);
}

/* all-to-all(v): no reduction, the elements travel as they are */
static int staged_a2a(struct cu *c, struct hp_comm *cm, const void *send, const int *sc, const int *sd, void *recv,
		      const int *rc_, const int *rd, size_t n, enum hp_dtype t, int v, int routed, struct hp_err *e)
{
	size_t es = k_esize(&c->b, t), sn = 0, rn = 0;
	enum hp_dtype w = wire_of(t);
	char *h;
	int rc;

	for (int p = 0; p < cm->size; p++) {
		if (!v)
			continue;
		if ((size_t)sd[p] + (size_t)sc[p] > sn)
			sn = (size_t)sd[p] + (size_t)sc[p];
		if ((size_t)rd[p] + (size_t)rc_[p] > rn)
			rn = (size_t)rd[p] + (size_t)rc_[p];
	}
	if (!v)
		sn = rn = (size_t)cm->size * n;
	if (!(h = hscr(c, (sn + rn) * es + 8)))
		return hp_err_set(e, c->rc, "%s", c->err.msg);
	if ((rc = k_download(&c->b, h, send, sn * es, e)))
		return rc;
	if (w != t)
		quiet(cm, 1);
	rc = v ? hp_comm_alltoallv(cm, h, sc, sd, h + sn * es, rc_, rd, w, routed, e) :
		 hp_comm_alltoall(cm, h, h + sn * es, n, w, e);
	if (w != t) {
		quiet(cm, 0);
		if (!rc) {
			uint64_t tot = 0;
			for (int p = 0; v && p < cm->size; p++)
				tot += (uint64_t)sc[p];
			tally(cm, v ? HP_COLL_ALL_TO_ALLV : HP_COLL_ALL_TO_ALL,
				      (v ? tot : (uint64_t)cm->size * n) * hp_dtype_size(t), routed);
		}
	}
	return rc ? rc : k_upload(&c->b, recv, h + sn * es, rn * es, e);
}

static int k_alltoall(struct hp_backend *b, struct hp_comm *cm, const void *send, void *recv, size_t n,
		      enum hp_dtype t, struct hp_err *e)
{
	struct cu *c = cu_of(b);

	if (cm->size <= 1) {
		k_copy(b, recv, send, n * k_esize(b, t));
		return 0;
	}
	NCCL_CALL(hp_nccl_alltoall(NC, send, recv, n, t, e));
	return staged_a2a(c, cm, send, NULL, NULL, recv, NULL, NULL, n, t, 0, 0, e);
}

static int k_alltoallv(struct hp_backend *b, struct hp_comm *cm, const void *send, const int *scounts,
		       const int *sdispls, void *recv, const int *rcounts, const int *rdispls, enum hp_dtype t,
		       int routed, struct hp_err *e)
{
	struct cu *c = cu_of(b);

	if (cm->size <= 1) {
		size_t es = k_esize(b, t);
		k_copy(b, (char *)recv + (size_t)rdispls[0] * es, (const char *)send + (size_t)sdispls[0] * es,
		       (size_t)scounts[0] * es);
		return 0;
	}
	NCCL_CALL(hp_nccl_alltoallv(NC, send, scounts, sdispls, recv, rcounts, rdispls, t, routed, e));
	return staged_a2a(c, cm, send, scounts, sdispls, recv, rcounts, rdispls, 0, t, 1, routed, e);
}

/* Pipeline stages' activations: NCCL's send and receive, or through the
 * host (what travels: fp32 activations, fp64 router statistics). */
static int k_sendrecv(struct hp_backend *b, struct hp_comm *cm, const struct hp_p2p *ops, int n, struct hp_err *e)
{
	struct cu *c = cu_of(b);
	struct hp_p2p h[HP_P2P_MAX];
	size_t at = 0;
	char *base;
	int rc;

	if (n > HP_P2P_MAX)
		return hp_err_set(e, HP_EINVAL, "%s: point-to-point of %d transfers at once, %d at most", b->name, n,
				  HP_P2P_MAX);
	for (int i = 0; i < n; i++) {
		if (ops[i].t != HP_DTYPE_F32 && ops[i].t != HP_DTYPE_F64 && ops[i].t != HP_DTYPE_I32)
			return hp_err_set(e, HP_EINVAL, "%s: point-to-point of %s: fp32, fp64 or int32 only", b->name,
					  hp_dtype_name(ops[i].t));
		at += (ops[i].n * hp_dtype_size(ops[i].t) + 7) & ~(size_t)7;
	}
	NCCL_CALL(hp_nccl_sendrecv(NC, ops, n, e));
	if (!(base = hscr(c, at + 8)))
		return hp_err_set(e, c->rc, "%s", c->err.msg);
	at = 0;
	for (int i = 0; i < n; i++) {
		size_t bytes = ops[i].n * hp_dtype_size(ops[i].t);

		h[i] = ops[i];
		if (ops[i].send) {
			h[i].send = base + at;
			if ((rc = k_download(b, base + at, ops[i].send, bytes, e)))
				return rc;
		} else {
			h[i].recv = base + at;
		}
		at += (bytes + 7) & ~(size_t)7;
	}
	if ((rc = hp_comm_sendrecv(cm, h, n, e)))
		return rc;
	for (int i = 0; i < n; i++)
		if (!ops[i].send && (rc = k_upload(b, ops[i].recv, h[i].recv, ops[i].n * hp_dtype_size(ops[i].t), e)))
			return rc;
	return 0;
}

/*
 * NCCL for the dims of cs, when each rank has a GPU of its own (not
 * shared), this build has NCCL, and HP_CUDA_COMM is not "staged"; a
 * group per dim of size > 1, made in dim order on every rank.
 */
static int k_attach(struct hp_backend *b, struct hp_comms *cs, struct hp_err *e)
{
	struct cu *c = cu_of(b);

#if USE_NCCL
	int ok = !c->shared && c->comm_want != 2, all = ok, rc;

	/* every rank decides alike: NCCL only where all of them can */
	hp_comm_allreduce_raw(MPI_COMM_WORLD, &all, 1, MPI_INT, MPI_MIN);
	if (!all) {
		if (c->comm_want == 1)
			return hp_err_set(e, HP_EUNSUP, "HP_CUDA_COMM=nccl: ranks share a GPU, and NCCL wants "
					  "one GPU per rank");
		return 0;
	}
	for (int i = 0; i < NEV; i++)
		if ((rc = hp_nccl_event_new(&c->ev[i], e)))
			return rc;
	/* the mesh dims' groups (the world's collectives are the host's) */
	for (int d = 0; d < HP_NDIM; d++)
		if (cs->dim[d].size > 1 && (rc = hp_nccl_init(&c->nc[d], &cs->dim[d], e)))
			return rc;
	c->nccl = 1;
#else
	if (c->comm_want == 1)
		return hp_err_set(e, HP_EUNSUP, "HP_CUDA_COMM=nccl: %s", sizeof(hp_bf16) == 4 ?
				  "the emulation carries device buffers host-staged" : "hp was built without NCCL");
#endif
	(void)c;
	(void)cs;
	return 0;
}

static const char *k_comm_path(struct hp_backend *b)
{
	return cu_of(b)->nccl ? "nccl" : "host-staged";
}

static int k_kernel_times(struct hp_backend *b, double ms[], struct hp_err *e)
{
	struct cu *c = cu_of(b);
	int rc = 0;

	for (int f = 0; f < HP_KF_N; f++)
		ms[f] = 0;
	if (!c->np)
		return 0;
	hp_cuda_timer_mark(c->timer, c->np);
	if (!(rc = dev_idle(c, e)) && !(rc = hp_cuda_sync(e)))
		for (int i = 0; i < c->np; i++)
			ms[c->pfam[i]] += hp_cuda_timer_ms(c->timer, i, i + 1);
	c->np = 0;
	return rc;
}

static void k_close(struct hp_backend *b)
{
	struct cu *c = cu_of(b);

#if USE_NCCL
	for (int d = 0; d <= HP_NDIM; d++)
		hp_nccl_free(&c->nc[d]);
	for (int i = 0; i < NEV; i++)
		hp_nccl_event_free(c->ev[i]);
#endif
	for (int i = 0; i < NREGION; i++)
		k_free(b, c->reg[i].wb);
	for (int i = 0; i < NSPARSE; i++)
		sp_free(c, &c->sp[i]);
	hp_cuda_timer_free(c->timer, PROF_MAX + 1);
	for (int i = 0; i < NSCR; i++)
		dev_free(c, c->scr[i]);
	/* the retired blocks, once nothing in flight can read them */
	for (int i = c->nblk - 1, synced = 0; i >= 0; i--)
		if (c->blk[i].retired) {
			if (!synced++)
				keep(c, dev_sync(c, &c->err));
			dev_free(c, c->blk[i].p);
		}
	hp_free(c->blk);
	hp_free(c->host);
	/* the ring, once the stream has read it */
	for (int i = 0; i < RING_MARKS; i++) {
		keep(c, ring_retire(c, &c->rm[i], &c->err));
		hp_cuda_mark_free(c->rm[i].mk);
	}
	hp_cuda_host_free(c->ring);
	k_req_free(b, &c->greq);
	k_req_free(b, &c->rreq);
	hp_cuda_fini();
	hp_free(c);
}

static const struct hp_backend table = {
	.kind = HP_BACKEND_CUDA,
	.device = 1,
	.alloc = k_alloc,
	.alloc_as = k_alloc_as,
	.free = k_free,
	.upload = k_upload,
	.download = k_download,
	.copy = k_copy,
	.copy2d = k_copy2d,
	.zero = k_zero,
	.release = k_release,
	.reserve = k_reserve,
	.commit = k_commit,
	.prepare = k_prepare,
	.discard = k_discard,
	.sync = k_sync,
	.put = k_put,
	.get = k_get,
	.esize = k_esize,
	.convert = k_convert,
	.acc = k_acc,
	.weights = k_weights,
	.weights_changed = k_weights_changed,
	.copy_only = k_copy_only,
	.linear_fwd = k_linear_fwd,
	.linear_bwd = k_linear_bwd,
	.rmsnorm_fwd = k_rmsnorm_fwd,
	.rmsnorm_bwd = k_rmsnorm_bwd,
	.rmsnorm_res_fwd = k_rmsnorm_res_fwd,
	.rmsnorm_res_bwd = k_rmsnorm_bwd,
	.rope_fwd = k_rope_fwd,
	.rope_bwd = k_rope_bwd,
	.swiglu_fwd = k_swiglu_fwd,
	.swiglu_bwd = k_swiglu_bwd,
	.swiglu_rows_fwd = k_swiglu_rows_fwd,
	.swiglu_rows_bwd = k_swiglu_rows_bwd,
	.sinks_fwd = k_sinks_fwd,
	.sinks_bwd = k_sinks_bwd,
	.conv1d_silu_fwd = k_conv1d_silu_fwd,
	.conv1d_silu_bwd = k_conv1d_silu_bwd,
	.l2norm_fwd = k_l2norm_fwd,
	.l2norm_bwd = k_l2norm_bwd,
	.gdn_gates_fwd = k_gdn_gates_fwd,
	.gdn_gates_bwd = k_gdn_gates_bwd,
	.gdr_scratch = k_gdr_scratch,
	.gdr_fwd = k_gdr_fwd,
	.gdr_bwd = k_gdr_bwd,
	.rmsnorm_gated_fwd = k_rmsnorm_gated_fwd,
	.rmsnorm_gated_bwd = k_rmsnorm_gated_bwd,
	.sigmoid_gate_fwd = k_sigmoid_gate_fwd,
	.sigmoid_gate_bwd = k_sigmoid_gate_bwd,
	.sigmoid_gate_rows_fwd = k_sigmoid_gate_rows_fwd,
	.sigmoid_gate_rows_bwd = k_sigmoid_gate_rows_bwd,
	.glu_clamp_fwd = k_glu_clamp_fwd,
	.glu_clamp_bwd = k_glu_clamp_bwd,
	.bias_grouped_fwd = k_bias_grouped_fwd,
	.bias_grouped_bwd = k_bias_grouped_bwd,
	.has_eager = 0,
	.attention_fwd = k_attention_fwd,
	.attention_bwd = k_attention_bwd,
	.flash_supports = k_flash_supports,
	.flash_fwd = k_flash_fwd,
	.flash_bwd = k_flash_bwd,
	.flash_scratch = k_flash_scratch,
	.cp_attention_fwd = k_cp_attention_fwd,
	.cp_attention_bwd = k_cp_attention_bwd,
	.cp_attention_scratch = k_cp_attention_scratch,
	.router_topk = k_router_topk,
	.router_bwd = k_router_bwd,
	.router_group_fwd = k_router_group_fwd,
	.router_group_bwd = k_router_group_bwd,
	.moe_route = k_moe_route,
	.moe_aux_acc = k_moe_aux_acc,
	.moe_aux_fin = k_moe_aux_fin,
	.grouped_fwd = k_grouped_fwd,
	.grouped_bwd = k_grouped_bwd,
	.ce_fwd = k_ce_fwd,
	.ce_bwd = k_ce_bwd,
	.vp_ce_max = k_vp_ce_max,
	.vp_ce_sums = k_vp_ce_sums,
	.vp_ce_loss = k_vp_ce_loss,
	.vp_ce_bwd = k_vp_ce_bwd,
	.embed_fwd = k_embed_fwd,
	.embed_bwd = k_embed_bwd,
	.add = k_add,
	.add_bias = k_add_bias,
	.colsum = k_colsum,
	.max = k_max,
	.add_f64 = k_add_f64,
	.gather_rows = k_gather_rows,
	.bcast_heads = k_bcast_heads,
	.sum_heads = k_sum_heads,
	.scatter_rows = k_scatter_rows,
	.moe_combine = k_moe_combine,
	.moe_combine_bwd = k_moe_combine_bwd,
	.moe_scatter_add = k_moe_scatter_add,
	.sumsq_acc = k_sumsq_acc,
	.scale = k_scale,
	.adamw = k_adamw,
	.clip_gate = k_clip_gate,
	.allreduce = k_allreduce,
	.allgather = k_allgather,
	.iallgather = k_iallgather,
	.wait = k_wait,
	.req_free = k_req_free,
	.reduce_scatter = k_reduce_scatter,
	.ireduce_scatter = k_ireduce_scatter,
	.kernel_times = k_kernel_times,
	.alltoall = k_alltoall,
	.alltoallv = k_alltoallv,
	.sendrecv = k_sendrecv,
	.attach = k_attach,
	.comm_path = k_comm_path,
	.close = k_close,
};

/* The backend on device dev (the emulation: its rounding), named. */
#ifdef HP_CUDA_EMU
int hp_backend_cuda_emu_new(struct hp_backend **bp, int round_bf16, struct hp_err *e)
#else
int hp_backend_cuda_gpu_new(struct hp_backend **bp, int dev, int shared, struct hp_err *e)
#endif
{
	const char *want = getenv("HP_CUDA_COMM");
	char dn[128] = "";
	size_t total;
	struct cu *c;
	int rc;

	*bp = NULL;
	/* read here, so that a bad value is refused on one rank too */
	if (want && *want && strcmp(want, "nccl") && strcmp(want, "staged"))
		return hp_err_set(e, HP_ECONFIG, "HP_CUDA_COMM=%s: expected nccl or staged", want);
	if (!(c = hp_calloc(1, sizeof(*c))))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	c->b = table;
	c->comm_want = !want || !*want ? 0 : !strcmp(want, "nccl") ? 1 : 2;
#ifdef HP_CUDA_EMU
	c->b.kind = HP_BACKEND_CUDA_EMU;
	hp_emu_round_bf16(round_bf16);
	int dev = 0;
#else
	c->shared = shared;
#endif
	if ((rc = hp_cuda_init(dev, e)) || (rc = hp_cuda_device_name(dev, dn, sizeof(dn), e)) ||
	    (rc = hp_cuda_reserve(8192, e)) || (rc = hp_cuda_mem_info(&c->b.dev_free, &total, e))) {
		hp_cuda_fini();
		hp_free(c);
		return rc;
	}
	snprintf(c->name, sizeof(c->name), "cuda:%d %s", dev, dn);
	c->b.name = c->name;
	*bp = &c->b;
	return 0;
}

#ifdef HP_CUDA_EMU
const struct hp_backend *hp_backend_cuda_sizing(void)
{
	return &table;
}
#endif

#endif /* HP_CUDA_EMU || HP_HAVE_CUDA */
