/*
 * fuzz-hfconfig.c - libFuzzer target for the HF config.json reader.
 *
 * The input is a config.json given to hp_hfconfig_load_buf.  Findings are
 * crashes, sanitizer reports and broken promises of hfconfig.h: failures
 * are HP_ECONFIG/HP_EUNSUP with a one-line message; an accepted spec is
 * self-consistent (positive sizes, heads divisible by KV heads, top-k within
 * the experts) so that the model built from it is well defined.  The seed
 * corpus is fuzz/corpus/hfconfig/.
 */
#include <stddef.h>
#include <stdint.h>

#include "config/hfconfig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct hp_model_spec s;
	struct hp_err e;
	int rc;

	hp_err_clear(&e);
	rc = hp_hfconfig_load_buf(&s, "config.json", (const char *)data, size, &e);
	if (rc) {
		if ((rc != HP_ECONFIG && rc != HP_EUNSUP) || strchr(e.msg, '\n'))
			__builtin_trap();
		return 0;
	}
	if (s.hidden <= 0 || s.n_layers <= 0 || s.n_layers > HP_MAX_LAYERS || s.n_heads <= 0 ||
	    s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads || s.head_dim <= 0 || s.head_dim % 2 ||
	    s.vocab <= 0 || (s.n_experts > 0 && (s.top_k < 1 || s.top_k > s.n_experts)))
		__builtin_trap();
	(void)hp_model_spec_nparams(&s);
	return 0;
}
