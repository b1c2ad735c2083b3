/*
 * ckpt.c - training checkpoints (see ckpt.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/crc32c.h"
#include "base/dtype.h"
#include "base/fileio.h"
#include "comm/comm.h"
#include "dist/ckpt.h"
#include "dist/shard.h"

static const char *const kind_dir[HP_CKPT_NKIND] = { "model", "exp_avg", "exp_avg_sq" };

/* Every rank's outcome: the first error of this rank, or a note that
 * another rank failed (its own message says why). */
static int agree(MPI_Comm comm, int rc, struct hp_err *e)
{
	int any = rc != 0;

	hp_comm_allreduce_raw(comm, &any, 1, MPI_INT, MPI_MAX);
	if (any && !rc)
		rc = hp_err_set(e, HP_EIO, "another rank could not go on with the checkpoint (see its message)");
	return rc;
}

/* Remove path and everything under it (a checkpoint holds folders of files). */
static void rm_rf(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	char p[4400];

	if (!d) {
		unlink(path);
		return;
	}
	while ((de = readdir(d))) {
		struct stat st;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", path, de->d_name);
		if (!lstat(p, &st) && S_ISDIR(st.st_mode))
			rm_rf(p);
		else
			unlink(p);
	}
	closedir(d);
	rmdir(path);
}

static int mkdir_p(const char *path, struct hp_err *e)
{
	char p[4200];

	snprintf(p, sizeof(p), "%s", path);
	for (char *c = p + 1; *c; c++)
		if (*c == '/') {
			*c = '\0';
			if (mkdir(p, 0755) && errno != EEXIST)
				return hp_err_set(e, HP_EIO, "'%s': cannot create: %s", p, strerror(errno));
			*c = '/';
		}
	if (mkdir(p, 0755) && errno != EEXIST)
		return hp_err_set(e, HP_EIO, "'%s': cannot create: %s", p, strerror(errno));
	return 0;
}

/* Write text to dir/name whole or not at all (fileio.h). */
static int write_atomic(const char *dir, const char *name, const char *text, struct hp_err *e)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return hp_write_file(path, text, strlen(text), e);
}

/* A file's size and the CRC-32C of its bytes. */
static int file_sum(const char *path, uint64_t *bytes, uint32_t *crc, struct hp_err *e)
{
	static char buf[1 << 20];
	int fd = open(path, O_RDONLY);
	ssize_t n;

	*bytes = 0;
	*crc = 0;
	if (fd < 0)
		return hp_err_set(e, HP_EIO, "'%s': missing: %s", path, strerror(errno));
	while ((n = read(fd, buf, sizeof(buf))) > 0) {
		*crc = hp_crc32c(*crc, buf, (size_t)n);
		*bytes += (uint64_t)n;
	}
	close(fd);
	if (n < 0)
		return hp_err_set(e, HP_EIO, "'%s': cannot read: %s", path, strerror(errno));
	return 0;
}

/* --- the lock ---------------------------------------------------------------- */

int hp_ckpt_lock(struct hp_ckpt_lock *l, const char *root, char *note, size_t n, struct hp_err *e)
{
	char path[4200], host[256] = "", held[300] = "", mine[300];
	ssize_t got;
	int fd, rc;

	memset(l, 0, sizeof(*l));
	l->fd = -1;
	if (n)
		note[0] = '\0';
	if ((rc = mkdir_p(root, e)))
		return rc;
	snprintf(path, sizeof(path), "%s/hp.lock", root);
	if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
		return hp_err_set(e, HP_EIO, "'%s': checkpoint_dir cannot be written: %s", root, strerror(errno));
	if ((got = pread(fd, held, sizeof(held) - 1, 0)) > 0)
		held[got] = '\0';
	held[strcspn(held, "\n")] = '\0';
	if (flock(fd, LOCK_EX | LOCK_NB)) {
		int err = errno;

		close(fd);
		if (err == EWOULDBLOCK)
			return hp_err_set(e, HP_ECONFIG, "'%s': checkpoint_dir is in use by another run (%s%s); give "
					  "this run a checkpoint_dir of its own, or end that one first", root,
					  held[0] ? "host and pid " : "see", held[0] ? held : " hp.lock");
		return hp_err_set(e, HP_EIO, "'%s': cannot lock: %s", path, strerror(err));
	}
	if (held[0] && n)
		snprintf(note, n, "'%s': took over the lock left by a run that is gone (host and pid %s)", path, held);
	gethostname(host, sizeof(host) - 1);
	snprintf(mine, sizeof(mine), "%s %ld\n", host, (long)getpid());
	if (ftruncate(fd, 0) || hp_pwrite_all(fd, mine, strlen(mine), 0) || fsync(fd)) {
		rc = hp_err_set(e, HP_EIO, "'%s': cannot write: %s", path, strerror(errno));
		close(fd);
		return rc;
	}
	l->fd = fd;
	l->held = 1;
	l->slot = hp_tmp_track_note(fd);
	return 0;
}

