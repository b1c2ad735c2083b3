/*
 * shard.c - sources of parameter values, per-rank shard files, HF export.
 *
 * Everything moves in blocks of whole rows of at most BLOCK elements, read
 * with pread, so that converting a checkpoint of any size keeps a few MiB
 * per process resident.  The layout rules are hp_plan_piece's.
 */
#include <jansson.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/crc32c.h"
#include "base/dtype.h"
#include "base/fileio.h"
#include "config/hfconfig.h"
#include "dist/shard.h"
#include "model/init.h"
#include "model/params.h"

#define BLOCK ((int64_t)1 << 20)   /* elements per block: 4 MiB of F32 */

/* Where a plan parameter's rows live in an HF folder's tensor. */
struct hp_src_view {
	const struct hp_st_tensor *t;
	int64_t row_base, cols;      /* rows counted in the tensor seen as [*, cols] */
	/* strided (GPT-OSS's stacked experts): sv.rs non-zero, element (r, c)
	 * at flat index sv.base + r * sv.rs + c * sv.cs (params.h) */
	/* MXFP4 (GPT-OSS): t the blocks, mxs the scales, sv where the
	 * parameter's rows are (params.h, hp_mxfp4_rows) */
	const struct hp_st_tensor *mxs;
	struct hp_stacked_view sv;
};

static void padd(struct hp_progress *pg, uint64_t n)
{
	if (pg)
		hp_progress_add(pg, n);
}

void hp_shard_name(char *buf, size_t n, int rank, int world)
{
	snprintf(buf, n, "rank-%05d-of-%05d.safetensors", rank, world);
}

static int64_t qcols(const struct hp_plan_param *q)
{
	return q->ndim > 1 ? q->shape[1] : 1;
}

static void *scratch(struct hp_src *s, size_t bytes)
{
	if (bytes > s->cap) {
		hp_free(s->buf);
		s->cap = 0;
		if (!(s->buf = hp_malloc(bytes)))
			return NULL;
		s->cap = bytes;
	}
	return s->buf;
}

/* --- the model must be the plan's ------------------------------------------- */

static int same_model(const struct hp_plan *p, const struct hp_model_spec *s, const char *what,
		      struct hp_err *e)
{
	json_t *a = hp_model_spec_json(&p->spec), *b = hp_model_spec_json(s), *v;
	const char *k;
	int rc = 0;

	if (!a || !b) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory");
	} else {
		json_object_foreach(a, k, v) {
			json_t *w = json_object_get(b, k);
			char *x, *y;

			/* which release wrote it, and the keys hp warns of, are not the model */
			if (!strcmp(k, "transformers_version") || !strcmp(k, "hp_unknown_keys"))
				continue;
			if (w && json_equal(v, w))
				continue;
			x = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
			y = w ? json_dumps(w, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
			rc = hp_err_set(e, HP_ECONFIG, "'%s': %s is %s, the plan's model has %s: the plan was "
					"made for another model", what, k, y ? y : "absent", x ? x : "?");
			free(x);
			free(y);
			break;
		}
	}
	json_decref(a);
	json_decref(b);
	return rc;
}

/* --- HF folders ----------------------------------------------------------------- */

static int cmp_name_ptr(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Find q in the folder: by name, or inside a layer's stacked expert tensor
 * (gate_up_proj [E, 2*Im, C]: each expert's gate rows, then its up rows;
 * down_proj [E, C, Im]). */
static int find_view(struct hp_src *s, const struct hp_plan_param *q, struct hp_src_view *v,
		     struct hp_err *e)
{
	const struct hp_model_spec *sp = &s->plan->spec;
	const struct hp_st_tensor *t = hp_st_model_find(&s->st, q->name);
	struct hp_stacked_view sv;

	if (t) {
		/* the checkpoint's shape (params.h: Gated DeltaNet's conv is [C, 1, K] there) */
		int rc = hp_param_hf_check_shape(t, q->name, q->ndim, q->shape, s->dir, "the plan's model needs", e);

		if (rc)
			return rc;
		v->t = t;
		v->row_base = 0;
		v->cols = qcols(q);
		return 0;
	}
	if (hp_param_stacked(sp, q->name, &sv)) {
		int rc = hp_stacked_find(&s->st, &sv, sp->n_experts, s->dir, &v->t, &v->mxs, e);

		if (rc <= 0) {
			v->cols = qcols(q);
			v->sv = sv;
			if (!rc && !v->mxs && sv.cs == 1 && sv.rs == v->cols && sv.base % v->cols == 0) {
				v->row_base = sv.base / v->cols;   /* whole rows */
				v->sv.rs = 0;
			}
			return rc;
		}
	}
	return hp_err_set(e, HP_EFORMAT, "'%s': tensor '%s' that the plan needs is missing", s->dir, q->name);
}

int hp_src_open_hf(struct hp_src *s, const struct hp_plan *p, const char *dir, struct hp_err *e)
{
	struct hp_model_spec spec;
	const char **names = NULL;
	char cfg[4200];
	int rc;

	memset(s, 0, sizeof(*s));
	s->kind = HP_SRC_HF;
	s->plan = p;
	if (!(s->dir = hp_strdup(dir)))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	snprintf(cfg, sizeof(cfg), "%s/config.json", dir);
	if ((rc = hp_hfconfig_load(&spec, dir, e)) || (rc = same_model(p, &spec, cfg, e)) ||
	    (rc = hp_st_model_open_flags(&s->st, dir, HP_ST_PREAD, e)))
		goto fail;
	if (!(s->views = hp_calloc((size_t)p->nparams, sizeof(*s->views))) ||
	    !(names = hp_calloc((size_t)p->nparams, sizeof(*names)))) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory");
		goto fail;
	}
	for (int i = 0; i < p->nparams; i++) {
		if ((rc = find_view(s, &p->params[i], &s->views[i], e)))
			goto fail;
		names[i] = p->params[i].name;
	}
	/* nothing in the folder that the model would not use */
	qsort(names, (size_t)p->nparams, sizeof(*names), cmp_name_ptr);
	for (size_t j = 0; j < s->st.ntensors; j++) {
		const char *n = s->st.tensors[j]->name;

		if (bsearch(&n, names, (size_t)p->nparams, sizeof(*names), cmp_name_ptr) ||
		    hp_param_is_stacked(&p->spec, n) || hp_param_not_loaded(&p->spec, n) ||
		    strstr(n, "rotary_emb.inv_freq") ||
		    (p->spec.tie_word_embeddings && !strcmp(n, "lm_head.weight")))
			continue;
		rc = hp_err_set(e, HP_EFORMAT, "'%s': unexpected tensor '%s' for model_type %s", dir, n,
				p->spec.model_type);
		goto fail;
	}
	hp_free(names);
	return 0;
fail:
	hp_free(names);
	hp_src_close(s);
	return rc;
}

