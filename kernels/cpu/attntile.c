/*
 * attntile.c - the compiled version and the threads of an attention call
 * (flashattn.c, cpattn.c, attention.c's BLAS kernels; the tiles themselves
 * are attntile.h's).
 *
 * Threads: a call's work items write disjoint outputs and are handed out
 * through an atomic counter to threads started for the call, when it is
 * large enough to pay for them; the calling thread works too.  Which thread
 * runs an item changes nothing in its bits (see attntile.h).
 */
#include <pthread.h>
#include <stdlib.h>

#include "cpu/attntile.h"
#include "cpu/gemm.h"
#include "cpu/isa.h"
#include "cpu/ops.h"

/* Workers' stack: a work item keeps up to about 300 KiB of tiles on it. */
#define AT_STACK (4u << 20)
#define AT_MAX_THREADS 64
/* Below this many multiply-adds (0.2 ms on an AVX-512 core, 1 ms on a
 * baseline one) a call runs on the calling thread: starting a worker
 * costs tens of microseconds. */
#define AT_MIN_THREADED_MACS (1L << 23)

_Static_assert(HP_FLASH_ATTENTION_MAX_HEAD_DIM <= AT_MAX_HEAD_DIM, "flash head dims must fit a tile");

int hp_attntile_isa(void)
{
#ifdef AT_X86
	return hp_cpu_level();     /* 0, 1, 2: the index of the version, as isa.h's levels */
#else
	return 0;
#endif
}

static int at_threads_override;

void hp_attention_set_threads(int n)
{
	__atomic_store_n(&at_threads_override, n > 0 ? n : 0, __ATOMIC_RELAXED);
}

int hp_attntile_threads(void)
{
	int n = __atomic_load_n(&at_threads_override, __ATOMIC_RELAXED);

	return n > 0 ? n : hp_sgemm_threads();
}

static void *at_drain(void *p)
{
	struct at_job *j = p;
	long i;

	while ((i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->n)
		j->fn(j->args, i);
	return NULL;
}

void hp_attntile_run(struct at_job *j, int nt, double macs)
{
	pthread_t tid[AT_MAX_THREADS];
	pthread_attr_t at;
	int started = 0;

	if (nt <= 0)
		nt = hp_attntile_threads();
	if (nt > AT_MAX_THREADS)
		nt = AT_MAX_THREADS;
	if (nt > j->n)
		nt = (int)j->n;
	if (macs < (double)AT_MIN_THREADED_MACS)
		nt = 1;
	if (nt > 1 && !pthread_attr_init(&at)) {
		pthread_attr_setstacksize(&at, AT_STACK);
		while (started < nt - 1 && !pthread_create(&tid[started], &at, at_drain, j))
			started++;
		pthread_attr_destroy(&at);
	}
	at_drain(j);
	for (int t = 0; t < started; t++)
		pthread_join(tid[t], NULL);
}
