/*
 * modelio.c - a model's parameters by name, from an HF folder (one file or
 * an index; experts one by one or stacked as newer transformers write
 * them) and its gradients to a safetensors file.  Host memory only: the
 * model's flat_w and flat_g (lib/model/model.h), which hp_model_upload and
 * hp_model_download move to and from a device backend.
 */
#include "base/alloc.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "model/params.h"

struct hp_param *hp_model_param(struct hp_model *m, const char *name)
{
	for (int i = 0; i < m->w.nparams; i++)
		if (!strcmp(m->w.params[i].name, name))
			return &m->w.params[i];
	return NULL;
}

static int cmp_param_name(const void *a, const void *b)
{
	return strcmp((*(struct hp_param *const *)a)->name, (*(struct hp_param *const *)b)->name);
}

/*
 * Newer transformers store a layer's experts stacked (params.h,
 * hp_param_stacked: Qwen3-MoE's [E, 2*Im, C] and [E, C, Im], GPT-OSS's
 * transposed and interleaved tensors, their biases, and MXFP4 blocks).
 * Fill expert parameter p from them; returns 1 when p is not an expert
 * tensor or the folder holds no stacked tensor for it, 0 when filled, or a
 * negative error.  A whole stacked tensor is converted once and kept in
 * *cache while the same tensor serves the next experts; MXFP4 rows are
 * decoded as they are read.
 */
static int load_stacked(struct hp_model *m, const struct hp_st_model *st, const char *dir,
			struct hp_param *p, const struct hp_st_tensor **cached, float **cache,
			struct hp_err *e)
{
	struct hp_stacked_view v;
	const struct hp_st_tensor *t, *sc;
	int64_t cols = p->ndim > 1 ? p->shape[1] : 1;
	int rc;

	if (!hp_param_stacked(&m->spec, p->name, &v) ||
	    (rc = hp_stacked_find(st, &v, m->spec.n_experts, dir, &t, &sc, e)) > 0)
		return 1;
	if (rc)
		return rc;
	if (sc) {
		void *buf = hp_malloc(hp_mxfp4_buf_bytes(&v));

		if (!buf)
			return hp_err_set(e, HP_ENOMEM, "out of memory reading '%s'", t->name);
		rc = hp_mxfp4_rows(&v, t, sc, 0, p->shape[0], 0, cols, p->w, buf, e);
		hp_free(buf);
		return rc;
	}
	if (*cached != t) {
		hp_free(*cache);
		*cached = NULL;
		if (!(*cache = hp_malloc((size_t)t->numel * sizeof(float))))
			return hp_err_set(e, HP_ENOMEM, "out of memory reading '%s'", v.name);
		if ((rc = hp_st_read_f32(t, *cache, e)))
			return rc;
		*cached = t;
	}
	for (int64_t r = 0; r < p->shape[0]; r++)
		for (int64_t c = 0; c < cols; c++)
			p->w[r * cols + c] = (*cache)[v.base + r * v.rs + c * v.cs];
	return 0;
}

