/*
 * test-err.c - lib/base/err.c: a message too long for struct hp_err keeps its
 * start and its end (where the reason is) around "...", never splits a
 * UTF-8 character, survives an argument that points into the record and a
 * failed allocation, and hp_err_prefix keeps the old message's end.
 */
#include "base/alloc.h"
#include "base/err.h"
#include "tap.h"

#define ROOM (HP_ERR_MSG_MAX - 1)

static int ends_with(const char *s, const char *end)
{
	size_t n = strlen(s), k = strlen(end);

	return n >= k && !strcmp(s + n - k, end);
}

/* s is well-formed UTF-8 (no character cut in two) */
static int utf8_whole(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	while (*p) {
		int k = *p < 0x80 ? 0 : (*p & 0xe0) == 0xc0 ? 1 : (*p & 0xf0) == 0xe0 ? 2 :
			(*p & 0xf8) == 0xf0 ? 3 : -1;

		if (k < 0)
			return 0;
		for (p++; k; k--, p++)
			if ((*p & 0xc0) != 0x80)
				return 0;
	}
	return 1;
}

/* n bytes of c, then a NUL */
static char *fill(char *buf, char c, size_t n)
{
	memset(buf, c, n);
	buf[n] = '\0';
	return buf;
}

int main(void)
{
	static char path[4096], want[4096];
	struct hp_err e;
	int rc;

	hp_err_clear(&e);
	rc = hp_err_set(&e, HP_EFORMAT, "'%s': bad magic", "a.bin");
	ok(rc == HP_EFORMAT && e.code == HP_EFORMAT && !strcmp(e.msg, "'a.bin': bad magic"),
	   "a short message is kept whole");
	is_int(hp_err_set(NULL, HP_EIO, "x"), HP_EIO, "a NULL record still returns the code");

	fill(path, 'a', ROOM);
	hp_err_set(&e, HP_EIO, "%s", path);
	ok(strlen(e.msg) == ROOM && !strcmp(e.msg, path), "a message of %d bytes is kept whole", ROOM);
	fill(path, 'a', ROOM + 1);
	path[0] = 'S';
	path[ROOM] = 'E';
	hp_err_set(&e, HP_EIO, "%s", path);
	ok(strlen(e.msg) == ROOM && e.msg[0] == 'S' && ends_with(e.msg, "aE") && strstr(e.msg, "..."),
	   "one byte more and the middle goes, not the end");

	/* the finding: a 2000-byte path cut the reason off */
	path[0] = '/';
	for (size_t i = 1; i < 2000; i++)
		path[i] = i % 100 ? 'd' : '/';
	memcpy(path + 2000, "/model.safetensors", sizeof("/model.safetensors"));
	hp_err_set(&e, HP_EFORMAT, "'%s': header length 812 runs past the end of the file (400 bytes)", path);
	if (!ok(strlen(e.msg) == ROOM && !strncmp(e.msg, "'/dd", 4) &&
		ends_with(e.msg, "dd/model.safetensors': header length 812 runs past the end of the file "
			  "(400 bytes)") && strstr(e.msg, "d...d"),
		"a 2000-byte path keeps the message's start and its reason"))
		tap_diag("  message: %s", e.msg);
	is_int(e.code, HP_EFORMAT, "and the code");

	/* an argument that points into the record it is written to */
	hp_err_set(&e, HP_EIO, "'x.bin': cannot open");
	hp_err_set(&e, HP_EFORMAT, "again: %s", e.msg);
	is_str(e.msg, "again: 'x.bin': cannot open", "an argument may be the record's own message");
	fill(path, 'p', 1500);
	hp_err_set(&e, HP_EIO, "%s: reason one", path);
	snprintf(want, sizeof(want), "%.*s", 20, e.msg);
	hp_err_set(&e, HP_EIO, "%s -- %s: reason two", e.msg, path);
	ok(!strncmp(e.msg, want, 20) && ends_with(e.msg, "pp: reason two"),
	   "even when both messages are over-long");

	/* cuts fall between characters: 'é' is two bytes, '€' three */
	size_t w = 0;
	for (int i = 0; i < 800; i++)
		w += (size_t)snprintf(want + w, sizeof(want) - w, "%s", i % 3 ? "\xc3\xa9" : "\xe2\x82\xac");
	for (int shift = 0; shift < 3; shift++) {
		hp_err_set(&e, HP_EIO, "%.*s'%s': cannot open", shift, "xx", want);
		if (!ok(utf8_whole(e.msg) && strlen(e.msg) <= ROOM && strstr(e.msg, "...") &&
			ends_with(e.msg, "': cannot open"), "no UTF-8 character is cut (shift %d)", shift))
			tap_diag("  message: %s", e.msg);
	}

	/* control characters in a long message still become '?' */
	fill(path, 'n', 3000);
	path[10] = '\n';
	path[2990] = '\t';
	hp_err_set(&e, HP_EIO, "%s: reason", path);
	ok(!strchr(e.msg, '\n') && !strchr(e.msg, '\t') && e.msg[10] == '?' && ends_with(e.msg, "?nnnnnnnnn: reason"),
	   "a long message is one line too");

	/* hp_err_prefix: the old message is the reason */
	hp_err_set(&e, HP_EFORMAT, "invalid UTF-8 at byte 3");
	hp_err_prefix(&e, "'%s' line %u", "c.jsonl", 7u);
	is_str(e.msg, "'c.jsonl' line 7: invalid UTF-8 at byte 3", "a short prefix");
	is_int(e.code, HP_EFORMAT, "the prefix keeps the code");
	fill(path, 'q', 2500);
	hp_err_set(&e, HP_EFORMAT, "invalid UTF-8 at byte 3");
	hp_err_prefix(&e, "'%s' line %u", path, 7u);
	ok(strlen(e.msg) == ROOM && !strncmp(e.msg, "'qqq", 4) &&
	   ends_with(e.msg, "qq' line 7: invalid UTF-8 at byte 3"),
	   "an over-long prefix loses its middle, not the old message");
	hp_err_set(&e, HP_EFORMAT, "'%s': reason", path);
	hp_err_prefix(&e, "ctx");
	ok(strlen(e.msg) == ROOM && !strncmp(e.msg, "ctx: 'qqq", 9) && ends_with(e.msg, "qq': reason"),
	   "a prefix to an over-long message keeps both ends");
	hp_err_clear(&e);
	is_int(hp_err_prefix(&e, "ctx"), 0, "a prefix to a clear record returns 0");
	is_int(hp_err_prefix(NULL, "ctx"), HP_EINVAL, "and to NULL, HP_EINVAL");

	/* without memory for the whole text, the start stays and "..." shows the cut */
	fill(path, 'm', 2000);
	hp_alloc_fail_at(1);
	hp_err_set(&e, HP_ENOMEM, "%s: reason", path);
	hp_alloc_fail_at(0);
	ok(strlen(e.msg) == ROOM && !strncmp(e.msg, "mmm", 3) && ends_with(e.msg, "mm..."),
	   "a failed allocation keeps the start and marks the cut");

	is_int(hp_err_exit_code(HP_EFORMAT), HP_EXIT_DATA, "HP_EFORMAT exits 4");
	is_int(hp_err_exit_code(HP_ECONFIG), HP_EXIT_CONFIG, "HP_ECONFIG exits 3");
	return tap_done();
}
