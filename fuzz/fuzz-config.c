/*
 * fuzz-config.c - libFuzzer target for the YAML training-config loader.
 *
 * The input is a YAML file given to hp_config_load_buf.  An input whose
 * first line starts with "#override " also passes the rest of that line as
 * one --a.b=c override, so the override parser is fuzzed too.  Findings are
 * crashes, sanitizer reports, leaks and broken promises of config.h: a
 * failure returns HP_ECONFIG/HP_EUNSUP/HP_ENOMEM with a one-line message, a success
 * prints its table without crashing and releases cleanly.  The seed corpus
 * is fuzz/corpus/config/ (real configs and broken ones).
 */
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct hp_config c;
	struct hp_err e;
	char ovr[512];
	char *ovrs[1] = { ovr };
	int novr = 0, rc;
	const char *buf = (const char *)data;

	hp_err_clear(&e);
	memset(&c, 0, sizeof(c));
	if (size > 10 && !memcmp(data, "#override ", 10)) {
		const char *nl = memchr(data, '\n', size);
		size_t n = (nl ? (size_t)(nl - buf) : size) - 10;
		if (n >= sizeof(ovr))
			n = sizeof(ovr) - 1;
		memcpy(ovr, buf + 10, n);
		ovr[n] = '\0';
		novr = 1;
	}
	rc = hp_config_load_buf(&c, "fuzz.yaml", buf, size, novr, ovrs, &e);
	if (rc) {
		if (rc != HP_ECONFIG && rc != HP_EUNSUP && rc != HP_ENOMEM && rc != HP_EIO)
			__builtin_trap();
		if (strchr(e.msg, '\n'))
			__builtin_trap();
	} else {
		FILE *f = fopen("/dev/null", "w");
		if (f) {
			hp_config_print(&c, f);
			fclose(f);
		}
	}
	hp_config_release(&c);
	return 0;
}