void hp_ckpt_unlock(struct hp_ckpt_lock *l)
{
	if (!l->held)
		return;
	hp_tmp_forget(l->slot);
	/* empty: the next run finds a lock nobody left behind */
	if (ftruncate(l->fd, 0) == 0)
		fsync(l->fd);
	close(l->fd);
	l->fd = -1;
	l->held = 0;
}

/* --- saving ----------------------------------------------------------------- */

struct piece_src {
	const struct hp_plan *p;
	int rank, kind, finite;
	hp_ckpt_piece_fn piece;
	void *ctx;
};

/* hp_shard_write asks for this rank's own pieces, whole rows at a time. */
static int read_own(void *ctx, int i, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *dst,
		    struct hp_err *e)
{
	struct piece_src *s = ctx;
	struct hp_piece pc;
	const float *x = s->piece(s->ctx, s->kind, i);

	hp_plan_piece(s->p, &s->p->params[i], s->rank, &pc);
	if (!x || r0 < pc.row0 || r0 + nr > pc.row0 + pc.nrows || c0 < pc.col0 || c0 + nc > pc.col0 + pc.cols)
		return hp_err_set(e, HP_EINVAL, "checkpoint: '%s' rows %lld..%lld are not rank %d's",
				  s->p->params[i].name, (long long)r0, (long long)(r0 + nr), s->rank);
	for (int64_t r = 0; r < nr; r++)
		memcpy(dst + r * nc, x + (r0 - pc.row0 + r) * pc.cols + (c0 - pc.col0), (size_t)nc * sizeof(float));
	if (s->finite) {
		size_t k = hp_find_nonfinite(dst, (size_t)(nr * nc));

		if (k < (size_t)(nr * nc))
			return hp_err_set(e, HP_ENUM, "checkpoint: %s '%s' holds %g at row %lld: not saved, the last "
					  "checkpoint stays the last good one (debug.check_nan_inf)",
					  s->kind == HP_CKPT_WEIGHTS ? "weight" : "AdamW moment of",
					  s->p->params[i].name, dst[k], (long long)(r0 + (int64_t)k / nc));
	}
	return 0;
}

/* Remove what an interrupted save left: global_step_*.tmp.* and .old.* folders. */
static void remove_stale(const char *root)
{
	DIR *d = opendir(root);
	struct dirent *de;
	char p[4400];

	if (!d)
		return;
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, "global_step_", 12) &&
		    (strstr(de->d_name, ".tmp.") || strstr(de->d_name, ".old."))) {
			snprintf(p, sizeof(p), "%s/%s", root, de->d_name);
			rm_rf(p);
		}
	closedir(d);
}