/* A strided view (GPT-OSS's stacked experts): the span of the tensor that
 * holds the block, read once, then picked element by element. */
static int read_strided(struct hp_src *s, const struct hp_src_view *v, int64_t r0, int64_t nr, int64_t c0,
			int64_t nc, float *dst, struct hp_err *e)
{
	const struct hp_stacked_view *x = &v->sv;
	size_t esz = hp_dtype_size(v->t->dtype);
	int64_t lo = x->base + r0 * x->rs + c0 * x->cs, hi = x->base + (r0 + nr - 1) * x->rs + (c0 + nc - 1) * x->cs;
	size_t n = (size_t)(hi - lo + 1);
	float *span = hp_malloc(n * sizeof(float));
	void *raw = v->t->dtype == HP_DTYPE_F32 ? (void *)span : scratch(s, n * esz);
	int rc;

	if (!span || !raw) {
		hp_free(span);
		return hp_err_set(e, HP_ENOMEM, "out of memory reading '%s'", v->t->name);
	}
	if (!(rc = hp_st_pread(v->t, (uint64_t)lo * esz, raw, n * esz, e)) && raw != (void *)span &&
	    hp_convert_to_f32(span, raw, v->t->dtype, n))
		rc = hp_err_set(e, HP_EUNSUP, "'%s': tensor '%s' is %s; hp reads F32, BF16 and F16", s->dir,
				v->t->name, hp_dtype_name(v->t->dtype));
	for (int64_t r = 0; !rc && r < nr; r++)
		for (int64_t c = 0; c < nc; c++)
			dst[r * nc + c] = span[r * x->rs + c * x->cs];
	hp_free(span);
	return rc;
}

static int read_hf(struct hp_src *s, int i, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *dst,
		   struct hp_err *e)
{
	const struct hp_src_view *v = &s->views[i];
	size_t esz = hp_dtype_size(v->t->dtype);
	int whole = c0 == 0 && nc == v->cols;

	if (v->mxs) {
		void *buf = scratch(s, hp_mxfp4_buf_bytes(&v->sv));

		return buf ? hp_mxfp4_rows(&v->sv, v->t, v->mxs, r0, nr, c0, nc, dst, buf, e) :
			     hp_err_set(e, HP_ENOMEM, "out of memory reading '%s'", v->t->name);
	}
	if (v->sv.rs)
		return read_strided(s, v, r0, nr, c0, nc, dst, e);
	/* whole rows are one run; a column slice is one run per row */
	int64_t runs = whole ? 1 : nr, run = whole ? nr * nc : nc;

	for (int64_t k = 0; k < runs; k++) {
		uint64_t off = ((uint64_t)(v->row_base + r0 + k) * (uint64_t)v->cols + (uint64_t)c0) * esz;
		float *out = dst + k * nc;
		int rc;

		if (v->t->dtype == HP_DTYPE_F32) {
			rc = hp_st_pread(v->t, off, out, (size_t)run * esz, e);
		} else {
			void *raw = scratch(s, (size_t)run * esz);

			if (!raw)
				return hp_err_set(e, HP_ENOMEM, "out of memory");
			if (!(rc = hp_st_pread(v->t, off, raw, (size_t)run * esz, e)) &&
			    hp_convert_to_f32(out, raw, v->t->dtype, (size_t)run))
				rc = hp_err_set(e, HP_EUNSUP, "'%s': tensor '%s' is %s; hp reads F32, BF16 and F16",
						s->dir, v->t->name, hp_dtype_name(v->t->dtype));
		}
		if (rc)
			return rc;
	}
	return 0;
}

/* --- shard directories ---------------------------------------------------------- */

/* Whether rank r's copy of q is the one to read: replicas (and tp copies of
 * a tp-replicated tensor) hold the same bytes, so take coordinate 0. */
static int canonical(const struct hp_plan *p, const struct hp_plan_param *q, int r)
{
	if (!hp_plan_owns(p, q, r) || q->stage != hp_plan_stage(p, r))   /* a tied embedding: the first stage's */
		return 0;
	if (q->mesh == HP_MESH_EXPERT)
		return hp_mesh_coord(p->size, HP_DIM_EDP_REPLICATE, r) == 0;
	return hp_mesh_coord(p->size, HP_DIM_DP_REPLICATE, r) == 0 &&
	       (q->pl[HP_DIM_TP].kind == HP_PL_SHARD || hp_mesh_coord(p->size, HP_DIM_TP, r) == 0);
}

int hp_src_open_shards(struct hp_src *s, const struct hp_plan *p, const char *dir,
		       struct hp_progress *pg, struct hp_err *e)
{
	return hp_src_open_shards_part(s, p, dir, 0, 1, pg, e);
}

int hp_src_open_shards_part(struct hp_src *s, const struct hp_plan *p, const char *dir, int proc,
			    int nproc, struct hp_progress *pg, struct hp_err *e)
{
	char path[4200], name[64], hash[65];
	int rc;

	memset(s, 0, sizeof(*s));
	s->kind = HP_SRC_SHARDS;
	s->plan = p;
	if (!(s->dir = hp_strdup(dir)))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	snprintf(path, sizeof(path), "%s/plan.json", dir);
	if ((rc = hp_plan_load(&s->old, NULL, path, e)) || (rc = same_model(p, &s->old->spec, path, e)) ||
	    (rc = hp_plan_hash(s->old, hash, e)))
		goto fail;
	/* the same model has the same parameter list, in the same order */
	for (int i = 0; i < p->nparams; i++)
		if (i >= s->old->nparams || strcmp(p->params[i].name, s->old->params[i].name)) {
			rc = hp_err_set(e, HP_EINVAL, "'%s': parameter lists differ at %d", path, i);
			goto fail;
		}
	if (!(s->files = hp_calloc((size_t)s->old->world, sizeof(*s->files)))) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory");
		goto fail;
	}
	for (int r = 0; r < s->old->world; r++)
		s->files[r].fd = -1;
	for (int r = 0; r < s->old->world; r++) {
		hp_shard_name(name, sizeof(name), r, s->old->world);
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		if ((rc = hp_st_open_flags(&s->files[r], path, HP_ST_PREAD, e)) ||
		    (r % nproc == proc && (rc = hp_shard_verify(s->old, hash, r, &s->files[r], pg, e))))
			goto fail;
	}
	return 0;