int hp_model_load_hf(struct hp_model *m, const char *dir, struct hp_err *e)
{
	struct hp_st_model st;
	const struct hp_st_tensor *cached = NULL;
	float *cache = NULL;
	int rc = 0;

	if ((rc = hp_st_model_open(&st, dir, e)))
		return rc;
	for (int i = 0; i < m->w.nparams && !rc; i++) {
		struct hp_param *p = &m->w.params[i];
		const struct hp_st_tensor *t = hp_st_model_find(&st, p->name);

		if (!t && m->n_moe) {
			rc = load_stacked(m, &st, dir, p, &cached, &cache, e);
			if (rc <= 0)
				continue;
			rc = 0;
		}
		if (!t) {
			rc = hp_err_set(e, HP_EFORMAT, "'%s': tensor '%s' is missing", dir, p->name);
			break;
		}
		/* the checkpoint's shape (params.h: Gated DeltaNet's conv is [C, 1, K] there) */
		if ((rc = hp_param_hf_check_shape(t, p->name, p->ndim, p->shape, dir, "config.json implies", e)))
			break;
		rc = hp_st_read_f32(t, p->w, e);
	}
	/* Every tensor in the checkpoint must be one the model uses: a sorted
	 * index of the parameter names keeps this O(n log n) for checkpoints of
	 * tens of thousands of expert tensors. */
	struct hp_param **byname = rc ? NULL : hp_malloc((size_t)m->w.nparams * sizeof(*byname));
	if (!rc && !byname)
		rc = hp_err_set(e, HP_ENOMEM, "out of memory checking '%s'", dir);
	for (int i = 0; byname && i < m->w.nparams; i++)
		byname[i] = &m->w.params[i];
	if (byname)
		qsort(byname, (size_t)m->w.nparams, sizeof(*byname), cmp_param_name);
	for (size_t j = 0; j < st.ntensors && !rc; j++) {
		const struct hp_st_tensor *t = st.tensors[j];
		struct hp_param key, *kp = &key;
		snprintf(key.name, sizeof(key.name), "%s", t->name);
		if ((strlen(t->name) < sizeof(key.name) &&
		     bsearch(&kp, byname, (size_t)m->w.nparams, sizeof(*byname), cmp_param_name)) ||
		    (m->n_moe && hp_param_is_stacked(&m->spec, t->name)) || hp_param_not_loaded(&m->gspec, t->name))
			continue;
		if (m->spec.tie_word_embeddings && !strcmp(t->name, "lm_head.weight")) {
			/* some exporters write the tied head out; accept it only if it is the embedding */
			float *tmp;
			int same = 1;
			if ((size_t)t->numel != m->w.params[0].numel) {
				same = 0;
			} else if (!(tmp = hp_malloc((size_t)t->numel * sizeof(float)))) {
				rc = hp_err_set(e, HP_ENOMEM, "out of memory checking '%s'", t->name);
				break;
			} else {
				rc = hp_st_read_f32(t, tmp, e);
				if (!rc)
					same = !memcmp(tmp, m->w.embed, (size_t)t->numel * sizeof(float));
				hp_free(tmp);
			}
			if (!rc && !same)
				rc = hp_err_set(e, HP_EFORMAT, "'%s': tie_word_embeddings is true but "
						"'lm_head.weight' differs from the embedding", dir);
			continue;
		}
		if (strstr(t->name, "rotary_emb.inv_freq"))
			continue;   /* a buffer old transformers saved; recomputed from rope_theta */
		rc = hp_err_set(e, HP_EFORMAT, "'%s': unexpected tensor '%s' for model_type %s",
				dir, t->name, m->spec.model_type);
	}
	hp_free(byname);
	hp_free(cache);
	hp_st_model_close(&st);
	return rc;
}

int hp_model_save_grads(const struct hp_model *m, const char *path, size_t nmeta,
			const char *const *keys, const char *const *vals, struct hp_err *e)
{
	struct hp_st_entry *ent = hp_calloc((size_t)m->w.nparams + 1, sizeof(*ent));
	size_t n = 0;
	int rc;

	if (!ent)
		return hp_err_set(e, HP_ENOMEM, "out of memory writing '%s'", path);
	for (int i = 0; i < m->w.nparams; i++) {
		const struct hp_param *p = &m->w.params[i];

		if (hp_param_frozen(p->name))   /* a buffer has no gradient */
			continue;
		ent[n].name = p->name;
		ent[n].dtype = HP_DTYPE_F32;
		ent[n].ndim = hp_param_hf_shape(p->name, p->ndim, p->shape, ent[n].shape);   /* as transformers' */
		ent[n++].data = p->g;
	}
	rc = hp_st_write(path, n, ent, nmeta, keys, vals, e);
	hp_free(ent);
	return rc;
}