/* Keep the newest keep complete checkpoints. */
static void prune(const char *root, long keep)
{
	DIR *d;
	struct dirent *de;
	long *steps = NULL, n = 0, cap = 0;
	char p[4400];

	if (keep <= 0 || !(d = opendir(root)))
		return;
	while ((de = readdir(d))) {
		long s;
		int k = 0;

		if (sscanf(de->d_name, "global_step_%ld%n", &s, &k) != 1 || de->d_name[k])
			continue;
		snprintf(p, sizeof(p), "%s/%s/checkpoint.json", root, de->d_name);
		if (access(p, F_OK))
			continue;   /* not complete: not ours to judge */
		if (n == cap) {
			long *x = hp_realloc(steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof(long));
			if (!x)
				break;
			steps = x;
		}
		steps[n++] = s;
	}
	closedir(d);
	for (long i = 0; i < n; i++) {
		long newer = 0;

		for (long j = 0; j < n; j++)
			newer += steps[j] > steps[i];
		if (newer >= keep) {
			snprintf(p, sizeof(p), "%s/global_step_%ld", root, steps[i]);
			rm_rf(p);
		}
	}
	hp_fsync_dir(root);
	hp_free(steps);
}

struct fsum {
	uint64_t bytes;
	uint32_t crc, pad;
};

static char *state_json(const struct hp_ckpt_state *st)
{
	json_t *o = json_pack("{s:I, s:I, s:o}", "step", (json_int_t)st->step, "seed", (json_int_t)st->seed,
			      "data", st->online ?
			      json_pack("{s:s, s:I, s:I, s:I}", "mode", "online", "epoch", (json_int_t)st->epoch,
					"doc", (json_int_t)st->doc, "offset", (json_int_t)st->off) :
			      json_pack("{s:s, s:I, s:I}", "mode", "indexed", "position", (json_int_t)st->pos,
					"epoch", (json_int_t)st->epoch));
	char *s = o ? json_dumps(o, JSON_INDENT(2)) : NULL;

	json_decref(o);
	return s;
}