fail:
	hp_src_close(s);
	return rc;
}

static int read_shards(struct hp_src *s, int i, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
		       float *dst, struct hp_err *e)
{
	const struct hp_plan *o = s->old;
	const struct hp_plan_param *q = &o->params[i];
	int64_t want = nr * nc, got = 0;

	for (int r = 0; r < o->world; r++) {
		const struct hp_st_tensor *t;
		struct hp_piece pc;
		int64_t a, b, x, y;

		if (!canonical(o, q, r))
			continue;
		hp_plan_piece(o, q, r, &pc);
		a = r0 > pc.row0 ? r0 : pc.row0;
		b = r0 + nr < pc.row0 + pc.nrows ? r0 + nr : pc.row0 + pc.nrows;
		x = c0 > pc.col0 ? c0 : pc.col0;
		y = c0 + nc < pc.col0 + pc.cols ? c0 + nc : pc.col0 + pc.cols;
		if (a >= b || x >= y)
			continue;
		if (!(t = hp_st_find(&s->files[r], q->name)))
			return hp_err_set(e, HP_EFORMAT, "'%s': no tensor '%s'", s->files[r].path, q->name);
		if (x == pc.col0 && y == pc.col0 + pc.cols && x == c0 && y == c0 + nc) {
			/* whole rows on both sides: one run */
			int rc = hp_st_pread(t, (uint64_t)((a - pc.row0) * pc.cols) * 4, dst + (a - r0) * nc,
					     (size_t)((b - a) * nc) * 4, e);
			if (rc)
				return rc;
		} else {
			for (int64_t row = a; row < b; row++) {
				int rc = hp_st_pread(t, (uint64_t)((row - pc.row0) * pc.cols + (x - pc.col0)) * 4,
						     dst + (row - r0) * nc + (x - c0), (size_t)(y - x) * 4, e);
				if (rc)
					return rc;
			}
		}
		got += (b - a) * (y - x);
	}
	if (got != want)
		return hp_err_set(e, HP_EINVAL, "'%s': the old plan's pieces cover %lld of %lld elements of "
				  "'%s'", s->dir, (long long)got, (long long)want, q->name);
	return 0;
}

/* --- random init ---------------------------------------------------------------- */

int hp_src_open_init(struct hp_src *s, const struct hp_plan *p, struct hp_err *e)
{
	json_t *seed = json_object_get(json_object_get(p->config, "training"), "seed");

	memset(s, 0, sizeof(*s));
	s->kind = HP_SRC_INIT;
	s->plan = p;
	if (!json_is_integer(seed))
		return hp_err_set(e, HP_EINVAL, "the plan's config has no training.seed");
	s->seed = (uint64_t)json_integer_value(seed);
	return 0;
}

void hp_src_open_fn(struct hp_src *s, const struct hp_plan *p, hp_src_fn fn, void *ctx)
{
	memset(s, 0, sizeof(*s));
	s->kind = HP_SRC_FN;
	s->plan = p;
	s->fn = fn;
	s->fn_ctx = ctx;
}

static void read_init(struct hp_src *s, int i, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *dst)
{
	const struct hp_plan_param *q = &s->plan->params[i];
	const struct hp_model_spec *sp = &s->plan->spec;
	int64_t cols = qcols(q);

	for (int64_t k = 0; k < nr; k++) {
		hp_init_slice(dst + k * nc, sp, s->seed, q->name, (uint64_t)((r0 + k) * cols + c0),
			      (size_t)nc, (float)sp->initializer_range);
		/* nn.Embedding(padding_idx=pad_token_id) starts that row at zero, as lib/train/train.c */
		if (r0 + k == sp->pad_token_id && hp_param_is_embed(q->name))
			memset(dst + k * nc, 0, (size_t)nc * sizeof(float));
	}
}

int hp_src_read(struct hp_src *s, int i, int64_t r0, int64_t nr, int64_t c0, int64_t nc, float *dst,
		struct hp_err *e)
{
	if (nr <= 0 || nc <= 0)
		return 0;
	switch (s->kind) {
	case HP_SRC_HF: return read_hf(s, i, r0, nr, c0, nc, dst, e);
	case HP_SRC_SHARDS: return read_shards(s, i, r0, nr, c0, nc, dst, e);
	case HP_SRC_INIT: read_init(s, i, r0, nr, c0, nc, dst); return 0;
	case HP_SRC_FN: return s->fn(s->fn_ctx, i, r0, nr, c0, nc, dst, e);
	}
	return hp_err_set(e, HP_EINVAL, "no source");
}

void hp_src_close(struct hp_src *s)
{
	hp_st_model_close(&s->st);
	hp_free(s->views);
	for (int r = 0; s->files && s->old && r < s->old->world; r++)
		hp_st_close(&s->files[r]);
	hp_free(s->files);
	hp_plan_free(s->old);
	hp_free(s->buf);
	hp_free(s->dir);
	memset(s, 0, sizeof(*s));
}

/* --- shard files ---------------------------------------------------------------- */

uint64_t hp_shard_bytes(const struct hp_plan *p, int rank)
{
	uint64_t n = 0;

	for (int i = 0; i < p->nparams; i++) {
		struct hp_piece pc;

		if (!hp_plan_owns(p, &p->params[i], rank))
			continue;
		hp_plan_piece(p, &p->params[i], rank, &pc);
		n += (uint64_t)(pc.nrows * pc.cols) * 4;
	}
	return n;
}

static void dims_str(char *buf, size_t n, int ndim, int64_t a, int64_t b)
{
	if (ndim > 1)
		snprintf(buf, n, "%lld,%lld", (long long)a, (long long)b);
	else
		snprintf(buf, n, "%lld", (long long)a);
}

/* The metadata of rank's shard: 5 fixed keys, then 3 per tensor. */
struct meta {
	size_t n;
	char **keys, **vals;
};

static void meta_free(struct meta *m)
{
	for (size_t i = 0; i < m->n; i++) {
		hp_free(m->keys[i]);
		hp_free(m->vals[i]);
	}
	hp_free(m->keys);
	hp_free(m->vals);
	memset(m, 0, sizeof(*m));
}

