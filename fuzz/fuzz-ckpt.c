/*
 * fuzz-ckpt.c - libFuzzer target for a checkpoint's metadata files.
 *
 * The input is given both as a checkpoint.json (hp_ckpt_meta_parse) and as
 * a train_state.json (hp_ckpt_state_parse): a resume trusts what they say
 * (which files to check, which step and data cursor to go on from).
 * Findings are crashes, sanitizer reports and broken promises of ckpt.h: a
 * failure is HP_EFORMAT with a one-line message; an accepted
 * checkpoint.json has a positive step and world size, a 64-character plan
 * hash and files whose paths stay inside the checkpoint; an accepted state
 * a positive step.  The seed corpus is fuzz/corpus/ckpt/.
 */
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "dist/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whether p is relative and no component of it is "..". */
static int escapes_not(const char *p)
{
	if (p[0] == '/')
		return 0;
	for (const char *c = p;; c++)
		if ((c == p || c[-1] == '/') && c[0] == '.' && c[1] == '.' && (c[2] == '/' || !c[2]))
			return 0;
		else if (!*c)
			return 1;
}

static void check_failure(int rc, const struct hp_err *e)
{
	if (rc != HP_EFORMAT || strchr(e->msg, '\n') || !e->msg[0])
		__builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct hp_ckpt_meta m;
	struct hp_ckpt_state st;
	struct hp_err e;
	int rc;

	hp_err_clear(&e);
	rc = hp_ckpt_meta_parse("checkpoint.json", (const char *)data, size, &m, &e);
	if (rc) {
		check_failure(rc, &e);
	} else {
		size_t i;
		json_t *f;

		if (m.step < 1 || m.world < 1 || strlen(m.plan) != 64 || !json_is_array(m.files))
			__builtin_trap();
		json_array_foreach(m.files, i, f) {
			const char *p = json_string_value(json_object_get(f, "path"));

			if (!p || !escapes_not(p))
				__builtin_trap();
		}
		hp_ckpt_meta_release(&m);
	}
	hp_err_clear(&e);
	rc = hp_ckpt_state_parse("train_state.json", (const char *)data, size, &st, &e);
	if (rc)
		check_failure(rc, &e);
	else if (st.step < 1)
		__builtin_trap();
	return 0;
}