int hp_ckpt_save(const struct hp_ckpt_save_opts *o, const struct hp_plan *p, MPI_Comm comm,
		 hp_ckpt_piece_fn piece, void *ctx, const struct hp_ckpt_state *st, struct hp_err *e)
{
	int rank, world, nk = o->optimizer ? HP_CKPT_NKIND : 1, rc = 0;
	char final[4200], tmp[4300], sub[4400], path[4600], name[64], hash[65];
	long pid = (long)getpid();
	int slot = -1;
	struct fsum mine[HP_CKPT_NKIND], *all = NULL;
	MPI_Request req;

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &world);
	snprintf(final, sizeof(final), "%s/global_step_%ld", o->root, st->step);
	hp_comm_bcast_raw(comm, &pid, 1, MPI_LONG, 0);
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", final, pid);
	/* rank 0 makes the folders and the plans */
	if (rank == 0) {
		if (!(rc = mkdir_p(o->root, e))) {
			remove_stale(o->root);
			if (mkdir(tmp, 0755))
				rc = hp_err_set(e, HP_EIO, "'%s': cannot create: %s", tmp, strerror(errno));
			else
				slot = hp_tmp_track(tmp, 1);   /* removed if the process is stopped */
		}
		for (int k = 0; k < nk && !rc; k++) {
			snprintf(sub, sizeof(sub), "%s/%s", tmp, kind_dir[k]);
			if (mkdir(sub, 0755))
				rc = hp_err_set(e, HP_EIO, "'%s': cannot create: %s", sub, strerror(errno));
			else {
				snprintf(path, sizeof(path), "%s/plan.json", sub);
				rc = hp_plan_save(p, path, e);
			}
		}
		if (!rc && o->consolidated) {
			snprintf(sub, sizeof(sub), "%s/hf", tmp);
			if (mkdir(sub, 0755))
				rc = hp_err_set(e, HP_EIO, "'%s': cannot create: %s", sub, strerror(errno));
		}
	}
	if ((rc = agree(comm, rc, e)))
		goto fail;
	/* every rank its own files */
	memset(mine, 0, sizeof(mine));
	hp_shard_name(name, sizeof(name), rank, world);
	for (int k = 0; k < nk && !rc; k++) {
		struct piece_src ps = { p, rank, k, o->finite, piece, ctx };
		struct hp_src src;
		const char *pause = getenv("HP_CKPT_PAUSE");

		hp_src_open_fn(&src, p, read_own, &ps);
		snprintf(sub, sizeof(sub), "%s/%s", tmp, kind_dir[k]);
		rc = hp_shard_write(p, rank, &src, sub, NULL, e);
		hp_src_close(&src);
		snprintf(path, sizeof(path), "%s/%s", sub, name);
		if (!rc)
			rc = file_sum(path, &mine[k].bytes, &mine[k].crc, e);
		/* a test facility: stop part-way for a while (t/t1000-checkpoint.sh),
		 * "S" on every rank, "S@R" on rank R only */
		if (!rc && k == 0 && pause && atof(pause) > 0 &&
		    (!strchr(pause, '@') || atoi(strchr(pause, '@') + 1) == rank))
			usleep((useconds_t)(atof(pause) * 1e6));
	}
	if ((rc = agree(comm, rc, e)))
		goto fail;
	if (o->consolidated) {
		struct hp_src src;

		snprintf(sub, sizeof(sub), "%s/model", tmp);
		rc = hp_src_open_shards_part(&src, p, sub, rank, world, NULL, e);
		if (!(rc = agree(comm, rc, e))) {
			snprintf(sub, sizeof(sub), "%s/hf", tmp);
			/* from the shards just written, checked then when o->finite */
			rc = hp_export_hf(p, &src, sub, o->hf_dtype, 0, 0, rank, world, NULL, e);
		}
		hp_src_close(&src);
		if ((rc = agree(comm, rc, e)))
			goto fail;
	}
	if (rank == 0 && !(all = hp_calloc((size_t)world * HP_CKPT_NKIND, sizeof(*all))))
		rc = hp_err_set(e, HP_ENOMEM, "out of memory saving a checkpoint");
	if ((rc = agree(comm, rc, e)))
		goto fail;
	MPI_Igather(mine, (int)sizeof(mine), MPI_BYTE, all, (int)sizeof(mine), MPI_BYTE, 0, comm, &req);
	hp_comm_wait_op(&req, comm, HP_COMM_OP_GATHER);
	/* rank 0: the metadata last, then the folder into place, then LATEST */
	if (rank == 0) {
		json_t *files = json_array(), *meta;
		char *text = NULL, *dumped = NULL, *state = state_json(st);

		rc = hp_plan_hash(p, hash, e);
		for (int k = 0; k < nk && !rc; k++)
			for (int r = 0; r < world; r++) {
				char crc[16];

				hp_shard_name(name, sizeof(name), r, world);
				snprintf(sub, sizeof(sub), "%s/%s", kind_dir[k], name);
				snprintf(crc, sizeof(crc), "%08x", all[(size_t)r * HP_CKPT_NKIND + k].crc);
				json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "path", sub, "bytes",
								       (json_int_t)all[(size_t)r * HP_CKPT_NKIND + k].bytes,
								       "crc32c", crc));
			}
		if (!rc && o->consolidated) {
			/* the HF folder's files too */
			DIR *d;
			struct dirent *de;

			snprintf(sub, sizeof(sub), "%s/hf", tmp);
			if ((d = opendir(sub))) {
				while ((de = readdir(d)) && !rc) {
					uint64_t b;
					uint32_t c;
					char crc[16];

					if (de->d_name[0] == '.')
						continue;
					snprintf(path, sizeof(path), "%s/%s", sub, de->d_name);
					if (!(rc = file_sum(path, &b, &c, e))) {
						snprintf(crc, sizeof(crc), "%08x", c);
						snprintf(path, sizeof(path), "hf/%s", de->d_name);
						json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "path", path,
										       "bytes", (json_int_t)b, "crc32c", crc));
					}
				}
				closedir(d);
				hp_fsync_dir(sub);
			}
		}
		if (!rc && !state)
			rc = hp_err_set(e, HP_ENOMEM, "out of memory saving a checkpoint");
		if (!rc)
			rc = write_atomic(tmp, "train_state.json", state, e);
		if (!rc) {
			/* the train state is checked as the tensors are: by its size and CRC */
			char crc[16];

			snprintf(crc, sizeof(crc), "%08x", hp_crc32c(0, state, strlen(state)));
			json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "path", "train_state.json", "bytes",
							       (json_int_t)strlen(state), "crc32c", crc));
		}
		meta = json_pack("{s:s, s:I, s:s, s:i, s:b, s:O}", "format", HP_CKPT_FORMAT, "step",
				 (json_int_t)st->step, "plan", hash, "world_size", world, "optimizer", o->optimizer,
				 "files", files);
		if (!rc && (!meta || !(dumped = json_dumps(meta, JSON_INDENT(2))) ||
			    !(text = hp_malloc(strlen(dumped) + 2))))
			rc = hp_err_set(e, HP_ENOMEM, "out of memory saving a checkpoint");
		if (!rc)
			snprintf(text, strlen(dumped) + 2, "%s\n", dumped);
		free(dumped);
		for (int k = 0; k < nk && !rc; k++) {
			snprintf(sub, sizeof(sub), "%s/%s", tmp, kind_dir[k]);
			hp_fsync_dir(sub);
		}
		if (!rc)
			rc = write_atomic(tmp, "checkpoint.json", text, e);
		if (!rc) {
			char old[4400];

			snprintf(old, sizeof(old), "%s.old.%ld", final, pid);
			if (!access(final, F_OK) && rename(final, old))
				rc = hp_err_set(e, HP_EIO, "'%s': cannot move the previous one aside: %s", final,
						strerror(errno));
			else if (rename(tmp, final))
				rc = hp_err_set(e, HP_EIO, "'%s': cannot rename '%s' to it: %s", final, tmp,
						strerror(errno));
			if (!rc) {
				char step[32];

				hp_fsync_dir(o->root);
				rm_rf(old);
				snprintf(step, sizeof(step), "%ld\n", st->step);
				rc = write_atomic(o->root, HP_CKPT_LATEST, step, e);
			}
		}
		if (!rc)
			prune(o->root, o->keep_last);
		hp_free(text);
		free(state);
		json_decref(meta);
		json_decref(files);
	}
	hp_free(all);
	all = NULL;
	if ((rc = agree(comm, rc, e)))
		goto fail;
	hp_tmp_forget(slot);
	return 0;