static int meta_add(struct meta *m, const char *k1, const char *k2, const char *v)
{
	size_t kl = strlen(k1) + strlen(k2) + 1;

	if (!(m->keys[m->n] = hp_malloc(kl)) || !(m->vals[m->n] = hp_strdup(v)))
		return -1;
	snprintf(m->keys[m->n], kl, "%s%s", k1, k2);
	m->n++;
	return 0;
}

int hp_shard_write(const struct hp_plan *p, int rank, struct hp_src *src, const char *dir,
		   struct hp_progress *pg, struct hp_err *e)
{
	struct hp_st_entry *ent = NULL;
	int *idx = NULL, n = 0, rc = 0, bad = 0;
	struct hp_st_writer w = { 0 };
	struct meta m = { 0 };
	char path[4200], name[64], hash[65], a[48], b[48];
	uint32_t *crc = NULL;
	float *blk = NULL;
	size_t blkn = 0;

	hp_shard_name(name, sizeof(name), rank, p->world);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if ((rc = hp_plan_hash(p, hash, e)))
		return rc;
	ent = hp_calloc((size_t)p->nparams + 1, sizeof(*ent));
	idx = hp_calloc((size_t)p->nparams + 1, sizeof(*idx));
	crc = hp_calloc((size_t)p->nparams + 1, sizeof(*crc));
	m.keys = hp_calloc(5 + 3 * (size_t)p->nparams, sizeof(char *));
	m.vals = hp_calloc(5 + 3 * (size_t)p->nparams, sizeof(char *));
	if (!ent || !idx || !crc || !m.keys || !m.vals) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory writing '%s'", path);
		goto out;
	}
	snprintf(a, sizeof(a), "%d", rank);
	snprintf(b, sizeof(b), "%d", p->world);
	bad |= meta_add(&m, "format", "", "pt") | meta_add(&m, "hp_format", "", HP_SHARD_FORMAT) |
	       meta_add(&m, "hp_plan", "", hash) | meta_add(&m, "hp_rank", "", a) | meta_add(&m, "hp_world", "", b);
	for (int i = 0; i < p->nparams; i++) {
		const struct hp_plan_param *q = &p->params[i];
		struct hp_piece pc;

		if (!hp_plan_owns(p, q, rank))
			continue;
		hp_plan_piece(p, q, rank, &pc);
		ent[n].name = q->name;
		ent[n].dtype = HP_DTYPE_F32;
		ent[n].ndim = q->ndim;
		ent[n].shape[0] = pc.nrows;
		ent[n].shape[1] = pc.cols;
		idx[n++] = i;
		if ((size_t)pc.cols > blkn)
			blkn = (size_t)pc.cols;
		dims_str(a, sizeof(a), q->ndim, q->shape[0], qcols(q));
		bad |= meta_add(&m, "hp_global.", q->name, a);
		dims_str(a, sizeof(a), q->ndim, pc.row0, pc.col0);
		bad |= meta_add(&m, "hp_offset.", q->name, a);
		bad |= meta_add(&m, "hp_crc32c.", q->name, "00000000");
	}
	blkn = blkn > (size_t)BLOCK ? blkn : (size_t)BLOCK;
	if (bad || !(blk = hp_malloc(blkn * sizeof(float)))) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory writing '%s'", path);
		goto out;
	}
	if ((rc = hp_st_writer_open(&w, path, (size_t)n, ent, m.n, (const char *const *)m.keys,
				    (const char *const *)m.vals, e)))
		goto out;
	for (int k = 0; k < n; k++) {
		size_t j = hp_st_writer_index(&w, (size_t)k);
		const struct hp_plan_param *q = &p->params[idx[j]];
		struct hp_piece pc;
		int64_t step;

		hp_plan_piece(p, q, rank, &pc);
		step = (int64_t)blkn / pc.cols;
		for (int64_t r = 0; r < pc.nrows; r += step) {
			int64_t nr = pc.nrows - r < step ? pc.nrows - r : step;
			size_t bytes = (size_t)(nr * pc.cols) * 4;

			if ((rc = hp_src_read(src, idx[j], pc.row0 + r, nr, pc.col0, pc.cols, blk, e)) ||
			    (rc = hp_st_writer_put(&w, blk, bytes, e)))
				goto out;
			crc[j] = hp_crc32c(crc[j], blk, bytes);
			padd(pg, bytes);
		}
	}
	for (int k = 0; k < n; k++)
		snprintf(m.vals[5 + 3 * (size_t)k + 2], 9, "%08x", crc[k]);
	if ((rc = hp_st_writer_set_meta(&w, m.n, (const char *const *)m.keys, (const char *const *)m.vals, e)))
		goto out;
	rc = hp_st_writer_commit(&w, e);
out:
	if (rc)
		hp_st_writer_abort(&w);
	meta_free(&m);
	hp_free(ent);
	hp_free(idx);
	hp_free(crc);
	hp_free(blk);
	return rc;
}

int hp_shard_verify(const struct hp_plan *p, const char *hash, int rank, const struct hp_st_file *f,
		    struct hp_progress *pg, struct hp_err *e)
{
	const char *v, *path = f->path ? f->path : "shard";
	char want[48], key[300];
	size_t owned = 0;
	unsigned char *buf;
	int rc = 0;

