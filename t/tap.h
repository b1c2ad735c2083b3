/*
 * tap.h - a tiny TAP producer for the C unit tests in t/unit/, and the one
 * float comparison they share.
 *
 * Each test binary calls ok()/is_int()/... as it goes and returns
 * tap_done() from main, which prints the plan ("1..N") last and returns
 * non-zero if anything failed.  Diagnostics go to stdout as "# ..." lines.
 */
#ifndef HP_TAP_H
#define HP_TAP_H

#include <stddef.h>
#include <stdint.h>

int tap_ok(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tap_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tap_skip(const char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int tap_done(void);

#define ok(cond, ...) tap_ok(!!(cond), __VA_ARGS__)
#define is_int(got, want, ...) \
	(tap_ok((long long)(got) == (long long)(want), __VA_ARGS__) ? 1 : \
	 (tap_diag("  got %lld, want %lld", (long long)(got), (long long)(want)), 0))
#define is_str(got, want, ...) \
	(tap_ok(!strcmp((got), (want)), __VA_ARGS__) ? 1 : \
	 (tap_diag("  got '%s', want '%s'", (got), (want)), 0))

/*
 * Comparing float results: what a bound is relative to, and why.
 *
 * u = TAP_U = 2^-24 is the unit roundoff of fp32: every float operation
 * returns the exact result of its rounded operands times (1 + d), |d| <= u
 * (round to nearest; one ulp of x is between u |x| and 2u |x|).  A float sum
 * of n terms - a dot product of length n - computed in any order, any
 * blocking, with or without fused multiply-adds, is within
 *     gamma_n = n u / (1 - n u)
 * of the exact sum relative to the sum of the terms' magnitudes, not to
 * the sum itself (Higham, Accuracy and Stability of Numerical Algorithms,
 * 2nd ed., 3.1).  The result may cancel to nothing while the rounding of
 * its large terms stays; so no bound here is relative to a value that can
 * be near zero by cancellation.  Two forms:
 *
 * 1. tap_bound_err: an element-wise bound from the magnitudes summed,
 *        |got_i - want_i| <= k u mag_i,
 *    with mag_i the sum of |terms| element i is made of (the test computes
 *    it in double from |inputs|) and k the number of roundings along the
 *    longest chain into one element, counted from the algorithm (for a
 *    float dot product of length n against a double one rounded once:
 *    n + 1).  It is a worst case, so it holds at every CPU level and any
 *    summation order, while an indexing or edge bug (an error of about one
 *    whole term, i.e. mag_i / n) fails whenever k u n << 1.
 *
 * 2. tap_rel_l2: the normalized L2 error ||got - want|| / max(||want||,
 *    floor), where recomputing every element's magnitudes is impractical
 *    (softmax chains, a whole model step).  The floor is the norm of the
 *    scale the tensor's rounding follows when its own norm is smaller by
 *    cancellation: tap_floor(rms, n) = rms sqrt(n), the norm the tensor
 *    would have at the typical element of its group - the global gradient
 *    norm's typical element for a gradient (the rule of hp-test-tool
 *    cmpst), the inputs' for an output that is an average of them.  The
 *    bound itself is stated where it is used as a multiple of u and the
 *    number of terms summed: independent roundings add like a random walk,
 *    so a tensor's normalized error is about sqrt(n) u for sums of n terms,
 *    against the worst case n u of a single element.
 *
 * All return INFINITY when got or want holds a NaN or an infinity, so that
 * "err <= bound" fails; the reason for every bound is written beside the
 * call.
 */
#define TAP_U 0x1p-24

/* ||x||_2 in double */
double tap_norm(const float *x, size_t n);

/* the rms over the elements of k tensors together (x[i] holds n[i]
 * floats): a group's typical element, such as a whole gradient's */
double tap_rms(int k, const float *const x[], const size_t n[]);

/* rms * sqrt(n): the norm of n elements at the group's typical one */
double tap_floor(double rms, size_t n);

/* ||got - want|| / max(||want||, floor) in double; 0 when both norms
 * are 0 and got == want. */
double tap_rel_l2(const float *got, const float *want, size_t n, double floor);

/*
 * A model's flat vector cut into nparts tensors (part p is the len[p]
 * floats at off[p]): the largest over the tensors of tap_rel_l2 with the
 * floor tap_floor(rms of all of want, len[p]) - every tensor against its
 * own norm, or against the norm it would have at the model's typical
 * element when cancellation left it smaller (the rule of hp-test-tool
 * cmpst with F = 1).  *worst, when not NULL, gets the part that gave it.
 */
double tap_rel_l2_parts(const float *got, const float *want, int nparts, const size_t *off,
			const size_t *len, int *worst);

/* Run fn(arg) in a forked child whose environment has HP_NUM_THREADS =
 * threads and, when level is not NULL, HP_CPU = level (the kernels read
 * both once per process), and wait for it: 0 when fn returned 0 there, -1
 * when it did not or the child could not run.  The child's results go to
 * memory the caller mapped shared before. */
int tap_child(int threads, const char *level, int (*fn)(void *), void *arg);

/* max_i |got_i - want_i| / (k u mag_i): at most 1 when every element is
 * within its bound; an element with mag_i == 0 must match exactly. */
/* xorshift64*: deterministic test data, the next value of *state in
 * (0, 1), 53 bits; each test keeps its own state (and seed). */
double tap_urand(uint64_t *state);

double tap_bound_err(const float *got, const float *want, const double *mag, size_t n, double k);

#endif