fail:
	hp_free(all);
	if (rank == 0)
		rm_rf(tmp);
	hp_tmp_forget(slot);
	return rc;
}

/* --- finding and restoring -------------------------------------------------- */

static int read_latest(const char *root, long *step, struct hp_err *e)
{
	char path[4200], buf[64];
	FILE *f;
	int k = 0;

	snprintf(path, sizeof(path), "%s/%s", root, HP_CKPT_LATEST);
	if (!(f = fopen(path, "r")))
		return hp_err_set(e, HP_EIO, "'%s': cannot open: %s (no checkpoint to restore)", path,
				  strerror(errno));
	if (!fgets(buf, sizeof(buf), f) || (buf[k = (int)strspn(buf, "0123456789")] && buf[k] != '\n') || !k) {
		fclose(f);
		return hp_err_set(e, HP_EFORMAT, "'%s': expected the step of the latest checkpoint", path);
	}
	fclose(f);
	buf[k] = '\0';
	errno = 0;
	*step = strtol(buf, NULL, 10);
	if (errno == ERANGE || *step < 1)
		return hp_err_set(e, HP_EFORMAT, "'%s': step %s is out of range (1 to %ld)", path, buf, LONG_MAX);
	return 0;
}

int hp_ckpt_find(const char *root, const char *restore_from, char *dir, size_t n, struct hp_err *e)
{
	char p[4200];
	long step;
	int rc;

	if (!strcmp(restore_from, "LATEST")) {
		snprintf(p, sizeof(p), "%s/%s", root, HP_CKPT_LATEST);
		if (access(p, F_OK) && errno == ENOENT)
			return HP_CKPT_NONE_YET;
		if ((rc = read_latest(root, &step, e)))
			return rc;
		snprintf(dir, n, "%s/global_step_%ld", root, step);
		return 0;
	}
	snprintf(p, sizeof(p), "%s/checkpoint.json", restore_from);
	if (!access(p, F_OK)) {
		snprintf(dir, n, "%s", restore_from);
		return 0;
	}
	snprintf(p, sizeof(p), "%s/%s", restore_from, HP_CKPT_LATEST);
	if (!access(p, F_OK)) {
		if ((rc = read_latest(restore_from, &step, e)))
			return rc;
		snprintf(dir, n, "%s/global_step_%ld", restore_from, step);
		return 0;
	}
	return hp_err_set(e, HP_EIO, "'%s': not a checkpoint (no checkpoint.json) nor a checkpoint_dir "
			  "(no %s)", restore_from, HP_CKPT_LATEST);
}