	if (!(v = hp_st_meta(f, "hp_format")) || strcmp(v, HP_SHARD_FORMAT))
		return hp_err_set(e, HP_EFORMAT, "'%s': not an hp shard (no hp_format %s in its metadata)", path,
				  HP_SHARD_FORMAT);
	if (!(v = hp_st_meta(f, "hp_plan")) || strcmp(v, hash))
		return hp_err_set(e, HP_EFORMAT, "'%s': made for plan %.12s..., not for this plan %.12s...; "
				  "convert again for this plan", path, v ? v : "(none)", hash);
	snprintf(want, sizeof(want), "%d", rank);
	if (!(v = hp_st_meta(f, "hp_rank")) || strcmp(v, want))
		return hp_err_set(e, HP_EFORMAT, "'%s': holds rank %s, expected rank %d", path, v ? v : "(none)", rank);
	snprintf(want, sizeof(want), "%d", p->world);
	if (!(v = hp_st_meta(f, "hp_world")) || strcmp(v, want))
		return hp_err_set(e, HP_EFORMAT, "'%s': made for %s ranks, expected %d", path, v ? v : "(none)",
				  p->world);
	if (!(buf = hp_malloc((size_t)BLOCK * 4)))
		return hp_err_set(e, HP_ENOMEM, "out of memory");
	for (int i = 0; i < p->nparams && !rc; i++) {
		const struct hp_plan_param *q = &p->params[i];
		const struct hp_st_tensor *t;
		struct hp_piece pc;
		uint32_t crc = 0;
		char hex[9];

		if (!hp_plan_owns(p, q, rank))
			continue;
		owned++;
		hp_plan_piece(p, q, rank, &pc);
		if (!(t = hp_st_find(f, q->name))) {
			rc = hp_err_set(e, HP_EFORMAT, "'%s': tensor '%s' is missing", path, q->name);
			break;
		}
		if (t->dtype != HP_DTYPE_F32 || t->ndim != q->ndim || t->shape[0] != pc.nrows ||
		    (q->ndim > 1 && t->shape[1] != pc.cols)) {
			rc = hp_err_set(e, HP_EFORMAT, "'%s': tensor '%s' is not the plan's F32 piece of %lld x %lld",
					path, q->name, (long long)pc.nrows, (long long)pc.cols);
			break;
		}
		dims_str(want, sizeof(want), q->ndim, pc.row0, pc.col0);
		snprintf(key, sizeof(key), "hp_offset.%s", q->name);
		if (!(v = hp_st_meta(f, key)) || strcmp(v, want)) {
			rc = hp_err_set(e, HP_EFORMAT, "'%s': tensor '%s' starts at %s, the plan says %s", path,
					q->name, v ? v : "(none)", want);
			break;
		}
		for (size_t off = 0; off < t->nbytes && !rc; off += (size_t)BLOCK * 4) {
			size_t len = t->nbytes - off < (size_t)BLOCK * 4 ? t->nbytes - off : (size_t)BLOCK * 4;

			if (!(rc = hp_st_pread(t, off, buf, len, e)))
				crc = hp_crc32c(crc, buf, len);
			padd(pg, len);
		}
		if (rc)
			break;
		snprintf(hex, sizeof(hex), "%08x", crc);
		snprintf(key, sizeof(key), "hp_crc32c.%s", q->name);
		if (!(v = hp_st_meta(f, key)) || strcmp(v, hex))
			rc = hp_err_set(e, HP_EFORMAT, "'%s': tensor '%s' fails its checksum (stored %s, computed %s): "
					"the file is corrupt", path, q->name, v ? v : "(none)", hex);
	}
	hp_free(buf);
	if (!rc && f->ntensors != owned)
		rc = hp_err_set(e, HP_EFORMAT, "'%s': %zu tensors, the plan gives rank %d %zu", path,
				f->ntensors, rank, owned);
	return rc;
}

/* --- HF export ------------------------------------------------------------------ */

/* Whether the cnt floats of name's rows from r0 (cols each) are finite:
 * 0, or HP_EFORMAT naming the first other value and its row. */
static int all_finite(const char *name, const float *blk, size_t cnt, int64_t r0, int64_t cols, struct hp_err *e)
{
	size_t x = hp_find_nonfinite(blk, cnt);

	if (x == cnt)
		return 0;
	return hp_err_set(e, HP_EFORMAT, "'%s' holds %g at row %lld: an HF folder of it would not load into a "
			  "usable model (a checkpoint of a run with debug.check_nan_inf: false?)", name, blk[x],
			  (long long)(r0 + (int64_t)(x / (size_t)cols)));
}

/*
 * GPT-OSS's experts leave as transformers stores them, stacked per layer
 * (params.h, hp_param_stacked): the export writes one entry per stacked
 * tensor, at its layer's first expert parameter of that tensor, and
 * fills it expert by expert.  stacked_expert: for parameter i of such a
 * model, its expert (>= 0) and view, or -1 when it is not a stacked one.
 */
static int stacked_expert(const struct hp_plan *p, int i, struct hp_stacked_view *v)
{
	return p->spec.moe_bias && hp_param_stacked(&p->spec, p->params[i].name, v) ? v->expert : -1;
}

/* Entry i's (expert 0's) counterpart of expert x and part (0 gate, 1 up,
 * 2 down): params.h lists each GPT-OSS expert's six tensors together (the
 * weights gate, up, down, then their biases), which the view of the
 * parameter found there confirms; -1 if not. */
static int expert_param(const struct hp_plan *p, int i, const struct hp_stacked_view *v, int x, int part)
{
	struct hp_stacked_view w;
	int j = i + 6 * x + part - v->part;

	return j < p->nparams && stacked_expert(p, j, &w) == x && w.part == part && !strcmp(w.name, v->name) ?
	       j : -1;
}

/* Write stacked tensor of entry i (the first expert's parameter, gate or
 * down, weight or bias) expert by expert, each expert's block converted to
 * dtype; blk holds at least 2 * Im * C floats, out their bytes. */
static int put_stacked(const struct hp_plan *p, struct hp_src *src, struct hp_st_writer *w, int i,
		       const struct hp_stacked_view *v, enum hp_dtype dtype, int finite, float *blk, void *out,
		       struct hp_progress *pg, struct hp_err *e)
{
	const struct hp_model_spec *s = &p->spec;
	int64_t C = s->hidden, Im = s->moe_intermediate, E = s->n_experts;
	int down = v->part == 2, bias = v->ndim == 2;
	int64_t per = down ? (bias ? C : Im * C) : (bias ? 2 * Im : 2 * Im * C);
	float *a = blk + per, *b = a + per / 2 + (down ? per / 2 : 0);
	int rc;

