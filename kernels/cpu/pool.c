/*
 * pool.c - the CPU kernels' worker pool (pool.h).
 *
 * Workers wait on a condition variable for a new job (a generation count),
 * run their part, and the last to finish signals the caller.  A job is a
 * function and its context; the pool holds one at a time (busy), and a
 * second caller runs its work on its own thread instead of waiting.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "cpu/pool.h"

#define HP_POOL_MAX_THREADS 64

static struct {
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	int nthreads;           /* including the caller; 0 until decided */
	int started;            /* workers running */
	int busy;               /* a caller is using the pool */
	long gen;               /* bumped for every job */
	int pending;            /* workers not finished with the current job */
	void (*fn)(void *, int, int);
	void *ctx;
} pool = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
	   0, 0, 0, 0, 0, NULL, NULL };

/* A forked child has none of the parent's workers (fork copies only the
 * calling thread): it starts its own pool, sized from its own environment,
 * on first use. */
static void pool_forget(void)
{
	pthread_mutex_init(&pool.mu, NULL);
	pthread_cond_init(&pool.go, NULL);
	pthread_cond_init(&pool.done, NULL);
	pool.nthreads = pool.started = pool.busy = pool.pending = 0;
	pool.gen = 0;
}

__attribute__((constructor)) static void pool_atfork(void)
{
	pthread_atfork(NULL, NULL, pool_forget);
}

static int env_threads(void)
{
	const char *names[] = { "HP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS" };
	long n = 0;

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && n <= 0; i++) {
		const char *v = getenv(names[i]);
		if (v && *v)
			n = strtol(v, NULL, 10);
	}
	if (n <= 0)
		n = sysconf(_SC_NPROCESSORS_ONLN);
	if (n < 1)
		n = 1;
	return n > HP_POOL_MAX_THREADS ? HP_POOL_MAX_THREADS : (int)n;
}

static void *worker(void *arg)
{
	int id = (int)(intptr_t)arg;
	long seen = 0;

	for (;;) {
		void (*fn)(void *, int, int);
		void *ctx;
		int n;

		pthread_mutex_lock(&pool.mu);
		while (pool.gen == seen)
			pthread_cond_wait(&pool.go, &pool.mu);
		seen = pool.gen;
		fn = pool.fn;
		ctx = pool.ctx;
		n = pool.nthreads;
		pthread_mutex_unlock(&pool.mu);
		fn(ctx, id, n);
		pthread_mutex_lock(&pool.mu);
		if (--pool.pending == 0)
			pthread_cond_signal(&pool.done);
		pthread_mutex_unlock(&pool.mu);
	}
	return NULL;
}

int hp_pool_threads(void)
{
	pthread_mutex_lock(&pool.mu);
	if (!pool.nthreads)
		pool.nthreads = env_threads();
	int n = pool.nthreads;
	pthread_mutex_unlock(&pool.mu);
	return n;
}

/* Claim the pool for one job; 0 when it cannot be used (one thread asked
 * for, workers failed to start, or another caller holds it). */
static int pool_claim(void)
{
	int ok = 0;

	pthread_mutex_lock(&pool.mu);
	if (!pool.nthreads)
		pool.nthreads = env_threads();
	if (pool.nthreads > 1 && !pool.started) {
		pthread_attr_t at;
		pthread_t t;
		int i;

		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		for (i = 1; i < pool.nthreads; i++)
			if (pthread_create(&t, &at, worker, (void *)(intptr_t)i))
				break;
		pthread_attr_destroy(&at);
		pool.nthreads = i;              /* as many as started */
		pool.started = 1;
	}
	if (pool.nthreads > 1 && !pool.busy)
		ok = pool.busy = 1;
	pthread_mutex_unlock(&pool.mu);
	return ok;
}

int hp_pool_run(void (*fn)(void *ctx, int part, int nparts), void *ctx)
{
	int n;

	if (!pool_claim())
		return -1;
	pthread_mutex_lock(&pool.mu);
	pool.fn = fn;
	pool.ctx = ctx;
	n = pool.nthreads;
	pool.pending = n - 1;
	pool.gen++;
	pthread_cond_broadcast(&pool.go);
	pthread_mutex_unlock(&pool.mu);
	fn(ctx, 0, n);
	pthread_mutex_lock(&pool.mu);
	while (pool.pending)
		pthread_cond_wait(&pool.done, &pool.mu);
	pool.busy = 0;
	pthread_mutex_unlock(&pool.mu);
	return 0;
}

struct range_job {
	long n, align;
	void (*fn)(void *, long, long);
	void *ctx;
};

static void run_range(void *p, int part, int nparts)
{
	const struct range_job *j = p;
	long per = (j->n + nparts - 1) / nparts;
	long i0, i1;

	per = (per + j->align - 1) / j->align * j->align;
	i0 = part * per;
	i1 = i0 + per < j->n ? i0 + per : j->n;
	if (i0 < i1)
		j->fn(j->ctx, i0, i1);
}

void hp_parallel_for(long n, long grain, long align, void (*fn)(void *ctx, long i0, long i1), void *ctx)
{
	struct range_job j = { n, align > 0 ? align : 1, fn, ctx };

	if (n <= 0)
		return;
	if (n < 2 * grain || hp_pool_run(run_range, &j))
		fn(ctx, 0, n);
}