static const char *str(json_t *j)
{
	const char *s = json_string_value(j);

	return s ? s : "";
}

/* A count that JSON gives as a non-negative integer; -1 otherwise. */
static json_int_t count_of(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v) : -1;
}

/* A relative path inside the checkpoint: no "..", no leading '/'. */
static int inside(const char *rel)
{
	if (!*rel || *rel == '/')
		return 0;
	for (const char *c = rel; *c;) {
		size_t n = strcspn(c, "/");

		if ((n == 2 && c[0] == '.' && c[1] == '.') || n == 0)
			return 0;
		c += n;
		c += *c == '/';
	}
	return 1;
}

int hp_ckpt_meta_parse(const char *name, const char *text, size_t len, struct hp_ckpt_meta *m,
		       struct hp_err *e)
{
	json_error_t je;
	json_t *j, *f;
	size_t i;

	memset(m, 0, sizeof(*m));
	if (!(j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je)))
		return hp_err_set(e, HP_EFORMAT, "'%s': line %d: %s", name, je.line, je.text);
	if (!json_is_object(j) || strcmp(str(json_object_get(j, "format")), HP_CKPT_FORMAT)) {
		json_decref(j);
		return hp_err_set(e, HP_EFORMAT, "'%s': not an %s file", name, HP_CKPT_FORMAT);
	}
	m->step = count_of(j, "step");
	m->world = count_of(j, "world_size");
	m->optimizer = json_is_true(json_object_get(j, "optimizer"));
	m->files = json_object_get(j, "files");
	snprintf(m->plan, sizeof(m->plan), "%s", str(json_object_get(j, "plan")));
	if (m->step < 1 || m->world < 1 || strlen(m->plan) != 64 || !json_is_array(m->files) ||
	    !json_is_boolean(json_object_get(j, "optimizer"))) {
		json_decref(j);
		return hp_err_set(e, HP_EFORMAT, "'%s': expected its step, world_size, plan hash, optimizer "
				  "flag and file list", name);
	}
	json_array_foreach(m->files, i, f) {
		const char *rel = json_string_value(json_object_get(f, "path"));
		const char *crc = str(json_object_get(f, "crc32c"));

		if (!rel || !inside(rel) || count_of(f, "bytes") < 0 || strlen(crc) != 8 ||
		    strspn(crc, "0123456789abcdef") != 8) {
			json_decref(j);
			return hp_err_set(e, HP_EFORMAT, "'%s': files[%zu] is malformed", name, i);
		}
	}
	m->json = j;
	return 0;
}

void hp_ckpt_meta_release(struct hp_ckpt_meta *m)
{
	json_decref(m->json);
	memset(m, 0, sizeof(*m));
}

int hp_ckpt_state_parse(const char *name, const char *text, size_t len, struct hp_ckpt_state *st,
			struct hp_err *e)
{
	json_error_t je;
	json_t *j, *d;
	const char *mode;
	int ok;