	for (int x = 0; x < E; x++) {
		int g = expert_param(p, i, v, x, down ? 2 : 0), u = down ? -1 : expert_param(p, i, v, x, 1);

		if (g < 0 || (!down && u < 0))
			return hp_err_set(e, HP_EINVAL, "internal: expert %d of '%s' is missing", x, p->params[i].name);
		if (down) {   /* [C, Im] or [C] -> [Im, C] or [C] */
			if ((rc = hp_src_read(src, g, 0, p->params[g].shape[0], 0, qcols(&p->params[g]), a, e)))
				return rc;
			for (int64_t c = 0; c < C; c++)
				for (int64_t k = 0; k < (bias ? 1 : Im); k++)
					blk[k * C + c] = a[c * (bias ? 1 : Im) + k];
		} else {      /* gate, up [Im, C] or [Im] -> [C, 2*Im] or [2*Im], interleaved */
			int64_t cols = bias ? 1 : C;

			if ((rc = hp_src_read(src, g, 0, Im, 0, cols, a, e)) ||
			    (rc = hp_src_read(src, u, 0, Im, 0, cols, b, e)))
				return rc;
			for (int64_t c = 0; c < cols; c++)
				for (int64_t k = 0; k < Im; k++) {
					blk[c * 2 * Im + 2 * k] = a[k * cols + c];
					blk[c * 2 * Im + 2 * k + 1] = b[k * cols + c];
				}
		}
		if (finite && (rc = all_finite(v->name, blk, (size_t)per, x, per, e)))   /* row: the expert */
			return rc;
		if (dtype != HP_DTYPE_F32)
			hp_convert_from_f32(out, dtype, blk, (size_t)per);
		if ((rc = hp_st_writer_put(w, dtype == HP_DTYPE_F32 ? (void *)blk : out, (size_t)per * hp_dtype_size(dtype), e)))
			return rc;
		padd(pg, (uint64_t)per * hp_dtype_size(dtype));
	}
	return 0;
}

/* The stacked tensor's name and shape for entry i; 0 when i is no entry
 * (a later expert's, or up's, folded into the first). */
static int stacked_entry(const struct hp_plan *p, int i, struct hp_st_entry *ent, char *name, size_t n)
{
	struct hp_stacked_view v;

	if (stacked_expert(p, i, &v) != 0 || v.part == 1)
		return 0;
	snprintf(name, n, "%s", v.name);
	ent->ndim = v.ndim;
	for (int d = 0; d < v.ndim; d++)
		ent->shape[d] = v.shape[d];
	return 1;
}

/* Which output file each parameter goes to: in the model's order, a new file
 * when the next tensor would pass max_shard (HF's rule). */
static int assign_files(const struct hp_plan *p, size_t esz, uint64_t max_shard, int *file)
{
	uint64_t cur = 0;
	int f = 0;

	for (int i = 0; i < p->nparams; i++) {
		uint64_t b = (uint64_t)(p->params[i].shape[0] * qcols(&p->params[i])) * esz;
		struct hp_stacked_view v;
		int x = stacked_expert(p, i, &v);

		/* a stacked tensor (GPT-OSS) is one file's: its experts never part */
		if (max_shard && cur && cur + b > max_shard && x <= 0) {
			f++;
			cur = 0;
		}
		cur += b;
		file[i] = f;
	}
	return f + 1;
}

static void file_name(char *buf, size_t n, int f, int nfiles)
{
	if (nfiles == 1)
		snprintf(buf, n, "model.safetensors");
	else
		snprintf(buf, n, "model-%05d-of-%05d.safetensors", f + 1, nfiles);
}

uint64_t hp_export_bytes(const struct hp_plan *p, enum hp_dtype dtype, uint64_t max_shard, int proc,
			 int nproc)
{
	int *file = hp_calloc((size_t)p->nparams + 1, sizeof(int));
	uint64_t n = 0;

	if (!file)
		return 0;
	assign_files(p, hp_dtype_size(dtype), max_shard, file);
	for (int i = 0; i < p->nparams; i++)
		if (file[i] % nproc == proc)
			n += (uint64_t)(p->params[i].shape[0] * qcols(&p->params[i])) * hp_dtype_size(dtype);
	hp_free(file);
	return n;
}

static int write_text(const char *path, const char *text, struct hp_err *e)
{
	return hp_write_file(path, text, strlen(text), e);
}

static int export_file(const struct hp_plan *p, struct hp_src *src, const char *path, const int *file,
		       int f, enum hp_dtype dtype, int finite, float *blk, void *out, struct hp_progress *pg,
		       struct hp_err *e)
{
	struct hp_st_entry *ent = hp_calloc((size_t)p->nparams + 1, sizeof(*ent));
	int *idx = hp_calloc((size_t)p->nparams + 1, sizeof(int));
	struct hp_st_writer w = { 0 };
	const char *mk[] = { "format" }, *mv[] = { "pt" };
	size_t esz = hp_dtype_size(dtype);
	struct hp_stacked_view sv;
	char *names = NULL;
	int n = 0, rc;

	if (!ent || !idx) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory writing '%s'", path);
		goto out;
	}
	if (!(names = hp_calloc((size_t)p->nparams + 1, 128))) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory writing '%s'", path);
		goto out;
	}
	for (int i = 0; i < p->nparams; i++) {
		if (file[i] != f)
			continue;
		if (stacked_expert(p, i, &sv) >= 0) {
			if (!stacked_entry(p, i, &ent[n], names + (size_t)n * 128, 128))
				continue;
			ent[n].name = names + (size_t)n * 128;
		} else {
			ent[n].name = p->params[i].name;
			ent[n].ndim = hp_param_hf_shape(p->params[i].name, p->params[i].ndim, p->params[i].shape,
							ent[n].shape);   /* as transformers' */
		}
		ent[n].dtype = dtype;
		idx[n++] = i;
	}
	if ((rc = hp_st_writer_open(&w, path, (size_t)n, ent, 1, mk, mv, e)))
		goto out;
	for (int k = 0; k < n; k++) {
		int i = idx[hp_st_writer_index(&w, (size_t)k)];
		const struct hp_plan_param *q = &p->params[i];
		int64_t cols = qcols(q), step = BLOCK / cols > 0 ? BLOCK / cols : 1;

		if (stacked_expert(p, i, &sv) >= 0) {
			if ((rc = put_stacked(p, src, &w, i, &sv, dtype, finite, blk, out, pg, e)))
				goto out;
			continue;
		}

		for (int64_t r = 0; r < q->shape[0]; r += step) {
			int64_t nr = q->shape[0] - r < step ? q->shape[0] - r : step;
			size_t cnt = (size_t)(nr * cols);

			if ((rc = hp_src_read(src, i, r, nr, 0, cols, blk, e)))
				goto out;
			if (finite && (rc = all_finite(q->name, blk, cnt, r, cols, e)))
				goto out;
			if (dtype != HP_DTYPE_F32)
				hp_convert_from_f32(out, dtype, blk, cnt);
			if ((rc = hp_st_writer_put(&w, dtype == HP_DTYPE_F32 ? (void *)blk : out, cnt * esz, e)))
				goto out;
			padd(pg, cnt * esz);
		}
	}
	rc = hp_st_writer_commit(&w, e);
out:
	if (rc)
		hp_st_writer_abort(&w);
	hp_free(ent);
	hp_free(idx);
	hp_free(names);
	return rc;
}

