/*
 * progress.h - a one-line progress report on stderr for long byte-counted
 * work (reading shards, writing checkpoints).
 *
 * It draws only when the caller enables it and stderr is a terminal, so
 * logs and pipes never see it; a multi-rank tool enables it on rank 0 only.
 * The line is redrawn in place, at most every 250 ms:
 *   label  1.2 GiB / 4.0 GiB  30%  512.0 MiB/s  ETA 0:06
 * Not thread-safe: one thread owns a struct hp_progress.  No allocation.
 */
#ifndef HP_PROGRESS_H
#define HP_PROGRESS_H

#include <stdint.h>

struct hp_progress {
	const char *label;  /* borrowed: must outlive hp_progress_done */
	uint64_t total;     /* bytes expected; 0 when unknown (no %, no ETA) */
	uint64_t done;      /* bytes so far */
	double t0, last;    /* CLOCK_MONOTONIC seconds: start, last redraw */
	int on;             /* enabled and stderr is a terminal */
};

/* Start counting; with enabled == 0, or stderr not a terminal, every call
 * on p does nothing. */
void hp_progress_start(struct hp_progress *p, const char *label, uint64_t total_bytes,
		       int enabled);
/* Count bytes more, redrawing if the last redraw is 250 ms old. */
void hp_progress_add(struct hp_progress *p, uint64_t bytes);
/* Draw the final line (elapsed time in place of the ETA) and end it. */
void hp_progress_done(struct hp_progress *p);

#endif