	memset(st, 0, sizeof(*st));
	if (!(j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je)))
		return hp_err_set(e, HP_EFORMAT, "'%s': line %d: %s", name, je.line, je.text);
	d = json_object_get(j, "data");
	mode = str(json_object_get(d, "mode"));
	st->online = !strcmp(mode, "online");
	st->step = (long)count_of(j, "step");
	ok = json_is_object(j) && json_is_object(d) && st->step >= 1 && count_of(j, "seed") >= 0 &&
	     (st->online || !strcmp(mode, "indexed")) && count_of(d, "epoch") >= 0 &&
	     (st->online ? count_of(d, "doc") >= 0 && count_of(d, "offset") >= 0 : count_of(d, "position") >= 0);
	if (ok) {
		st->seed = (uint64_t)count_of(j, "seed");
		st->epoch = (uint64_t)count_of(d, "epoch");
		st->pos = st->online ? 0 : (uint64_t)count_of(d, "position");
		st->doc = st->online ? (uint64_t)count_of(d, "doc") : 0;
		st->off = st->online ? (uint64_t)count_of(d, "offset") : 0;
	}
	json_decref(j);
	if (!ok)
		return hp_err_set(e, HP_EFORMAT, "'%s': expected the step, the seed and the data cursor", name);
	return 0;
}

/* A file's text, read whole. */
static int slurp(const char *path, char **text, size_t *len, struct hp_err *e)
{
	FILE *f = fopen(path, "rb");
	int rc;

	*text = NULL;
	if (!f)
		return hp_err_set(e, HP_EIO, "'%s': %s", path, errno == ENOENT ?
				  "missing: the checkpoint is not complete" : strerror(errno));
	rc = hp_read_stream(f, text, len);
	fclose(f);
	if (rc)
		return hp_err_set(e, errno == ENOMEM ? HP_ENOMEM : HP_EIO, "'%s': cannot read: %s", path,
				  strerror(errno));
	return 0;
}

static json_t *load_json(const char *path, struct hp_err *e)
{
	json_error_t je;
	json_t *j = json_load_file(path, 0, &je);

	if (!j)
		hp_err_set(e, access(path, F_OK) ? HP_EIO : HP_EFORMAT, "'%s': %s", path,
			   access(path, F_OK) ? "missing: the checkpoint is not complete" : je.text);
	return j;
}

/* Check this rank's share of the files checkpoint.json lists: present and
 * of their size.  Their content is left to the per-tensor checksums of
 * hp-shard/1, which restoring verifies anyway, rather than read every byte
 * twice; the whole-file CRC-32Cs are for tools that check a checkpoint
 * without loading it (train_state.json's is checked by every rank, which
 * reads it whole anyway). */
static int check_files(const char *dir, json_t *files, int rank, int world, struct hp_err *e)
{
	struct stat sb;
	size_t i;
	json_t *f;

	json_array_foreach(files, i, f) {
		const char *rel = json_string_value(json_object_get(f, "path"));
		json_int_t bytes = json_integer_value(json_object_get(f, "bytes"));
		char path[4400];

		if ((int)(i % (size_t)world) != rank)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, rel);
		if (stat(path, &sb))
			return hp_err_set(e, HP_EIO, "'%s': missing (checkpoint.json lists it): %s", path,
					  strerror(errno));
		if ((json_int_t)sb.st_size != bytes)
			return hp_err_set(e, HP_EFORMAT, "'%s': %llu bytes, checkpoint.json says %lld (truncated or "
					  "replaced)", path, (unsigned long long)sb.st_size, (long long)bytes);
	}
	return 0;
}

/*
 * train_state.json: listed in checkpoint.json with the CRC-32C of exactly
 * these bytes, and of the step checkpoint.json (and the folder's name)
 * says: a hand-edited or swapped state is refused, not resumed from.
 */
static int read_state(const char *dir, const struct hp_ckpt_meta *m, struct hp_ckpt_state *st,
		      struct hp_err *e)
{
	char path[4400], want[16];
	const char *base = strrchr(dir, '/');
	json_t *f, *entry = NULL;
	char *text;
	size_t len, i;
	long named;
	int k = 0, rc;