/* --- the exported folder's config and side files ---------------------------------- */

/* The config.json and folder the plan's model came from ("" when the
 * config names none). */
static void source_of(const struct hp_plan *p, char *file, size_t fn, char *dir, size_t dn)
{
	json_t *m = p->config ? json_object_get(p->config, "model") : NULL;
	json_t *v = m ? json_object_get(m, "config_path") : NULL;

	if (!json_is_string(v))
		v = m ? json_object_get(m, "pretrained_model_name_or_path") : NULL;
	file[0] = dir[0] = 0;
	if (json_is_string(v) && json_string_value(v)[0])
		hp_hfconfig_file(json_string_value(v), file, fn, dir, dn);
}

/* The normalised spec in 5.x's spelling: rope_parameters with rope_theta
 * inside, dtype, and qwen3_moe's num_local_experts (its attribute_map;
 * Qwen3-Next's and Qwen3.5's configs have num_experts alone). */
static void to_v5(json_t *o)
{
	json_t *rs = json_object_get(o, "rope_scaling"), *rp;

	rp = json_is_object(rs) ? json_deep_copy(rs) : json_pack("{ss}", "rope_type", "default");
	if (rp) {
		json_object_set(rp, "rope_theta", json_object_get(o, "rope_theta"));
		json_object_set_new(o, "rope_parameters", rp);
	}
	json_object_del(o, "rope_scaling");
	json_object_del(o, "rope_theta");
	json_object_set(o, "dtype", json_object_get(o, "torch_dtype"));
	json_object_del(o, "torch_dtype");
	if (json_object_get(o, "num_experts") && json_equal(json_object_get(o, "model_type"), json_string("qwen3_moe"))) {
		json_object_set(o, "num_local_experts", json_object_get(o, "num_experts"));
		json_object_del(o, "num_experts");
	}
}

/* A cropped model keeps the first n_layers entries of layer_types. */
static void crop_layer_types(json_t *o, int n_layers)
{
	json_t *v = json_object_get(o, "layer_types");

	while (json_is_array(v) && json_array_size(v) > (size_t)n_layers)
		json_array_remove(v, json_array_size(v) - 1);
}

/*
 * config.json for an export: the source folder's own file, key for key as
 * its transformers release wrote it, with only what hp changes updated (the
 * dtype, and num_hidden_layers when the run cropped the model), provided it
 * still reads as the plan's model.  Without it (moved, or another model),
 * the plan's spec, in the spelling of the release line that wrote the
 * source.  *src_dir is the source folder when its file was used, else "".
 */
static json_t *export_config(const struct hp_plan *p, enum hp_dtype dtype, char *src_dir, size_t n)
{
	const char *dt = hp_dtype_torch_name(dtype);
	struct hp_model_spec s;
	struct hp_err e = { 0 };
	json_error_t jerr;
	json_t *o = NULL;
	char path[4200];

	source_of(p, path, sizeof(path), src_dir, n);
	if (src_dir[0] && (o = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr)) && json_is_object(o)) {
		char *t;

		if (json_object_get(o, "dtype") || !json_object_get(o, "torch_dtype"))
			json_object_set_new(o, "dtype", json_string(dt));
		if (json_object_get(o, "torch_dtype"))
			json_object_set_new(o, "torch_dtype", json_string(dt));
		/* a multimodal folder's language model: its text_config */
		json_t *tc = p->spec.vl && json_is_object(json_object_get(o, "text_config")) ?
			     json_object_get(o, "text_config") : o;

		if (json_is_integer(json_object_get(tc, "num_hidden_layers")))
			json_object_set_new(tc, "num_hidden_layers", json_integer(p->spec.n_layers));
		crop_layer_types(tc, p->spec.n_layers);
		/* the export holds the dequantized experts (gpt_oss's mxfp4) */
		json_object_del(o, "quantization_config");
		t = json_dumps(o, 0);
		if (t && !hp_hfconfig_load_buf(&s, path, t, strlen(t), &e)) {
			s.torch_dtype = p->spec.torch_dtype;
			memcpy(s.unknown, p->spec.unknown, sizeof(s.unknown));
			if (!same_model(p, &s, path, &e)) {
				free(t);
				return o;
			}
		}
		free(t);
	}
	json_decref(o);
	src_dir[0] = 0;
	if (!(o = hp_model_spec_json(&p->spec)))
		return NULL;
	json_object_del(o, "hp_unknown_keys");
	json_object_set_new(o, "torch_dtype", json_string(dt));
	if (p->spec.transformers_version[0] == '5')
		to_v5(p->spec.vl ? json_object_get(o, "text_config") : o);
	return o;
}

/* The files of an HF folder that are not weights nor config: the tokenizer
 * and chat template, generation defaults. */
static const char *const side_files[] = {
	"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
	"tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
	"generation_config.json",
};

static int copy_side_files(const char *from, const char *to, struct hp_err *e)
{
	for (size_t i = 0; i < sizeof(side_files) / sizeof(side_files[0]); i++) {
		char src[4200], dst[4200], *buf = NULL;
		size_t len = 0;
		FILE *f;
		int fd, rc;

		snprintf(src, sizeof(src), "%s/%s", from, side_files[i]);
		if (!(f = fopen(src, "rb")))
			continue;
		rc = hp_read_stream(f, &buf, &len);
		fclose(f);
		if (rc) {
			hp_free(buf);
			return hp_err_set(e, HP_EIO, "'%s': cannot read: %s", src, strerror(errno));
		}
		snprintf(dst, sizeof(dst), "%s/%s", to, side_files[i]);
		fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		rc = fd < 0 || hp_write_all(fd, buf, len) || fsync(fd);
		if (fd >= 0)
			rc |= close(fd);
		hp_free(buf);
		if (rc)
			return hp_err_set(e, HP_EIO, "'%s': cannot write: %s", dst, strerror(errno));
	}
	return 0;
}

/*
 * A Qwen3.5 multimodal folder's vision tower (model.visual.*), which hp
 * never runs: copied from the source folder src_dir into path byte for
 * byte (its dtypes kept), its names into map (file name), their bytes
 * added to *total.  The source must be there (hp_export_hf checks it
 * first): without it the export would be a folder transformers cannot
 * load as the model it names.
 */
