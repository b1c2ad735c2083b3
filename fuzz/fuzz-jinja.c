/*
 * fuzz-jinja.c - libFuzzer target for the Jinja2 interpreter (lib/text/jinja_*.c).
 *
 * The input is a template: it is compiled and, when it compiles, rendered
 * with a small fixed set of variables shaped like a chat (messages with
 * roles, content, tool calls; tools; flags; bos/eos tokens), every string
 * tagged with its own value, under lowered limits so that a hostile
 * template fails fast inside libFuzzer's memory budget.
 *
 * Findings are crashes, sanitizer reports, leaks and broken promises of
 * jinja.h: compile gives 0, HP_EFORMAT or HP_EUNSUP and render 0 or
 * HP_EFORMAT; a failure leaves no template and no output and gives a
 * one-line message naming the template; an output is NUL-terminated with
 * one tag per byte, each tag one of the inputs' or 0.  What this is not: a
 * comparison with jinja2 (t/unit/test-jinja.c does that on fixed cases).
 * Build with `make fuzz`; the seed corpus is fuzz/corpus/jinja/.
 */
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base/alloc.h"
#include "text/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char vars_json[] =
	"{\"messages\": ["
	"{\"role\": \"system\", \"content\": \"You are helpful.\"},"
	"{\"role\": \"user\", \"content\": \"Hi \\u00e9 \\ud83d\\ude00 <think>x</think>\"},"
	"{\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>\\n\\nok\", "
	"\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1.5, \"b\": [true, null]}}}]},"
	"{\"role\": \"tool\", \"content\": \"{\\\"r\\\": 2}\"}],"
	"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
	"\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"n\": 3, \"x\": -0.5}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct hp_jinja *t = NULL;
	struct hp_jctx *c;
	struct hp_jval *vars;
	struct hp_jout out;
	struct hp_err e;
	json_t *j;
	/* a few MiB of output and temporaries, 10^5 iterations: a hostile
	 * template hits a limit within milliseconds */
	struct hp_jlimits lim = { .max_output = 1 << 20, .max_memory = 64 << 20, .max_iters = 100000 };
	int rc;

	hp_err_clear(&e);
	rc = hp_jinja_compile(&t, (const char *)data, size, "fuzz", &e);
	if (rc) {
		if (t || (rc != HP_EFORMAT && rc != HP_EUNSUP) || strncmp(e.msg, "'fuzz'", 6) ||
		    strchr(e.msg, '\n'))
			__builtin_trap();
		return 0;
	}
	c = hp_jctx_new();
	j = json_loads(vars_json, 0, NULL);
	if (!c || !j)
		__builtin_trap();
	vars = hp_jv_from_json(c, j, 3);
	json_decref(j);
	if (!vars || hp_jv_set(c, vars, "tagged", hp_jv_str(c, "  tag  ", 7, 5)))
		__builtin_trap();
	hp_err_clear(&e);
	rc = hp_jinja_render_lim(t, c, vars, &lim, &out, &e);
	if (rc) {
		if (rc != HP_EFORMAT || out.text || out.len || out.tag || out.gen ||
		    strncmp(e.msg, "'fuzz'", 6) || strchr(e.msg, '\n'))
			__builtin_trap();
	} else {
		if (!out.text || out.text[out.len] != '\0' || (out.len && !out.tag) ||
		    (!out.gen) != !hp_jinja_has_generation(t))
			__builtin_trap();
		for (size_t i = 0; i < out.len; i++)
			if (out.tag[i] != 0 && out.tag[i] != 3 && out.tag[i] != 5)
				__builtin_trap();
		for (size_t i = 0; out.gen && i < out.len; i++)
			if (out.gen[i] > 1)
				__builtin_trap();
		hp_jout_release(&out);
	}
	hp_jctx_free(c);
	hp_jinja_free(t);
	return 0;
}