	snprintf(path, sizeof(path), "%s/train_state.json", dir);
	json_array_foreach(m->files, i, f)
		if (!strcmp(str(json_object_get(f, "path")), "train_state.json"))
			entry = f;
	if (!entry)
		return hp_err_set(e, HP_EFORMAT, "'%s/checkpoint.json': does not list train_state.json, so its step "
				  "and data cursor cannot be trusted (a checkpoint of an older hp: save it again)", dir);
	if ((rc = slurp(path, &text, &len, e)))
		return rc;
	snprintf(want, sizeof(want), "%08x", hp_crc32c(0, text, len));
	if ((json_int_t)len != json_integer_value(json_object_get(entry, "bytes")) ||
	    strcmp(want, str(json_object_get(entry, "crc32c"))))
		rc = hp_err_set(e, HP_EFORMAT, "'%s': its size or CRC-32C is not the one checkpoint.json records "
				"(edited or replaced)", path);
	if (!rc)
		rc = hp_ckpt_state_parse(path, text, len, st, e);
	hp_free(text);
	if (rc)
		return rc;
	if (st->step != m->step)
		return hp_err_set(e, HP_EFORMAT, "'%s': step %ld, but checkpoint.json says %ld", path, st->step,
				  m->step);
	base = base ? base + 1 : dir;
	if (sscanf(base, "global_step_%ld%n", &named, &k) == 1 && !base[k] && named != m->step)
		return hp_err_set(e, HP_EFORMAT, "'%s/checkpoint.json': step %ld in a folder named for step %ld",
				  dir, m->step, named);
	return 0;
}

int hp_ckpt_restore(const char *dir, const struct hp_plan *p, MPI_Comm comm, int moments,
		    hp_ckpt_piece_fn piece, void *ctx, struct hp_ckpt_state *st, struct hp_err *e)
{
	char path[4400];
	struct hp_ckpt_meta m;
	json_t *plan = NULL;
	char *text = NULL;
	size_t len;
	int rank, world, nk = 1, rc;

	MPI_Comm_rank(comm, &rank);
	MPI_Comm_size(comm, &world);
	memset(st, 0, sizeof(*st));
	memset(&m, 0, sizeof(m));
	snprintf(path, sizeof(path), "%s/checkpoint.json", dir);
	rc = slurp(path, &text, &len, e);
	if (!rc)
		rc = hp_ckpt_meta_parse(path, text, len, &m, e);
	hp_free(text);
	if (!rc) {
		/* the shard folders must be of the plan the metadata names */
		char pp[4400];

		snprintf(pp, sizeof(pp), "%s/model/plan.json", dir);
		if (!(plan = load_json(pp, e)))
			rc = e->code;
		else if (strcmp(m.plan, str(json_object_get(plan, "hash"))))
			rc = hp_err_set(e, HP_EFORMAT, "'%s': names plan %.12s, but '%s' is plan %.12s: the metadata "
					"is from another checkpoint", path, m.plan, pp, str(json_object_get(plan, "hash")));
	}
	if (!rc)
		rc = check_files(dir, m.files, rank, world, e);
	/* the step and data cursor before the tensors: cheap checks first */
	if (!rc)
		rc = read_state(dir, &m, st, e);
	if ((rc = agree(comm, rc, e)))
		goto out;
	if (moments && m.optimizer)
		nk = HP_CKPT_NKIND;
	for (int k = 0; k < nk && !rc; k++) {
		struct hp_src src;
		char sub[4400];

		snprintf(sub, sizeof(sub), "%s/%s", dir, kind_dir[k]);
		rc = hp_src_open_shards_part(&src, p, sub, rank, world, NULL, e);
		if (!(rc = agree(comm, rc, e)))
			for (int i = 0; i < p->nparams && !rc; i++) {
				float *x = piece(ctx, k, i);
				struct hp_piece pc;

				if (!x)
					continue;
				hp_plan_piece(p, &p->params[i], rank, &pc);
				rc = hp_src_read(&src, i, pc.row0, pc.nrows, pc.col0, pc.cols, x, e);
			}
		hp_src_close(&src);
		rc = agree(comm, rc, e);
	}
out:
	hp_ckpt_meta_release(&m);
	json_decref(plan);
	return rc;
}