static int put_visual(const char *src_dir, const char *path, const char *name, json_t *map, uint64_t *total,
		      struct hp_err *e)
{
	struct hp_st_model st = { 0 };
	struct hp_st_writer w = { 0 };
	struct hp_st_entry *ent = NULL;
	const struct hp_st_tensor **vt = NULL;
	size_t n = 0, cap = 1 << 20;
	char *buf = NULL;
	int rc;

	if ((rc = hp_st_model_open_flags(&st, src_dir, HP_ST_PREAD, e)))
		return rc;
	ent = hp_calloc(st.ntensors + 1, sizeof(*ent));
	vt = hp_calloc(st.ntensors + 1, sizeof(*vt));
	buf = hp_malloc(cap);
	if (!ent || !vt || !buf) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < st.ntensors; i++) {
		const struct hp_st_tensor *t = st.tensors[i];

		if (strncmp(t->name, "model.visual.", 13))
			continue;
		ent[n].name = t->name;
		ent[n].dtype = t->dtype;
		ent[n].ndim = t->ndim;
		memcpy(ent[n].shape, t->shape, sizeof(ent[n].shape));
		vt[n++] = t;
	}
	if (!n) {
		rc = hp_err_set(e, HP_EFORMAT, "'%s': no model.visual.* tensor: a Qwen3.5 multimodal folder holds its "
				  "vision tower", src_dir);
		goto out;
	}
	if ((rc = hp_st_writer_open(&w, path, n, ent, 0, NULL, NULL, e)))
		goto out;
	for (size_t k = 0; k < n && !rc; k++) {
		const struct hp_st_tensor *t = vt[hp_st_writer_index(&w, k)];

		for (size_t off = 0; off < t->nbytes && !rc; off += cap) {
			size_t len = t->nbytes - off < cap ? t->nbytes - off : cap;

			if (!(rc = hp_st_pread(t, off, buf, len, e)))
				rc = hp_st_writer_put(&w, buf, len, e);
		}
		json_object_set_new(map, t->name, json_string(name));
		*total += t->nbytes;
	}
	if (!rc)
		rc = hp_st_writer_commit(&w, e);
	else
		hp_st_writer_abort(&w);
out:
	hp_free(buf);
	hp_free(ent);
	hp_free(vt);
	hp_st_model_close(&st);
	return rc;
}

int hp_export_hf(const struct hp_plan *p, struct hp_src *src, const char *dir, enum hp_dtype dtype,
		 uint64_t max_shard, int finite, int proc, int nproc, struct hp_progress *pg, struct hp_err *e)
{
	int *file = hp_calloc((size_t)p->nparams + 1, sizeof(int)), nfiles, rc = 0;
	size_t esz = hp_dtype_size(dtype), blkn = (size_t)BLOCK;
	float *blk = NULL;
	void *out = NULL;
	char path[4200], name[64];

	for (int i = 0; i < p->nparams; i++)
		if ((size_t)qcols(&p->params[i]) > blkn)
			blkn = (size_t)qcols(&p->params[i]);
	/* put_stacked: an expert's [C, 2*Im] block and its gate and up */
	if (p->spec.moe_bias && (size_t)(4 * (int64_t)p->spec.moe_intermediate * p->spec.hidden) > blkn)
		blkn = (size_t)(4 * (int64_t)p->spec.moe_intermediate * p->spec.hidden);
	if (!file || !(blk = hp_malloc(blkn * 4)) || !(out = hp_malloc(blkn * esz))) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory");
		goto out;
	}
	if (p->spec.vl) {   /* the vision tower's source, before anything is written */
		char sd[4096];

		json_decref(export_config(p, dtype, sd, sizeof(sd)));
		if (!sd[0]) {
			rc = hp_err_set(e, HP_EIO, "'%s': the vision tower (model.visual.*) of a Qwen3.5 multimodal folder "
					"comes from its source folder, which is gone or no longer this model; export from "
					"shards whose source is in place", dir);
			goto out;
		}
	}
	nfiles = assign_files(p, esz, max_shard, file);
	/* a multimodal folder's vision tower: one more file, the last */
	int nout = nfiles + (p->spec.vl ? 1 : 0);
	for (int f = proc; f < nfiles && !rc; f += nproc) {
		file_name(name, sizeof(name), f, nout);
		snprintf(path, sizeof(path), "%s/%s", dir, name);
		rc = export_file(p, src, path, file, f, dtype, finite, blk, out, pg, e);
	}
	if (!rc && proc == 0) {
		char src_dir[4096];
		json_t *cfg, *idx = NULL, *map;
		char *text = NULL;
		uint64_t total = 0;

		cfg = export_config(p, dtype, src_dir, sizeof(src_dir));
		text = cfg ? json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
		snprintf(path, sizeof(path), "%s/config.json", dir);
		rc = text ? write_text(path, text, e) : hp_err_set(e, HP_ENOMEM, "out of memory");
		free(text);
		text = NULL;
		if (!rc && src_dir[0])
			rc = copy_side_files(src_dir, dir, e);
		if (!rc && nout > 1) {
			idx = json_object();
			map = json_object();
			if (!idx || !map)
				rc = hp_err_set(e, HP_ENOMEM, "out of memory");
			if (!rc && p->spec.vl) {
				file_name(name, sizeof(name), nfiles, nout);
				snprintf(path, sizeof(path), "%s/%s", dir, name);
				rc = put_visual(src_dir, path, name, map, &total, e);
			}
			for (int i = 0; !rc && i < p->nparams; i++) {
				struct hp_st_entry se;
				struct hp_stacked_view se_v;
				char sn[128];

				file_name(name, sizeof(name), file[i], nout);
				if (stacked_expert(p, i, &se_v) < 0)
					json_object_set_new(map, p->params[i].name, json_string(name));
				else if (stacked_entry(p, i, &se, sn, sizeof(sn)))
					json_object_set_new(map, sn, json_string(name));
				total += (uint64_t)(p->params[i].shape[0] * qcols(&p->params[i])) * esz;
			}
			if (!rc) {
				json_object_set_new(idx, "metadata", json_pack("{sI}", "total_size", (json_int_t)total));
				json_object_set(idx, "weight_map", map);
				text = json_dumps(idx, JSON_INDENT(2) | JSON_SORT_KEYS);
				snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
				rc = text ? write_text(path, text, e) : hp_err_set(e, HP_ENOMEM, "out of memory");
				free(text);
			}
			json_decref(map);
		}
		json_decref(cfg);
		json_decref(idx);
	}
out:
	hp_free(file);
	hp_free(blk);
	hp_free(out);
	return rc;
}
