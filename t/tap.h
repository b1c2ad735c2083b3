/*
 * tap.h - a tiny TAP producer for the C unit tests in t/unit/.
 *
 * Each test binary calls ok()/is_int()/... as it goes and returns
 * tap_done() from main, which prints the plan ("1..N") last and returns
 * non-zero if anything failed.  Diagnostics go to stdout as "# ..." lines.
 */
#ifndef HP_TAP_H
#define HP_TAP_H

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

#endif
