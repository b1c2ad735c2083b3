/*
 * train.c - training: config -> plan -> model + data -> steps, one step
 * for every world size (step_grads, step_update).
 *
 * The loop per step: read all micro-batches of the step, count the valid
 * targets (the loss is the token-weighted mean over the whole step, as
 * HyperParallel's token_weighted aggregation), forward+backward each
 * micro-batch with the gradient scaled by 1/count, optionally dump the raw
 * gradients (step 1), clip, take the scheduled AdamW step.
 *
 * Evaluation (training.eval_iters): after every eval_steps steps and after
 * the last, eval_iters global batches of the validation split, from its
 * start each time, forward only; after the last step the test split once.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fileio.h"
#include "base/log.h"
#include "comm/comm.h"
#include "config/config.h"
#include "config/hfconfig.h"
#include "cpu/gemm.h"
#include "data/batch.h"
#include "data/online.h"
#include "dist/ckpt.h"
#include "dist/fsdp.h"
#include "dist/optim.h"
#include "dist/shard.h"
#include "format/safetensors.h"
#include "model/init.h"
#include "model/model.h"
#include "model/params.h"
#include "plan/plan.h"
#include "plan/schedule.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "train/settings.h"
#include "train/train.h"
#ifdef HP_HAVE_CUDA
#include "cuda/ops.h"
#endif
#include "dist/verify.h"

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct run {
	struct hp_config cfg;
	struct hp_model_spec spec;
	struct hp_plan *plan;           /* at this world size: layout and kernel bindings */
	int rank, world;
	struct hp_comms comms;          /* the layout's (one process: every dim of size 1) */
	struct hp_fsdp fsdp;            /* world > 1: the shards the optimizer steps */
	int dist;
	struct hp_model_kernels kernels;
	int reference;                  /* HP_KERNELS=reference */
	int comm_bad;                   /* a step's traffic differed from the plan */
	double kernel_ms[HP_KF_N];      /* HP_CUDA_PROFILE=1: time per kernel family, every step */
	long profiled;
	char comm_why[256];
	struct hp_model model;
	struct hp_optim opt;
	struct hp_batcher *data;        /* offline */
	struct hp_online *online;       /* online */
	struct hp_split split;          /* data_config.split */
	struct hp_batch_docs docs;      /* indexed: eod_mask_loss, reset_* */
	int has_docs;
	int conv_indexed;               /* indexed conversations (PREFIX.mask) */
	const char *eod_from;
	/* [HP_SPLIT_VALID], [HP_SPLIT_TEST] with eval_iters: the evaluation
	 * sources, of the training data's kind; NULL where a part is empty */
	struct hp_batcher *edata[3];
	struct hp_online *eonline[3];
	int32_t *inputs, *labels, *seg;
	FILE *metrics;                  /* rank 0, over metrics_out's descriptor */
	struct hp_outfile metrics_out;
	struct hp_ckpt_lock lock;       /* checkpoint_dir, held by rank 0 while it saves there */
	int dumped;                 /* --dump-grads file written by this run */
	double *loads;              /* moe_router_bias_update_rate: the step's router loads */
	int *bias_at;               /* ... and each layer's correction bias in the plan's list (-1: none) */
	struct hp_model_par par;
	struct hp_verify verify;        /* validation mode or hp-verify */
	int verifying;
	/* pipeline: this rank's stage and its actions for a step (2 G vpp) */
	int stage;
	long read_tokens;               /* the data's tokens this rank read (online: tokenized) in the step so far */
	long ahead[3];                  /* online data: documents to tokenize ahead, per split (share_docs) */
	struct hp_pp_action *pp_act;    /* pp_nact of a step, then pp_nfwd of evaluation's forwards */
	int pp_nact, pp_nfwd;
	double *pp_wait;                /* [world]: each rank's p2p waits of a step, gathered (metrics) */
	float *stale;                   /* the fault pp_stale_activation's copy, in the backend's memory */
	long first_step;                /* 1, or the step after the restored checkpoint */
	struct hp_backend *bk;          /* where the model computes: the CPU, or a GPU (training.device) */
	char gpu_name[160];
	int gpu_share;                /* ranks on this rank's GPU (1: its own) */
	/* the plan's estimate for this rank, made once (NULL: none) */
	struct hp_rank_est est_buf;
	const struct hp_rank_est *est;
};

/*
 * Write every parameter's whole tensor (grads: its gradient) as F32 under
 * its HF name, in the checkpoint's shape (params.h, hp_param_hf_shape),
 * atomically.  One process: the model's own; over ranks: each
 * tensor assembled from the shards (hp_fsdp_global), written by rank 0.
 */
static int dump_tensors(struct run *r, const char *path, int grads, struct hp_err *e)
{
	const char *keys[] = { "format", "producer" };
	const char *vals[] = { "pt", grads ? "hp-train --dump-grads (step 1, before clipping and update)"
					   : "hp-train --dump-params (after the last step)" };
	const struct hp_plan *p = r->plan;
	struct hp_st_entry *ent;
	float **bufs;
	int n = r->dist ? p->nparams : r->model.w.nparams, rc = 0;

	/* a device's tensors come to their host copies first */
	if ((rc = r->dist ? hp_fsdp_download(&r->fsdp, grads, 0, e) : hp_model_download(&r->model, grads, e)))
		return rc;
	ent = hp_calloc((size_t)n + 1, sizeof(*ent));
	bufs = hp_calloc((size_t)n + 1, sizeof(*bufs));
	if (!ent || !bufs) {
		rc = hp_err_set(e, HP_ENOMEM, "out of memory writing '%s'", path);
		goto out;
	}
	for (int i = 0; i < n && !rc; i++) {
		if (r->dist) {
			const struct hp_plan_param *q = &p->params[i];
			size_t numel = (size_t)(q->shape[0] * (q->ndim > 1 ? q->shape[1] : 1));

			if (!(bufs[i] = hp_malloc(numel * sizeof(float)))) {
				rc = hp_err_set(e, HP_ENOMEM, "out of memory writing '%s'", path);
				break;
			}
			rc = hp_fsdp_global(&r->fsdp, i, grads ? HP_FSDP_GRADS : HP_FSDP_WEIGHTS, bufs[i], e);
			ent[i].name = q->name;
			ent[i].ndim = hp_param_hf_shape(q->name, q->ndim, q->shape, ent[i].shape);
			ent[i].data = bufs[i];
			if (r->rank) {
				hp_free(bufs[i]);
				bufs[i] = NULL;
			}
		} else {
			const struct hp_param *q = &r->model.w.params[i];

			ent[i].name = q->name;
			ent[i].ndim = hp_param_hf_shape(q->name, q->ndim, q->shape, ent[i].shape);
			ent[i].data = grads ? q->g : q->w;
		}
		ent[i].dtype = HP_DTYPE_F32;
	}
	/* a buffer (DeepSeek's correction bias) has no gradient to write */
	int k = 0;
	for (int i = 0; i < n; i++)
		if (!grads || !ent[i].name || !hp_param_frozen(ent[i].name))
			ent[k++] = ent[i];
	if (!rc && r->rank == 0)
		rc = hp_st_write(path, (size_t)k, ent, 2, keys, vals, e);
out:
	for (int i = 0; bufs && i < n; i++)
		hp_free(bufs[i]);
	hp_free(bufs);
	hp_free(ent);
	return rc;
}


static int conversations(const struct hp_config *c)
{
	return c->dataset.data_type && !strcmp(c->dataset.data_type, "conversation");
}

/* Part p's documents (the first, the count) and all of its source's;
 * 0 when the part has no source (empty, or not opened). */
static int part_docs(const struct run *r, int p, uint64_t *d0, uint64_t *n, uint64_t *all)
{
	const struct hp_batcher *b = p == HP_SPLIT_TRAIN ? r->data : r->edata[p];
	const struct hp_online *o = p == HP_SPLIT_TRAIN ? r->online : r->eonline[p];
	struct hp_online_stats st;

	*d0 = *n = *all = 0;
	if (b) {
		hp_batcher_docs(b, d0, n, all);
	} else if (o) {
		hp_online_stats(o, &st);
		*d0 = st.first_document;
		*n = st.documents;
		*all = st.all_documents;
	}
	return b || o;
}

static void print_table(FILE *out, const struct run *r, long accum)
{
	const struct hp_config *c = &r->cfg;
	const struct hp_model *m = &r->model;
	const struct hp_model_spec *s = &m->gspec;
	const struct hp_online *online = r->online;
	const char *gpu = r->bk->device ? r->gpu_name : NULL;   /* the step runs there */

	fprintf(out, "# resolved parameters\n");
	hp_config_print(c, out);
	fprintf(out, "%-40s %s\n", "spec.model_type", s->model_type);
	fprintf(out, "%-40s %s\n", "spec.architecture", s->architecture);
	fprintf(out, "%-40s %d\n", "spec.num_hidden_layers", s->n_layers);
	fprintf(out, "%-40s %d\n", "spec.hidden_size", s->hidden);
	fprintf(out, "%-40s %d\n", "spec.intermediate_size", s->intermediate);
	fprintf(out, "%-40s %d\n", "spec.num_attention_heads", s->n_heads);
	fprintf(out, "%-40s %d\n", "spec.num_key_value_heads", s->n_kv_heads);
	fprintf(out, "%-40s %d\n", "spec.head_dim", s->head_dim);
	fprintf(out, "%-40s %d\n", "spec.vocab_size", s->vocab);
	fprintf(out, "%-40s %g\n", "spec.rms_norm_eps", s->rms_eps);
	fprintf(out, "%-40s %g\n", "spec.rope_theta", s->rope.theta);
	if (s->rope.type != HP_ROPE_DEFAULT) {
		fprintf(out, "%-40s %s factor %g%s\n", "spec.rope_type", hp_rope_type_name(s->rope.type),
			s->rope.factor, s->rope.type == HP_ROPE_DYNAMIC ?
			" (positions below max_position_embeddings: the unscaled table)" : "");
		if (s->rope.type == HP_ROPE_YARN)
			fprintf(out, "%-40s %.17g\n", "spec.rope_attention_factor", s->rope.attention_factor);
	}
	if (s->sliding_window)
		fprintf(out, "%-40s %d on %d of %d layers%s\n", "spec.sliding_window", s->sliding_window,
			hp_model_spec_sliding_layers(s), s->n_layers, s->sliding_window >= hp_config_seq_length(c) ?
			" (at least the sequence: full attention)" : "");
	if (s->attn_sinks)
		fprintf(out, "%-40s %s\n", "spec.attention_sinks", "one learned logit per head (gpt_oss)");
	if (s->moe_act == HP_MOE_ACT_CLAMPED)
		fprintf(out, "%-40s limit %g, alpha %g (experts and router with biases)\n", "spec.clamped_swiglu",
			s->swiglu_limit, s->swiglu_alpha);
	if (s->mla)
		fprintf(out, "%-40s q_lora_rank %d, kv_lora_rank %d, qk %d + %d, v %d, softmax scale x %.17g\n",
			"spec.latent_attention", s->q_lora_rank, s->kv_lora_rank, s->qk_nope, s->qk_rope, s->v_head,
			s->attn_mscale);
	if (s->router_group)
		fprintf(out, "%-40s %d groups, top %d kept, routed_scaling_factor %g, %d shared experts%s\n",
			"spec.deepseek_router", s->n_group, s->topk_group, s->routed_scaling, s->n_shared,
			s->group_mask_zero ? " (4.x: dropped groups score 0)" : "");
	if (s->n_linear)
		fprintf(out, "%-40s %d of %d layers: %d key heads of %d, %d value heads of %d, conv %d (%s)\n",
			"spec.linear_attention", s->n_linear, s->n_layers, s->lin_kh, s->lin_kd, s->lin_vh, s->lin_vd,
			s->lin_conv, s->lin_split ? "in_proj_qkv, in_proj_z, in_proj_b, in_proj_a" :
			"in_proj_qkvz, in_proj_ba");
	if (s->attn_gate)
		fprintf(out, "%-40s output gate, RoPE on %d of %d, zero-centred norms\n", "spec.gated_attention",
			hp_model_spec_rope_dim(s), s->head_dim);
	if (s->shared_gate)
		fprintf(out, "%-40s intermediate %d, sigmoid gate\n", "spec.shared_expert", s->shared_inter);
	if (s->qkv_bias)
		fprintf(out, "%-40s %s\n", "spec.attention_bias", s->o_bias ? "q, k, v, o" : "q, k, v");
	fprintf(out, "%-40s %s\n", "spec.tie_word_embeddings", s->tie_word_embeddings ? "true" : "false");
	fprintf(out, "%-40s %s\n", "spec.checkpoint_dtype", hp_dtype_name(s->torch_dtype));
	if (s->qk_norm)
		fprintf(out, "%-40s %s\n", "spec.qk_norm", "true");
	if (s->n_experts) {
		fprintf(out, "%-40s %d\n", "spec.num_experts", s->n_experts);
		fprintf(out, "%-40s %d\n", "spec.num_experts_per_tok", s->top_k);
		fprintf(out, "%-40s %d\n", "spec.moe_intermediate_size", s->moe_intermediate);
		fprintf(out, "%-40s %d of %d\n", "spec.moe_layers", m->n_moe, s->n_layers);
		fprintf(out, "%-40s %s\n", "spec.norm_topk_prob", s->norm_topk_prob ? "true" : "false");
		fprintf(out, "%-40s %s\n", "spec.output_router_logits", s->output_router_logits ? "true" : "false");
		fprintf(out, "%-40s %g\n", "spec.router_aux_loss_coef", s->router_aux_loss_coef);
	}
	fprintf(out, "%-40s %lld\n", "run.parameters", hp_model_spec_nparams(s));
	fprintf(out, "%-40s %d\n", "run.world_size", r->world);
	fprintf(out, "%-40s %ld\n", "run.grad_accumulation_steps", accum);
	fprintf(out, "%-40s %ld\n", "run.tokens_per_step", accum * c->training.micro_batch_size * hp_config_seq_length(c));
	fprintf(out, "%-40s %s\n", "run.compute_dtype", gpu ? "BF16 operands of the GEMMs and attention (fp32 "
		"accumulation, activations, gradients, weights and AdamW moments)" : "F32");
	if (gpu) {
		fprintf(out, "%-40s %s\n", "run.device", gpu);
		if (r->dist)
			fprintf(out, "%-40s %s (params gather in %s, gradients reduce in %s)\n", "run.device_comm",
				r->bk->comm_path(r->bk), r->plan->param_dtype, r->plan->reduce_dtype);
	}
	if (online) {
		struct hp_online_stats st;
		hp_online_stats(online, &st);
		fprintf(out, "%-40s %llu of %llu in %llu file%s (the train split)\n", "data.documents",
			(unsigned long long)st.documents, (unsigned long long)st.all_documents,
			(unsigned long long)st.files, st.files == 1 ? "" : "s");
		fprintf(out, "%-40s %llu\n", "data.empty_lines", (unsigned long long)st.empty_lines);
		fprintf(out, "%-40s %llu\n", "data.skipped_invalid_lines", (unsigned long long)st.invalid_lines);
		if (r->conv_indexed || conversations(&r->cfg)) {
			fprintf(out, "%-40s %s\n", "data.conversations", r->conv_indexed ?
				"hp-data's, with their loss mask (PREFIX.mask)" : c->dataset.loss_tokens ==
				HP_LOSS_TOKENS_ALL ? "rendered by the chat template; loss on every token" :
				"rendered by the chat template; loss on the assistant's replies");
			fprintf(out, "%-40s %llu (no assistant message)\n", "data.conversations_without_target",
				(unsigned long long)st.no_target);
			fprintf(out, "%-40s %s\n", "data.packing", "rows of seq_length, block-diagonal causal mask; "
				"a conversation is never split (a longer one is cut to seq_length + 1 tokens)");
		} else {
			fprintf(out, "%-40s %d\n", "data.eod_id", st.eod_id);
			fprintf(out, "%-40s %s\n", "data.packing", "rows of seq_length, block-diagonal causal mask");
		}
	}
	{
		uint64_t d0, nd, all;

		part_docs(r, HP_SPLIT_TRAIN, &d0, &nd, &all);
		fprintf(out, "%-40s %s: train documents [%llu, %llu) of %llu", "data.split", c->dataset.split,
			(unsigned long long)d0, (unsigned long long)(d0 + nd), (unsigned long long)all);
		for (int p = HP_SPLIT_VALID; c->training.eval_iters > 0 && p <= HP_SPLIT_TEST; p++) {
			if (p == HP_SPLIT_VALID && c->dataset.nvalid_data_path) {
				part_docs(r, p, &d0, &nd, &all);
				fprintf(out, "; validation: %llu documents of %s", (unsigned long long)nd,
					c->dataset.valid_data_path[0]);
			} else if (part_docs(r, p, &d0, &nd, &all)) {
				fprintf(out, ", %s [%llu, %llu)", hp_split_name(p), (unsigned long long)d0,
					(unsigned long long)(d0 + nd));
			} else {
				fprintf(out, ", %s none", hp_split_name(p));
			}
		}
		fprintf(out, "\n");
		if (r->has_docs)
			fprintf(out, "%-40s EOD id %d (%s)%s%s\n", "data.documents_in_rows", r->docs.eod, r->eod_from,
				r->docs.mask_loss ? "; no loss where the input is EOD" : "",
				r->docs.reset ? "; positions and attention restart after each EOD" : "");
		if (r->data && c->dataset.shuffle)
			fprintf(out, "%-40s the rows of each epoch in a permutation of (training.seed, epoch)\n",
				"data.shuffle");
		if (c->training.eval_iters > 0 && c->training.eval_steps > 0)
			fprintf(out, "%-40s %ld global batch%s of the validation split from its start, every %ld steps "
				"and after the last; the test split after the last\n", "run.evaluation",
				c->training.eval_iters, c->training.eval_iters == 1 ? "" : "es", c->training.eval_steps);
		else if (c->training.eval_iters > 0)
			fprintf(out, "%-40s %ld global batch%s of the validation split, then of the test split, after "
				"the last step\n", "run.evaluation", c->training.eval_iters,
				c->training.eval_iters == 1 ? "" : "es");
	}
	fprintf(out, "%-40s %s\n", "run.kernels", gpu ? "cuda" : hp_backend_cpu_ops()->name);
	{
		int nf = 0, ng = 0, nn = m->k.fused_final;

		for (int l = 0; l < s->n_layers; l++) {
			nf += m->k.flash[l];
			ng += m->k.grouped[l] && m->w.lw[l].moe;
			nn += m->k.fused_in[l] + m->k.fused_post[l];
		}
		fprintf(out, "%-40s flash_attention %d/%d layers%s, fused_rmsnorm %d/%d norms, "
			"grouped_experts %d/%d MoE layers, chunked_ce %ld\n", "run.module_kernels", nf,
			s->n_layers, gpu ? " (the GPU's attention)" : "", nn, 2 * s->n_layers + 1, ng, m->n_moe,
			m->k.ce_chunk);
	}
	if (gpu)
		fprintf(out, "%-40s %s\n", "run.gemm", r->bk->kind == HP_BACKEND_CUDA_EMU ?
			"the host's, on bf16 operands (HP_CUDA_EMULATE)" : "cuBLASLt, bf16 operands, fp32 accumulation");
	else
		fprintf(out, "%-40s %s, %d thread%s\n", "run.gemm", hp_sgemm_path(), hp_sgemm_threads(),
			hp_sgemm_threads() == 1 ? "" : "s");
	fflush(out);
}


/* Configured features that would change the result but are not implemented
 * yet are refused, never ignored. */



/* --metrics: opened before any work (a stream in place, a file through a
 * temporary), a line per step; a stream gets each line as it is written. */
static int open_metrics(struct run *r, const char *path, struct hp_err *e)
{
	int rc;

	if ((rc = hp_outfile_open(&r->metrics_out, path, e)))
		return rc;
	if (!(r->metrics = hp_outfile_stdio(&r->metrics_out, e))) {
		hp_outfile_abort(&r->metrics_out);
		return e->code;
	}
	return 0;
}

/* ok: the run succeeded and the file goes into place; else it is removed
 * (a stream keeps what it was sent). */
static int close_metrics(struct run *r, int ok, struct hp_err *e)
{
	FILE *f = r->metrics;

	if (!f)
		return 0;
	r->metrics = NULL;
	return hp_outfile_close_stdio(&r->metrics_out, f, ok, e);
}

/* A number for a message: %g, but a NaN is "nan" whatever its sign bit. */
static const char *num(char buf[32], double v)
{
	if (isnan(v))
		return "nan";
	snprintf(buf, 32, "%g", v);
	return buf;
}

/* A number for the metrics' JSON: JSON has no NaN or infinity, so a
 * non-finite value is null (hp-train(1), METRICS). */
static const char *jnum(char buf[32], double v)
{
	if (!isfinite(v))
		return "null";
	snprintf(buf, 32, "%.9g", v);
	return buf;
}

/* Write the step's collectives, "comm": {dim: {op: bytes}}, to the metrics. */
static void metrics_comm(FILE *f, const struct hp_comms *cs)
{
	int firstdim = 1;

	fprintf(f, ", \"comm\": {");
	for (int d = 0; d <= HP_NDIM; d++) {
		int any = 0;

		for (int c = 0; c < HP_NCOLL; c++) {
			if (!cs->dim[d].calls[c])
				continue;
			if (!any)
				fprintf(f, "%s\"%s\": {", firstdim ? "" : ", ", hp_comm_dim_name(d));
			fprintf(f, "%s\"%s\": %lld", any ? ", " : "", hp_coll_name((enum hp_coll)c),
				(long long)cs->dim[d].bytes[c]);
			any = 1;
			firstdim = 0;
		}
		if (any)
			fprintf(f, "}");
	}
	fprintf(f, "}");
}

/* Whether this step's calls and bytes are the plan's estimate for this rank;
 * the first difference goes to why. */
static int comm_matches(const struct run *r, char *why, size_t n)
{
	const struct hp_rank_est *est = r->est;

	if (!est)
		return 0;

	for (int d = 0; d <= HP_NDIM; d++)
		for (int c = 0; c < HP_NCOLL; c++) {
			const struct hp_comm *m = &r->comms.dim[d];

			/* what the routing decides (EP's return exchanges) is not estimated */
			int64_t got = m->bytes[c] - m->routed[c], want = est->comm[d][c].bytes - est->comm[d][c].routed;

			if (m->calls[c] != est->comm[d][c].calls || got != want) {
				snprintf(why, n, "rank %d, %s %s: %lld calls, %lld bytes not set by the routing; "
					 "the plan says %lld, %lld", r->rank, hp_comm_dim_name(d),
					 hp_coll_name((enum hp_coll)c), (long long)m->calls[c], (long long)got,
					 (long long)est->comm[d][c].calls, (long long)want);
				return 0;
			}
		}
	return 1;
}

/*
 * One optimizer step's gradients, for every world size: this rank runs
 * its dp share of the step's micro-batches (one process: all of them),
 * over FSDP with the units gathered as hp-plan(5) says, each micro-batch's
 * gradients reduce-scattered and the replicas synced; step_update then
 * steps AdamW on the optimizer's store (the shards, or the model's flat
 * arrays).  *total comes back global; the step's sums (the loss and aux
 * sums over dp, the gradients' squared norm over the world) stay in the
 * backend's memory (enum hp_model_stat), where the update reads them.
 */
/*
 * A pipeline stage's part of a step: the actions of its schedule
 * (lib/plan/schedule.h) over the micro-batches first.., each in its slot
 * of activations, each action's output handed on as the next one's input
 * comes in (exchange).  Forward-only lists (evaluation)
 * add each forward's loss and targets to ls and cnt.  FSDP's root unit is
 * gathered as a micro-batch's forward or backward begins and reduced as
 * its backward ends.
 */
/* The slot of action a's micro-batch in its chunk. */
static int pp_slot(const struct run *r, const struct hp_pp_action *a)
{
	return hp_pp_slot(r->par.chunk_slots, a->mb, a->chunk);
}

/*
 * One exchange with the neighbouring stages: the outputs of the actions
 * act[i0..i1) (run since the last exchange) out, the inputs of act[i1..i2)
 * (up to the next) in, all in one sendrecv (Megatron-LM's
 * send_forward_recv_backward and its kin), so that two neighbours never
 * both wait to send; with the MoE load-balancing loss, the router
 * statistics travel beside each.  Each action's buffers are its slot's.
 */
static int exchange(struct run *r, const struct hp_pp_action *act, int i0, int i1, int i2, struct hp_err *e)
{
	struct hp_model *m = &r->model;
	struct hp_p2p op[HP_P2P_MAX];
	size_t ne = hp_model_stage_numel(m);
	int n = 0;

	for (int i = i0; i < i2; i++) {
		const struct hp_pp_action *a = &act[i];
		int in = i >= i1, peer = hp_pp_peer((int)r->plan->pp, r->plan->vpp, r->stage, a, in);
		struct hp_stage_io io;
		float *x;

		if (peer < 0)
			continue;
		if (n + 2 > HP_P2P_MAX)
			return hp_err_set(e, HP_EINVAL, "internal: a pipeline exchange of more than %d transfers",
					  HP_P2P_MAX);
		hp_model_slot_io(m, pp_slot(r, a), &io);
		x = a->backward ? io.grad : in ? io.in : io.out;
		op[n++] = (struct hp_p2p){ in ? NULL : x, in ? x : NULL, ne, peer, HP_DTYPE_F32 };
		if (io.naux)
			op[n++] = (struct hp_p2p){ in ? NULL : io.aux, in ? io.aux : NULL, io.naux, peer, HP_DTYPE_F64 };
	}
	return n ? r->bk->sendrecv(r->bk, &r->comms.dim[HP_DIM_PP], op, n, e) : 0;
}

/* The fault pp_stale_activation: on the second stage, micro-batch 1's
 * forward (of the first chunk) gets micro-batch 0's input (kept when it
 * came) for its own. */
static int stale_fault(struct run *r, const struct hp_pp_action *a, struct hp_err *e)
{
	struct hp_model *m = &r->model;
	size_t bytes = hp_model_stage_numel(m) * sizeof(float);

	if (m->fault != HP_FAULT_PP_STALE_ACTIVATION || r->stage != 1 || a->backward || a->chunk || a->mb > 1)
		return 0;
	if (!r->stale && !(r->stale = r->bk->alloc(r->bk, bytes, e)))
		return e->code;
	struct hp_stage_io io;

	hp_model_slot_io(m, m->cur_slot, &io);
	if (a->mb == 0)
		r->bk->copy(r->bk, r->stale, io.in, bytes);
	else
		r->bk->copy(r->bk, io.in, r->stale, bytes);
	return 0;
}

/* The end of the actions from i on that run before the next exchange. */
static int group_end(const struct hp_pp_action *act, int n, int i)
{
	while (i < n && !act[i].xchg)
		i++;
	return i < n ? i + 1 : n;
}

static int pipeline(struct run *r, const struct hp_pp_action *act, int n, long first, double fwd_scale,
		    double scale_count, double aux_w, double *ls, double *cnt, struct hp_err *e)
{
	struct hp_model *m = &r->model;
	long B = r->cfg.training.micro_batch_size, T = hp_config_seq_length(&r->cfg);
	int pp = (int)r->plan->pp, vpp = r->plan->vpp, rc, root_seen = 0, g0 = 0;   /* g0: the group's first */

	if ((rc = exchange(r, act, 0, 0, group_end(act, n, 0), e)))
		return rc;
	for (int i = 0; i < n; i++) {
		const struct hp_pp_action *a = &act[i];
		/* the fault pp_out_of_order: the first stage computes micro-batches 0
		 * and 1 each from the other's ids */
		long mb = first + (m->fault == HP_FAULT_PP_OUT_OF_ORDER && r->stage == 0 && a->mb < 2 && !a->backward ?
				   1 - a->mb : a->mb);
		const int32_t *in = r->inputs + mb * B * T, *lb = r->labels + (first + a->mb) * B * T;
		const int32_t *seg = r->seg ? r->seg + mb * B * T : NULL;
		/* FSDP's root unit (embedding, final norm, LM head) is the business
		 * of the chunk that holds those layers alone */
		int root = hp_pp_root_chunk(pp, vpp, r->stage, a->chunk);
		int last = r->stage == pp - 1 && a->chunk == vpp - 1;
		long k;

		hp_model_use_slot(m, pp_slot(r, a));
		if (r->dist && root && (rc = hp_fsdp_micro_begin(&r->fsdp, !root_seen++, e)))
			return rc;
		if (!a->backward) {
			double one = 0;

			if ((rc = stale_fault(r, a, e)))
				return rc;
			if (r->verifying)
				hp_verify_micro(&r->verify, a->mb);
			if ((rc = hp_model_forward(m, in, lb, seg, fwd_scale, ls ? &one : NULL, &k, e)))
				return rc;
			if (ls && last) {
				*ls += one;
				*cnt += (double)k;
			}
		} else {
			if (r->dist)
				hp_fsdp_set_sync(&r->fsdp, a->mb == (int)r->plan->accum - 1);
			if ((rc = hp_model_backward(m, in, lb, scale_count, aux_w, e)) ||
			    (r->dist && (rc = hp_fsdp_micro_end(&r->fsdp, root, e))))
				return rc;
		}
		/* after the last action before an exchange: the group's outputs
		 * out, the next group's inputs in */
		if (a->xchg && (rc = exchange(r, act, g0, i + 1, group_end(act, n, i + 1), e)))
			return rc;
		g0 = a->xchg ? i + 1 : g0;
	}
	return 0;
}

static int step_grads(struct run *r, long step, const struct hp_train_opts *o, double *total, struct hp_err *e)
{
	struct hp_model *m = &r->model;
	struct hp_backend *bk = r->bk;
	struct hp_comms *cs = &r->comms;
	long B = r->cfg.training.micro_batch_size, T = hp_config_seq_length(&r->cfg), G = r->plan->accum;
	long first = hp_mesh_coord(r->plan->size, HP_DIM_DP, r->rank) * G;
	int rc;

	/* this rank's targets: its dp share of the micro-batches, its cp chunk
	 * of each row (tp ranks count the same tokens, and are not summed) */
	long cp = r->plan->cp, S = T / cp, c0 = hp_mesh_coord(r->plan->size, HP_DIM_CP, r->rank) * S;

	*total = 0;
	for (long a = first; a < first + G; a++)
		for (long b = 0; b < B; b++)
			for (long i = c0; i < c0 + S; i++)
				*total += r->labels[(a * B + b) * T + i] != HP_IGNORE_INDEX;
	double mine = *total;
	/* the token-weighted loss needs the count over every dp and cp rank */
	if ((rc = hp_comm_allreduce(&cs->dim[HP_DIM_DP_SHARD], total, 1, HP_DTYPE_F64, HP_RED_SUM, e)) ||
	    (rc = hp_comm_allreduce(&cs->dim[HP_DIM_DP_REPLICATE], total, 1, HP_DTYPE_F64, HP_RED_SUM, e)))
		return rc;
	/* the fault grad_scale: each rank scales by its own count */
	double scale_count = m->fault == HP_FAULT_GRAD_SCALE ? mine : *total;
	if (r->verifying && ((rc = hp_verify_reference(&r->verify, step, r->inputs, r->labels, r->seg,
						       G * r->plan->dp, *total, e)) ||
			     (rc = hp_verify_share(&r->verify, e))))
		return rc;
	double fwd_scale = scale_count > 0 ? 1.0 / scale_count : 0, aux_w = 1.0 / (double)(G * r->plan->dp);
	hp_optim_zero_grad(&r->opt);
	hp_model_stats_zero(m);
	/* over ranks the model's accumulators are FSDP's: each unit's goes back
	 * (zero, and no memory) when it is reduced; a failed step's leftovers
	 * go back here without touching the rest */
	if (r->dist)
		for (int u = 0; u < r->fsdp.nunits; u++)
			hp_fsdp_release(&r->fsdp, u, 1);
	if (r->plan->pp > 1 && (rc = pipeline(r, r->pp_act, r->pp_nact, first, fwd_scale, scale_count, aux_w, NULL,
					       NULL, e)))
		return hp_err_prefix(e, "step %ld", step);
	for (long a = first; r->plan->pp == 1 && a < first + G; a++) {
		const int32_t *in = r->inputs + a * B * T, *lb = r->labels + a * B * T;
		long cnt;

		if (r->dist && (rc = hp_fsdp_micro_begin(&r->fsdp, a == first, e)))
			return rc;
		if (r->verifying)
			hp_verify_micro(&r->verify, (int)(a - first));
		if ((rc = hp_model_forward(m, in, lb, r->seg ? r->seg + a * B * T : NULL, fwd_scale, NULL, &cnt, e)))
			return hp_err_prefix(e, "step %ld", step);
		/* the aux loss enters as HF's per-forward term, averaged over micro-batches */
		if (r->dist)
			hp_fsdp_set_sync(&r->fsdp, a == first + G - 1);
		if ((rc = hp_model_backward(m, in, lb, scale_count, aux_w, e)))
			return hp_err_prefix(e, "step %ld", step);
		if (r->dist && (rc = hp_fsdp_micro_end(&r->fsdp, 1, e)))
			return rc;
	}
	if (r->dist && ((rc = hp_fsdp_sync_replicas(&r->fsdp, e)) || (rc = hp_fsdp_sync_tp(&r->fsdp, e)) ||
			(rc = hp_fsdp_sync_tied(&r->fsdp, e))))
		return rc;
	/* the step's sums, on the backend: nothing waits for a device here
	 * (a failed backend still joins the all-reduces) */
	int brc = hp_optim_grad_sumsq(&r->opt, hp_model_stat(m, HP_ST_GRAD_SQ), e);
	double *sums = hp_model_stat(m, HP_ST_LOSS);   /* and HP_ST_AUX */
	if ((rc = bk->allreduce(bk, &cs->dim[HP_DIM_DP_SHARD], sums, 2, HP_DTYPE_F64, HP_RED_SUM, e)) ||
	    (rc = bk->allreduce(bk, &cs->dim[HP_DIM_DP_REPLICATE], sums, 2, HP_DTYPE_F64, HP_RED_SUM, e)) ||
	    (rc = bk->allreduce(bk, &cs->dim[HP_DIM_PP], sums, 2, HP_DTYPE_F64, HP_RED_SUM, e)) ||
	    (rc = brc))
		return rc;
	/* the step's traffic, before anything this run adds for its own checks */
	if (r->dist && !comm_matches(r, r->comm_why, sizeof(r->comm_why)))
		r->comm_bad = 1;
	if (r->verifying && (rc = hp_verify_params(&r->verify, 1, e)))
		return rc;
	if (step == 1 && o->dump_grads) {
		if ((rc = dump_tensors(r, o->dump_grads, 1, e)))
			return rc;
		r->dumped = r->rank == 0;
	}
	return 0;
}

/* training.moe_router_bias_update_rate: a model with DeepSeek's correction
 * bias, and a run that does not hold it to a one-process replay (whose
 * reference does not move the bias). */
static int check_bias_update(struct run *r, const struct hp_train_opts *o, struct hp_err *e)
{
	if (r->cfg.training.moe_router_bias_update_rate <= 0)
		return 0;
	if (!r->spec.router_group)
		return hp_err_set(e, HP_EUNSUP, "'%s': $.training.moe_router_bias_update_rate: model_type %s has no "
				  "expert bias to move (deepseek_v3's e_score_correction_bias)", r->cfg.path,
				  r->spec.model_type);
	if (o->verify || r->cfg.model.validate_placement)
		return hp_err_set(e, HP_EUNSUP, "'%s': $.training.moe_router_bias_update_rate with hp-verify or "
				  "validate_placement: the one-process replay does not move the bias yet", r->cfg.path);
	/* where each layer's bias is in the plan's list, found once */
	int L = r->spec.n_layers;
	if (!(r->loads = hp_calloc((size_t)L * (size_t)r->spec.n_experts, sizeof(double))) ||
	    !(r->bias_at = hp_malloc((size_t)L * sizeof(int))))
		return hp_err_set(e, HP_ENOMEM, "out of memory for the router's loads");
	for (int l = 0; l < L; l++) {
		char name[96];

		snprintf(name, sizeof(name), "model.layers.%d.mlp.gate.e_score_correction_bias", l);
		r->bias_at[l] = -1;
		for (int i = 0; hp_model_spec_layer_is_moe(&r->spec, l) && i < r->plan->nparams; i++)
			if (!strcmp(r->plan->params[i].name, name))
				r->bias_at[l] = i;
	}
	return 0;
}

/*
 * DeepSeek-V3's auxiliary-loss-free balancing, under Megatron's name
 * (training.moe_router_bias_update_rate): after a step, each MoE layer's
 * e_score_correction_bias moves by the rate towards balance,
 * b_x += rate * sign(mean load - load_x) in float32 (Megatron's
 * get_updated_expert_bias), the loads being the rows each expert took in
 * the step's whole global batch: every dp, cp and tp rank's tokens, every
 * stage's layers.  loads [n_layers * E] is left holding them.
 */
static int bias_update(struct run *r, double *loads, struct hp_err *e)
{
	struct hp_model *m = &r->model;
	struct hp_backend *bk = r->bk;
	const struct hp_model_spec *s = &m->gspec;
	size_t L = (size_t)s->n_layers, E = (size_t)s->n_experts;
	float rate = (float)r->cfg.training.moe_router_bias_update_rate, *tmp;
	static const int dims[] = { HP_DIM_DP_SHARD, HP_DIM_DP_REPLICATE, HP_DIM_TP, HP_DIM_PP };
	int rc;

	if ((rc = hp_model_route_loads(m, loads, e)))
		return rc;
	for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++)
		if ((rc = hp_comm_allreduce(&r->comms.dim[dims[d]], loads, L * E, HP_DTYPE_F64, HP_RED_SUM, e)))
			return rc;
	if (!(tmp = hp_malloc(E * sizeof(float))))
		return hp_err_set(e, HP_ENOMEM, "out of memory for the router's bias");
	for (size_t l = 0; l < L && !rc; l++) {
		const double *ld = loads + l * E;
		double mean = 0;
		float *dev;
		int64_t first = 0, n = (int64_t)E;
		int i = r->bias_at[l];

		if (i < 0)
			continue;
		if (r->dist) {   /* this rank's shard of it, if any */
			if (!r->fsdp.mp[i] || r->fsdp.pc[i].nrows <= 0)
				continue;
			dev = r->fsdp.w + r->fsdp.poff[i];
			first = r->fsdp.pc[i].row0;   /* hp_plan_piece: the global row of its first */
			n = r->fsdp.pc[i].nrows;
		} else {
			dev = m->w.bw + m->w.params[i].offset;
		}
		for (size_t x = 0; x < E; x++)
			mean += ld[x];
		mean /= (double)E;
		if ((rc = bk->download(bk, tmp, dev, (size_t)n * sizeof(float), e)))
			break;
		for (int64_t x = 0; x < n; x++) {
			double off = mean - ld[first + x];

			tmp[x] += off > 0 ? rate : off < 0 ? -rate : 0.0f;
		}
		if ((rc = bk->upload(bk, dev, tmp, (size_t)n * sizeof(float), e)))
			break;
		if (!r->dist && bk->weights_changed)
			bk->weights_changed(bk, dev, (size_t)n);
	}
	hp_free(tmp);
	return rc;
}

/* The update of step_grads' gradients: clip, AdamW on the store, both
 * from the step's sums in the backend's memory; a step whose sums say it
 * must not update (hp_clip_gate) leaves the weights as they are, and the
 * caller, which reads the sums after, stops the run. */
static int step_update(struct run *r, double lr, struct hp_err *e)
{
	struct hp_model *m = &r->model;
	float *cg = (float *)hp_model_stat(m, HP_ST_CLIP);

	hp_optim_clip_gate(&r->opt, cg, hp_model_stat(m, HP_ST_GRAD_SQ), hp_model_stat(m, HP_ST_LOSS),
			   hp_model_stat(m, HP_ST_AUX), (const int32_t *)hp_model_stat(m, HP_ST_BAD),
			   r->cfg.debug.check_nan_inf);
	if (r->dist)
		hp_fsdp_before_update(&r->fsdp);
	hp_optim_step(&r->opt, lr, cg);
	if (r->verifying) {
		hp_verify_update(&r->verify, lr);
		return hp_verify_params(&r->verify, 0, e);
	}
	return 0;
}

/* Where this rank's piece of plan param i of a checkpoint kind lives:
 * the shards over ranks, the model and its optimizer in one process
 * (whose parameters are the plan's, in its order). */
static float *ckpt_piece(void *ctx, int kind, int i)
{
	struct run *r = ctx;
	struct hp_param *mp;

	if (r->dist) {
		float *base = kind == HP_CKPT_WEIGHTS ? r->fsdp.hw : kind == HP_CKPT_EXP_AVG ? r->fsdp.hm1 : r->fsdp.hm2;

		return r->fsdp.mp[i] ? base + r->fsdp.poff[i] : NULL;
	}
	if (i >= r->model.w.nparams || strcmp((mp = &r->model.w.params[i])->name, r->plan->params[i].name))
		return NULL;
	if (kind == HP_CKPT_WEIGHTS)
		return mp->w;
	return (kind == HP_CKPT_EXP_AVG ? r->opt.hm : r->opt.hv) + mp->offset;
}

static void data_cursor(const struct run *r, struct hp_ckpt_state *st)
{
	st->online = r->online != NULL;
	if (r->online)
		hp_online_cursor(r->online, &st->epoch, &st->doc, &st->off);
	else
		hp_batcher_cursor(r->data, &st->pos, &st->epoch);
}

/* What ckpt_piece hands out is the host's copy of the run's state: a
 * device's comes to it before a save (to_host 1), and goes back after a
 * restore (0).  Nothing on the CPU. */
static int move_state(struct run *r, int to_host, struct hp_err *e)
{
	int rc;

	if (r->dist)
		return to_host ? hp_fsdp_download(&r->fsdp, 0, 1, e) : hp_fsdp_upload(&r->fsdp, e);
	if ((rc = to_host ? hp_model_download(&r->model, 0, e) : hp_model_upload(&r->model, e)))
		return rc;
	return hp_optim_move(&r->opt, to_host, e);
}

/* Save the checkpoint of step (the run's state after it); returns the
 * seconds the loop was held. */
static int save_ckpt(struct run *r, long step, int last, double *held, struct hp_err *e)
{
	const struct hp_config *c = &r->cfg;
	struct hp_ckpt_save_opts so = {
		.root = c->checkpoint.checkpoint_dir, .optimizer = c->checkpoint.save_optimizer,
		.keep_last = c->checkpoint.keep_last, .hf_dtype = r->spec.torch_dtype,
		.consolidated = !strcmp(c->checkpoint.save_consolidated, "every") ||
				(last && !strcmp(c->checkpoint.save_consolidated, "final")),
		.finite = c->debug.check_nan_inf,
	};
	struct hp_ckpt_state st = { .step = step, .seed = (uint64_t)c->training.seed };
	double t0 = now_s();
	int rc;

	if (so.hf_dtype != HP_DTYPE_BF16 && so.hf_dtype != HP_DTYPE_F16)
		so.hf_dtype = HP_DTYPE_F32;
	if ((rc = move_state(r, 1, e)))
		return rc;
	data_cursor(r, &st);
	rc = hp_ckpt_save(&so, r->plan, MPI_COMM_WORLD, ckpt_piece, r, &st, e);
	*held = now_s() - t0;
	return rc;
}

/* checkpoint.restore_from: the weights, moments, step and data cursor. */
static int restore_ckpt(struct run *r, FILE *out, struct hp_err *e)
{
	const struct hp_config *c = &r->cfg;
	struct hp_ckpt_state st;
	char dir[4200];
	double t0 = now_s();
	int rc;

	rc = hp_ckpt_find(c->checkpoint.checkpoint_dir, c->checkpoint.restore_from, dir, sizeof(dir), e);
	if (rc == HP_CKPT_NONE_YET) {
		/* a first start of a job that resumes when it is started again */
		if (r->rank == 0 && out)
			fprintf(out, "checkpoint: none in '%s' yet; starting from the model\n",
				c->checkpoint.checkpoint_dir);
		return 0;
	}
	if (rc || (rc = hp_ckpt_restore(dir, r->plan, MPI_COMM_WORLD, 1, ckpt_piece, r, &st, e)))
		return rc;
	if ((rc = move_state(r, 0, e)))
		return rc;
	if (st.online != (r->online != NULL))
		return hp_err_set(e, HP_ECONFIG, "'%s': the checkpoint was made with %s data, this run reads %s",
				  dir, st.online ? "online" : "indexed", r->online ? "online" : "indexed");
	rc = r->online ? hp_online_seek(r->online, st.epoch, st.doc, st.off, e) :
			 hp_batcher_seek(r->data, st.pos, st.epoch, e);
	if (rc)
		return hp_err_prefix(e, "'%s/train_state.json'", dir);
	if (st.step >= c->training.train_iters)
		return hp_err_set(e, HP_ECONFIG, "'%s': the checkpoint is of step %ld, and training.train_iters "
				  "is %ld: nothing left to train", dir, st.step, c->training.train_iters);
	r->opt.step = st.step;
	r->first_step = st.step + 1;
	if (r->rank == 0 && out)
		fprintf(out, "checkpoint: resumed from '%s' at step %ld (%.2f s)\n", dir, st.step, now_s() - t0);
	return 0;
}

/*
 * training.device: the backend this rank's model runs on, into r->bk:
 * the CPU's, or the CUDA backend on this rank's GPU (its place on its
 * node modulo the node's GPUs: ranks may share one, their collectives
 * then go host-staged), or with HP_CUDA_EMULATE its host emulation (no GPU
 * needed; device auto runs there too).  0 or an error.
 */
static int pick_device(struct run *r, MPI_Comm comm, struct hp_err *e)
{
	enum hp_device d = r->cfg.training.device;
	const char *p = r->cfg.path;
	enum hp_emulate emu;
	int n = 0, rc;

	r->bk = hp_backend_cpu();
	if ((rc = hp_emulate_from_env(&emu, e)))
		return rc;
	const char *prof = getenv("HP_CUDA_PROFILE");
	if (prof && *prof && strcmp(prof, "0") && strcmp(prof, "1"))
		return hp_err_set(e, HP_ECONFIG, "HP_CUDA_PROFILE=%s: expected 1 or 0 (or unset)", prof);
	if (emu != HP_EMULATE_OFF)
		n = 1;   /* the emulation is one device, whatever this machine has */
#ifdef HP_HAVE_CUDA
	else if (d != HP_DEVICE_CPU)
		n = hp_cuda_device_count();   /* the driver is woken only when it may be used */
#endif
	if (d == HP_DEVICE_CPU || (d == HP_DEVICE_AUTO && n == 0))
		return 0;
	/* before the build and the GPU are looked at, so that the refusal is
	 * the same (and testable) on every machine */
	if (r->cfg.fsdp.enable_offload)
		return hp_err_set(e, HP_EUNSUP, "'%s': $.fsdp_config.enable_offload: offloading to the host is "
				  "not implemented on training.device: cuda yet (on the CPU the parameters are in "
				  "host memory already)", p);
#ifndef HP_HAVE_CUDA
	if (emu == HP_EMULATE_OFF)
		return hp_err_set(e, HP_EUNSUP, "'%s': $.training.device: cuda, but this hp was built without "
				  "CUDA (no nvcc at build time); rebuild with the CUDA toolkit, use device: cpu, or "
				  "set HP_CUDA_EMULATE=exact to run the CUDA backend's host emulation", p);
#endif
	if (n == 0)
		return hp_err_set(e, HP_EUNSUP, "'%s': $.training.device: cuda, but no CUDA device is visible "
				  "(check nvidia-smi and CUDA_VISIBLE_DEVICES); use device: cpu or auto", p);
	/* one GPU per rank by the rank's place on its node; more ranks than
	 * GPUs share them */
	MPI_Comm node;
	int local = 0, nlocal = 1;
	MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, r->rank, MPI_INFO_NULL, &node);
	MPI_Comm_rank(node, &local);
	MPI_Comm_size(node, &nlocal);
	MPI_Comm_free(&node);
	if ((rc = hp_backend_cuda_open(&r->bk, local % n, nlocal > n, emu, e))) {
		r->bk = hp_backend_cpu();
		return rc;
	}
	snprintf(r->gpu_name, sizeof(r->gpu_name), "%s%s", r->bk->name, nlocal > n && emu == HP_EMULATE_OFF ?
		 " (shared by the node's ranks)" : "");
	r->bk->profile = prof && !strcmp(prof, "1");
	/* the ranks on this rank's GPU (the emulation: one device each) */
	r->gpu_share = emu == HP_EMULATE_OFF ? (nlocal + n - 1 - local % n) / n : 1;
	return 0;
}

/*
 * Part p of the data (HP_SPLIT_*) as data_config.split cuts it, or, for
 * validation with dataset.valid_data_path, all of that.  A validation or
 * test part without rows is left NULL.
 */
static int open_part(struct run *r, int p, struct hp_err *e)
{
	const struct hp_config *c = &r->cfg;
	int other = p == HP_SPLIT_VALID && c->dataset.nvalid_data_path;
	const struct hp_split *sp = other ? NULL : &r->split;
	struct hp_batcher **b = p == HP_SPLIT_TRAIN ? &r->data : &r->edata[p];
	struct hp_online **o = p == HP_SPLIT_TRAIN ? &r->online : &r->eonline[p];
	int rc;

	if (c->dataset.kind == HP_DATASET_INDEXED && r->conv_indexed) {
		/* hp-data's conversations: packed as the online mode packs them */
		struct hp_online_opts oo = {
			.indexed = other ? c->dataset.valid_data_path[0] : c->dataset.data_path[0],
			.tokenizer = c->dataset.tokenizer_path,
			.seq_length = hp_config_seq_length(c), .shuffle = c->dataset.shuffle && p == HP_SPLIT_TRAIN,
			.seed = (uint64_t)c->training.seed, .split = sp, .part = other ? HP_SPLIT_TRAIN : p,
		};
		return hp_online_open(o, &oo, e);
	}
	if (c->dataset.kind == HP_DATASET_INDEXED) {
		/* valid_data_path: the whole file */
		if ((rc = hp_batcher_open_split(b, other ? c->dataset.valid_data_path[0] : c->dataset.data_path[0],
						hp_config_seq_length(c), c->dataset.is_dataset_from_mr, sp,
						other ? HP_SPLIT_TRAIN : p, e)))
			return rc;
		if (!hp_batcher_rows_per_epoch(*b)) {
			hp_batcher_free(*b);
			*b = NULL;
		}
		if (*b && r->has_docs)
			hp_batcher_set_docs(*b, &r->docs);
		return 0;
	}
	struct hp_chat_opts co = {
		.template_spec = c->dataset.chat_template,
		.tokenizer_path = c->dataset.tokenizer_path ? c->dataset.tokenizer_path : c->model.path,
		.messages_key = c->dataset.text_keys[0], .role_key = c->dataset.role_key,
		.content_key = c->dataset.content_key,
		.all_tokens = c->dataset.loss_tokens == HP_LOSS_TOKENS_ALL,
	};
	struct hp_online_opts oo = {
		.paths = other ? c->dataset.valid_data_path : c->dataset.data_path,
		.npaths = other ? c->dataset.nvalid_data_path : c->dataset.ndata_path,
		.tokenizer = c->dataset.tokenizer_path ? c->dataset.tokenizer_path : c->model.path,
		.text_keys = c->dataset.text_keys, .ntext_keys = c->dataset.ntext_keys,
		.seq_length = hp_config_seq_length(c), .shuffle = c->dataset.shuffle && p == HP_SPLIT_TRAIN,
		.seed = (uint64_t)c->training.seed, .skip_invalid = c->dataset.skip_invalid_lines,
		.split = sp, .part = p,
		.chat = conversations(c) ? &co : NULL,
	};
	return hp_online_open(o, &oo, e);
}

/*
 * The indexed dataset's end-of-document id, for eod_mask_loss and
 * reset_*: model_assets.tokenizer.eod_token_id, else the eos_token of the
 * tokenizer at model_assets.tokenizer.pretrained_model_name_or_path, else
 * the model's config.json eos_token_id.  *from says which.
 */
static int eod_id(const struct run *r, int32_t *eod, const char **from, struct hp_err *e)
{
	const struct hp_config *c = &r->cfg;
	long id = -1;
	int rc;

	if (c->dataset.eod_token_id >= 0) {
		id = c->dataset.eod_token_id;
		*from = "dataset.model_assets.tokenizer.eod_token_id";
	} else if (c->dataset.tokenizer_path) {
		struct hp_tokenizer *t;

		if ((rc = hp_tok_load(&t, c->dataset.tokenizer_path, e)))
			return rc;
		id = hp_tok_eod_id(t);
		hp_tok_free(t);
		*from = "the tokenizer's eos_token";
		if (id < 0)
			return hp_err_set(e, HP_ECONFIG, "'%s': the tokenizer has no end-of-document token: set "
					  "dataset.model_assets.tokenizer.eod_token_id", c->dataset.tokenizer_path);
	} else if (r->spec.eos_token_id >= 0) {
		id = r->spec.eos_token_id;
		*from = "config.json's eos_token_id";
	} else {
		return hp_err_set(e, HP_ECONFIG, "'%s': $.dataset.data_config: eod_mask_loss and reset_* need the "
				  "end-of-document id: set dataset.model_assets.tokenizer.eod_token_id (the model's "
				  "config.json has no eos_token_id)", c->path);
	}
	if (id >= r->spec.vocab)
		return hp_err_set(e, HP_ECONFIG, "'%s': the end-of-document id %ld (%s) is outside the model's "
				  "vocabulary [0, %d)", c->path, id, *from, r->spec.vocab);
	*eod = (int32_t)id;
	return 0;
}

/*
 * An indexed dataset with PREFIX.mask beside it holds conversations from
 * hp-data build --chat-template: served packed, with their masks, never
 * cut into windows.  data_type conversation asks for that mask; the
 * settings of window cutting do not apply to it.
 */
static int find_mask(struct run *r, struct hp_err *e)
{
	const struct hp_config *c = &r->cfg;
	char path[4200];
	struct stat st;

	if (c->dataset.kind != HP_DATASET_INDEXED)
		return 0;
	snprintf(path, sizeof(path), "%s.mask.idx", c->dataset.data_path[0]);
	r->conv_indexed = !stat(path, &st);
	if (!r->conv_indexed && conversations(c))
		return hp_err_set(e, HP_EFORMAT, "'%s': $.dataset.data_transform.data_type: conversation, but "
				  "'%s' has no loss mask ('%s'): build it with hp-data build --chat-template", c->path,
				  c->dataset.data_path[0], path);
	if (r->conv_indexed && c->dataset.nvalid_data_path) {
		snprintf(path, sizeof(path), "%s.mask.idx", c->dataset.valid_data_path[0]);
		if (stat(path, &st))
			return hp_err_set(e, HP_EFORMAT, "'%s': $.dataset.valid_data_path: '%s' has no loss mask "
					  "('%s') but data_path has: both must be conversations", c->path,
					  c->dataset.valid_data_path[0], path);
	}
	if (r->conv_indexed && (c->dataset.is_dataset_from_mr || c->dataset.eod_mask_loss ||
				c->dataset.reset_position_ids))
		return hp_err_set(e, HP_ECONFIG, "'%s': $.dataset.data_config.%s: '%s' holds conversations "
				  "(it has a loss mask), which hp packs apart, each with its own positions and "
				  "attention, and never cuts", c->path,
				  c->dataset.is_dataset_from_mr ? "is_dataset_from_mr" :
				  c->dataset.eod_mask_loss ? "eod_mask_loss" : "reset_position_ids",
				  c->dataset.data_path[0]);
	return 0;
}

/* The training part, and with eval_iters the validation part (which must
 * have rows) and the test part. */
static int open_data(struct run *r, struct hp_err *e)
{
	const struct hp_config *c = &r->cfg;
	uint64_t d0, n, all;
	int rc;

	if ((rc = hp_split_parse(&r->split, c->dataset.split, e)))
		return rc;
	if ((rc = find_mask(r, e)))
		return rc;
	if (c->dataset.eod_mask_loss || c->dataset.reset_position_ids) {
		r->docs.mask_loss = c->dataset.eod_mask_loss;
		r->docs.reset = c->dataset.reset_position_ids;
		if ((rc = eod_id(r, &r->docs.eod, &r->eod_from, e)))
			return rc;
		r->has_docs = 1;
	}
	if ((rc = open_part(r, HP_SPLIT_TRAIN, e)))
		return rc;
	if (r->data && c->dataset.shuffle &&
	    (rc = hp_batcher_set_shuffle(r->data, (uint64_t)c->training.seed, e)))
		return rc;
	if (r->data && !strcmp(c->dataloader.sampler_type, "single")) {
		/* one pass: the run must not need more rows than the train split has */
		unsigned long long want = (unsigned long long)c->training.train_iters *
					  (unsigned long long)c->training.global_batch_size;

		if (want > hp_batcher_rows_per_epoch(r->data))
			return hp_err_set(e, HP_ECONFIG, "'%s': $.dataloader.sampler_type: single reads the train "
					  "split once, %llu rows, but train_iters x global_batch_size is %llu (use cyclic, "
					  "which wraps)", c->path, (unsigned long long)hp_batcher_rows_per_epoch(r->data),
					  want);
	}
	if (c->training.eval_iters <= 0)
		return 0;
	if ((rc = open_part(r, HP_SPLIT_VALID, e)) || (rc = open_part(r, HP_SPLIT_TEST, e)))
		return rc;
	if (!part_docs(r, HP_SPLIT_VALID, &d0, &n, &all)) {
		if (c->dataset.nvalid_data_path)
			return hp_err_set(e, HP_EFORMAT, "'%s': $.dataset.valid_data_path: '%s' cannot make one row "
					  "of seq_length %ld to evaluate", c->path, c->dataset.valid_data_path[0],
					  hp_config_seq_length(c));
		part_docs(r, HP_SPLIT_TRAIN, &d0, &n, &all);
		return hp_err_set(e, HP_ECONFIG, "'%s': $.training.eval_iters: %ld, but split '%s' leaves no "
				  "validation row in the %llu documents of '%s' (give it a larger share, or "
				  "dataset.valid_data_path)", c->path, c->training.eval_iters, c->dataset.split,
				  (unsigned long long)all, c->dataset.data_path[0]);
	}
	return 0;
}

/* Every input id, and every target but the ignored, in [0, V); path is
 * the data they came from. */
static int check_ids(const struct run *r, long i0, long n, const char *path, const char *what, long step,
		     struct hp_err *e)
{
	int V = r->model.gspec.vocab;

	for (long i = i0; i < i0 + n; i++) {
		int32_t t = r->labels[i], x = r->inputs[i];

		if (x < 0 || x >= V || (t != HP_IGNORE_INDEX && (t < 0 || t >= V)))
			return hp_err_set(e, HP_EFORMAT, "'%s': token id %d %s step %ld is outside the model's "
					  "vocabulary [0, %d)", path, x < 0 || x >= V ? x : t,
					  what, step, V);
	}
	return 0;
}

/* The shares of documents j0..j0+n-1 ahead: rank q tokenizes
 * [cut[q], cut[q + 1]), consecutive runs of about equal text (every rank
 * computes the same cuts from the same documents). */
static void share_cuts(const struct hp_online *o, size_t j0, size_t n, int W, size_t *cut)
{
	uint64_t total = 0, at = 0;
	size_t j = 0;

	for (size_t i = 0; i < n; i++)
		total += hp_online_doc_bytes(o, j0 + i) + 1;
	cut[0] = 0;
	for (int q = 1; q <= W; q++) {
		/* the first document that starts at or past q/W of the text */
		while (j < n && (at + hp_online_doc_bytes(o, j0 + j) / 2) * (uint64_t)W < total * (uint64_t)q)
			at += hp_online_doc_bytes(o, j0 + j++) + 1;
		cut[q] = q == W ? n : j;
	}
}

/* Every rank's rc alike: its own, or an error saying another rank could
 * not do what (each failed rank has said why). */
static int agree(int rc, const char *what, struct hp_err *e)
{
	int any = rc != 0;

	hp_comm_allreduce_raw(MPI_COMM_WORLD, &any, 1, MPI_INT, MPI_MAX);
	return rc ? rc : any ? hp_err_set(e, HP_EFORMAT, "another rank could not %s (see its message)", what) : 0;
}

/*
 * One trade of the documents j0..j0+n-1 ahead of source o (those before
 * j0 it holds): each rank tokenizes its share (share_cuts), every rank gets every
 * document's tokens (MPI_Allgatherv over the world, outside the plan's
 * books: data, not the model's traffic) and hands them to o; *sum: their
 * tokens.  One rank's failure is every rank's: they all take part in
 * every collective.
 */
static int trade(struct hp_online *o, size_t j0, size_t n, int me, int W, int64_t *sum, struct hp_err *e)
{
	size_t *cut = hp_calloc((size_t)W + 1, sizeof(size_t));
	int rc = 0, nmine, marks = hp_online_marked(o);
	size_t have = 0, at = 0;
	int32_t *mt = NULL, *all = NULL;
	uint8_t *mm = NULL, *allm = NULL;
	int64_t *sts = hp_calloc((size_t)W, sizeof(int64_t)), mine;
	int64_t *lens = hp_calloc(n + 1, sizeof(int64_t)), *alll = hp_calloc(n + 1, sizeof(int64_t));
	int *cnt = hp_calloc((size_t)W, sizeof(int)), *dsp = hp_calloc((size_t)W, sizeof(int));
	const int32_t **tp = hp_calloc(n + 1, sizeof(*tp));
	const uint8_t **mp = hp_calloc(n + 1, sizeof(*mp));
	size_t *ln = hp_calloc(n + 1, sizeof(size_t));

	if (!sts || !lens || !alll || !cnt || !dsp || !tp || !mp || !ln || !cut)
		rc = hp_err_set(e, HP_ENOMEM, "out of memory sharing the tokenizing");
	if (cut)
		share_cuts(o, j0, n, W, cut);
	nmine = cut ? (int)(cut[me + 1] - cut[me]) : 0;
	for (int i = 0; !rc && i < nmine; i++) {
		const int32_t *t;
		const uint8_t *mk;
		size_t k;

		if ((rc = hp_online_encode(o, j0 + cut[me] + (size_t)i, &t, &mk, &k, e)))
			break;
		int32_t *t2 = hp_realloc(mt, (have + k + 1) * sizeof(int32_t));
		uint8_t *m2 = marks ? hp_realloc(mm, have + k + 1) : mm;
		mt = t2 ? t2 : mt;
		mm = m2 ? m2 : mm;
		if (!t2 || (marks && !m2)) {
			rc = hp_err_set(e, HP_ENOMEM, "out of memory sharing the tokenizing");
			break;
		}
		memcpy(mt + have, t, k * sizeof(int32_t));
		if (marks && k)
			memcpy(mm + have, mk, k);
		lens[i] = (int64_t)k;
		have += k;
	}
	/* every rank's tokens, once every rank has them (a failure anywhere
	 * stops all, in the same collectives) */
	mine = (int64_t)have;
	*sum = 0;
	if ((rc = agree(rc, "tokenize its share of the documents ahead", e)))
		goto out;
	MPI_Allgather(&mine, 1, MPI_INT64_T, sts, 1, MPI_INT64_T, MPI_COMM_WORLD);
	for (int q = 0; q < W; q++)
		*sum += sts[q];
	if (*sum > INT_MAX)
		rc = hp_err_set(e, HP_EINVAL, "online data: %lld tokens ahead, more than one trade takes",
				(long long)*sum);
	else if (!(all = hp_malloc((size_t)*sum * sizeof(int32_t) + 4)) || (marks && !(allm = hp_malloc((size_t)*sum + 1))))
		rc = hp_err_set(e, HP_ENOMEM, "out of memory for the shared tokens");
	if ((rc = agree(rc, "hold the documents' tokens", e)))
		goto out;
	/* the lengths, then the tokens (and marks), rank by rank */
	for (int q = 0; q < W; q++) {
		cnt[q] = (int)(cut[q + 1] - cut[q]);
		dsp[q] = (int)at;
		at += (size_t)cnt[q];
	}
	MPI_Allgatherv(lens, nmine, MPI_INT64_T, alll, cnt, dsp, MPI_INT64_T, MPI_COMM_WORLD);
	at = 0;
	for (int q = 0; q < W; q++) {
		cnt[q] = (int)sts[q];
		dsp[q] = (int)at;
		at += (size_t)cnt[q];
	}
	MPI_Allgatherv(mt ? mt : all, (int)have, MPI_INT32_T, all, cnt, dsp, MPI_INT32_T, MPI_COMM_WORLD);
	if (marks)
		MPI_Allgatherv(mm ? mm : allm, (int)have, MPI_UINT8_T, allm, cnt, dsp, MPI_UINT8_T, MPI_COMM_WORLD);
	/* the documents in order, rank by rank, their tokens one after another */
	for (size_t j = 0, off = 0; j < n; j++) {
		tp[j] = all + off;
		mp[j] = allm ? allm + off : NULL;
		ln[j] = (size_t)alll[j];
		off += ln[j];
	}
	rc = hp_online_give(o, j0, n, tp, mp, ln, e);
out:
	hp_free(cut);
	hp_free(sts);
	hp_free(lens);
	hp_free(alll);
	hp_free(cnt);
	hp_free(dsp);
	hp_free(tp);
	hp_free(mp);
	hp_free(ln);
	hp_free(mt);
	hp_free(mm);
	hp_free(all);
	hp_free(allm);
	return rc;
}

/*
 * Online data over ranks: the documents the next rows will pack,
 * tokenized once, each rank a share, so that every rank packs the one
 * process's rows without tokenizing them all (trade).  How many: *ahead,
 * the last read's count and a quarter more; the first time, one document
 * per rank, whose tokens say how many fill the rows (tokens) and a
 * quarter more.  What is left over waits for the next read; what the
 * guess misses (and what lies in the next epoch) every rank tokenizes
 * itself, as before: nothing differs but who tokenizes.
 */
static int share_docs(struct run *r, struct hp_online *o, long tokens, long *ahead, struct hp_err *e)
{
	size_t have = hp_online_cached(o), n;
	int64_t sum;
	int rc;

	if (*ahead <= 0) {
		n = hp_online_ahead(o, have + (size_t)r->world);
		if ((rc = trade(o, have, n - have, r->rank, r->world, &sum, e)))
			return rc;
		*ahead = n > have && sum > 0 ? (long)((double)tokens / ((double)sum / (double)(n - have)) * 1.25) + 1 : 0;
		have = n;
	}
	n = hp_online_ahead(o, (size_t)*ahead > have ? (size_t)*ahead : have);
	return n > have ? trade(o, have, n - have, r->rank, r->world, &sum, e) : 0;
}

/* Read rows from an online source, the tokenizing shared over ranks
 * (share_docs); *ahead learns from how many documents they took. */
static int online_rows(struct run *r, struct hp_online *o, long rows, int32_t *in, int32_t *lb, int32_t *seg,
		       long *ahead, struct hp_err *e)
{
	const struct hp_config *c = &r->cfg;
	long B = c->training.micro_batch_size, T = hp_config_seq_length(c);
	uint64_t p0 = hp_online_position(o), t0 = hp_online_encoded(o);
	int rc = 0;

	if (r->dist)
		rc = share_docs(r, o, rows * T, ahead, e);
	for (long a = 0; !rc && a < rows / B; a++)
		rc = hp_online_next(o, (int)B, in + a * B * T, lb + a * B * T, seg + a * B * T, e);
	if (!rc && r->dist) {
		long used = (long)(hp_online_position(o) - p0) + 1;

		*ahead = used + used / 4 + 1;
	}
	r->read_tokens += (long)(hp_online_encoded(o) - t0);
	return rc;
}

/*
 * Evaluate on part p after step: eval_iters global batches from the
 * part's start, forward only, the token-weighted cross-entropy (without
 * the router's aux loss) over every rank: *loss and its *tokens.  Each
 * rank runs its dp share of the micro-batches, as a training step; no
 * weight, moment, gradient or training-data cursor changes.
 */
static int evaluate(struct run *r, int p, long step, double *loss, double *tokens, struct hp_err *e)
{
	const struct hp_config *c = &r->cfg;
	struct hp_model *m = &r->model;
	long B = c->training.micro_batch_size, T = hp_config_seq_length(c);
	long accum = c->training.global_batch_size / B, G = r->plan->accum;
	long first = hp_mesh_coord(r->plan->size, HP_DIM_DP, r->rank) * G;
	double sums[2] = { 0, 0 };
	int (*probe)(void *, const struct hp_probe *, struct hp_err *) = m->probe;
	int rc = 0;

	rc = r->edata[p] ? hp_batcher_seek(r->edata[p], 0, 0, e) : hp_online_seek(r->eonline[p], 0, 0, 0, e);
	/* validation mode compares the training step's modules, not these */
	m->probe = NULL;
	/* indexed data over ranks: a rank reads its dp share of the batch (the
	 * rows it computes on) and skips the rest */
	long e0 = r->dist && r->edata[p] ? first : 0, en = r->dist && r->edata[p] ? G : accum;
	for (long it = 0; !rc && it < c->training.eval_iters; it++) {
		if (r->edata[p])
			hp_batcher_skip(r->edata[p], (uint64_t)(e0 * B));
		for (long a = e0; a < e0 + en && !rc && r->edata[p]; a++) {
			long at = a * B * T;

			rc = hp_batcher_next(r->edata[p], (int)B, r->inputs + at, r->labels + at, r->seg ? r->seg + at : NULL, e);
		}
		if (r->edata[p]) {
			hp_batcher_skip(r->edata[p], (uint64_t)((accum - e0 - en) * B));
		} else {
			long rt = r->read_tokens;   /* the metrics' count is the training step's */

			rc = online_rows(r, r->eonline[p], accum * B, r->inputs, r->labels, r->seg, &r->ahead[p], e);
			r->read_tokens = rt;
		}
		if (!rc)
			rc = check_ids(r, e0 * B * T, en * B * T, p == HP_SPLIT_VALID && c->dataset.nvalid_data_path ?
				       c->dataset.valid_data_path[0] : c->dataset.data_path[0],
				       p == HP_SPLIT_VALID ? "in the validation after" : "in the test after", step, e);
		/* one rank's bad rows are every rank's failure, before any collective */
		int own = rc;
		if (r->dist && (rc = agree(rc, "read its share of the data", e)) && !own)
			hp_err_prefix(e, "evaluation after step %ld", step);
		if (rc)
			break;
		if (r->plan->pp > 1) {
			rc = pipeline(r, r->pp_act + r->pp_nact, r->pp_nfwd, first, 0, 0, 0, &sums[0], &sums[1], e);
			if (rc) {
				hp_err_prefix(e, "evaluation after step %ld", step);
				break;
			}
		}
		for (long a = first; r->plan->pp == 1 && a < first + G; a++) {
			const int32_t *in = r->inputs + a * B * T, *lb = r->labels + a * B * T;
			double ls;
			long cnt;

			if (r->dist && (rc = hp_fsdp_micro_begin(&r->fsdp, 1, e)))
				break;
			/* no backward follows: the chunked head computes no gradient */
			if ((rc = hp_model_forward(m, in, lb, r->seg ? r->seg + a * B * T : NULL, 0, &ls, &cnt, e))) {
				hp_err_prefix(e, "evaluation after step %ld", step);
				break;
			}
			sums[0] += ls;
			sums[1] += (double)cnt;
		}
	}
	m->probe = probe;
	if (r->dist) {
		/* what the forwards gathered goes back; the next step gathers afresh */
		for (int u = 0; u < r->fsdp.nunits; u++)
			hp_fsdp_release(&r->fsdp, u, 0);
		/* one rank's failure is every rank's: none may wait in a collective */
		int any = rc != 0;
		hp_comm_allreduce_raw(MPI_COMM_WORLD, &any, 1, MPI_INT, MPI_MAX);
		if (!rc && any)
			rc = hp_err_set(e, HP_EINVAL, "evaluation after step %ld failed on another rank", step);
		if (!rc && ((rc = hp_comm_allreduce(&r->comms.dim[HP_DIM_DP_SHARD], sums, 2, HP_DTYPE_F64,
						    HP_RED_SUM, e)) ||
			    (rc = hp_comm_allreduce(&r->comms.dim[HP_DIM_DP_REPLICATE], sums, 2, HP_DTYPE_F64,
						    HP_RED_SUM, e)) ||
			    (rc = hp_comm_allreduce(&r->comms.dim[HP_DIM_PP], sums, 2, HP_DTYPE_F64, HP_RED_SUM, e))))
			return rc;
	}
	if (rc)
		return rc;
	*loss = sums[1] > 0 ? sums[0] / sums[1] : 0;
	*tokens = sums[1];
	return 0;
}

/* The step's micro-batches, every rank reading the whole step so that the
 * data cursor is the same on all. */
static int read_step(struct run *r, long step, long accum, struct hp_err *e)
{
	const struct hp_config *c = &r->cfg;
	long B = c->training.micro_batch_size, T = hp_config_seq_length(c);
	long first = 0, n = accum;
	int rc = 0;

	/* Indexed data over dp ranks: a rank reads its own micro-batches
	 * (step_grads' share) and skips the others' rows, so that its cursor
	 * ends where the global batch does, as every rank's.  hp-verify and
	 * validation mode read them all (rank 0's one-process reference
	 * computes them); online data packs documents into rows in stream
	 * order, so every rank still tokenizes the whole global batch. */
	if (!r->online && r->dist && !r->verifying && r->plan->dp > 1) {
		n = r->plan->accum;
		first = hp_mesh_coord(r->plan->size, HP_DIM_DP, r->rank) * n;
		hp_batcher_skip(r->data, (uint64_t)(first * B));
	}
	/* a pipeline stage between the first (ids) and the last (targets)
	 * computes on neither; it reads nothing unless its attention needs
	 * the rows' documents (segments, from the ids) */
	int none = !r->online && r->plan->pp > 1 && r->stage > 0 && r->stage < r->plan->pp - 1 && !r->seg;
	if (none) {
		hp_batcher_skip(r->data, (uint64_t)(n * B));
		first += n;
		n = 0;
	}
	if (r->online) {
		/* online: the tokens this rank tokenized */
		rc = online_rows(r, r->online, n * B, r->inputs + first * B * T, r->labels + first * B * T,
				 r->seg + first * B * T, &r->ahead[HP_SPLIT_TRAIN], e);
	} else {
		r->read_tokens += n * B * T;
		for (long a = first; a < first + n && !rc; a++) {
			long at = a * B * T;
			rc = hp_batcher_next(r->data, (int)B, r->inputs + at, r->labels + at, r->seg ? r->seg + at : NULL, e);
		}
	}
	if (!rc && n)
		rc = check_ids(r, first * B * T, n * B * T, c->dataset.data_path[0], "at", step, e);
	/* some ranks read part of the step (every rank knows it alike) */
	if (!r->online && r->dist && !r->verifying && (r->plan->dp > 1 || (r->plan->pp > 2 && !r->seg))) {
		/* one rank's bad rows are every rank's failure: none may wait in
		 * a collective for it */
		int own = rc;

		hp_batcher_skip(r->data, (uint64_t)((accum - first - n) * B));
		if ((rc = agree(rc, "read its share of the data", e)) && !own)
			hp_err_prefix(e, "step %ld", step);
	}
	if (rc)
		return rc;
	if (r->online && !strcmp(c->dataloader.sampler_type, "single")) {
		uint64_t ep, doc, off;

		hp_online_cursor(r->online, &ep, &doc, &off);
		if (ep > 1 || (ep == 1 && (doc || off)))
			return hp_err_set(e, HP_EFORMAT, "'%s': $.dataloader.sampler_type: single reads the "
					  "train split once, and step %ld ran past its end (use cyclic, which "
					  "wraps)", c->path, step);
	}
	return 0;
}

/* What a step reports: the console line (rank 0, every logging_steps) and
 * its metrics row, left open for evaluation and checkpoint fields. */
struct step_report {
	long step, iters, tokens;
	double loss, norm, lr, aux, dt, waited;
	double *pp_wait;       /* pipelines, in a run with metrics: each rank's p2p waits this step (rank 0's) */
	long long host_peak;   /* the largest peak resident set over ranks, bytes (-1: unknown) */
	long long read;        /* the largest over ranks of the data's tokens read in the step */
	long long dev_peak;    /* the largest device high-water mark over ranks, bytes */
	long syncs;            /* device runs: this step's host-device synchronisations on this rank */
	long launches;         /* device runs: this step's calls that put work on the device */
	const double *loads;   /* moe_router_bias_update_rate: each layer's rows per expert [n_layers * E] */
};

/* The largest peak resident set and device high-water mark over ranks
 * (every rank calls it, in a run that writes metrics). */
static void mem_peaks(const struct run *r, struct step_report *s)
{
	long long v[3] = { hp_host_peak_bytes(), (long long)r->bk->dev_bytes_peak, r->read_tokens };

	if (r->dist)
		hp_comm_allreduce_raw(MPI_COMM_WORLD, v, 3, MPI_LONG_LONG, MPI_MAX);
	s->host_peak = v[0];
	s->dev_peak = v[1];
	s->read = v[2];
}

static void report_step(struct run *r, FILE *out, int talk, long log_every, const struct step_report *s)
{
	if (talk && (s->step % log_every == 0 || s->step == s->iters || s->step == 1)) {
		fprintf(out, "step %ld/%ld | loss %.6f | grad_norm %.4f | lr %.3e | tok/s %.0f | %.1f ms\n",
			s->step, s->iters, s->loss, s->norm, s->lr, s->tokens / s->dt, s->dt * 1e3);
		fflush(out);
	}
	if (r->metrics) {
		char b0[32], b1[32], b2[32];

		fprintf(r->metrics, "{\"step\": %ld, \"loss\": %s, \"grad_norm\": %s, \"lr\": %.9g, "
			"\"tokens\": %ld, \"tokens_per_s\": %.3f, \"step_time_s\": %.6f",
			s->step, jnum(b0, s->loss), jnum(b1, s->norm), s->lr, s->tokens, s->tokens / s->dt, s->dt);
		if (r->model.n_moe && r->model.spec.output_router_logits)
			fprintf(r->metrics, ", \"aux_loss\": %s", jnum(b2, s->aux));
		fprintf(r->metrics, ", \"data_tokens_read\": %lld", s->read);
		/* the router's loads behind the bias update: one list per MoE layer */
		int k = 0;
		for (int l = 0; s->loads && l < r->model.gspec.n_layers; l++) {
			if (!hp_model_spec_layer_is_moe(&r->model.gspec, l))
				continue;
			for (int x = 0; x < r->model.gspec.n_experts; x++)
				fprintf(r->metrics, "%s%.0f", x ? ", " : k ? "], [" : ", \"router_loads\": [[",
					s->loads[(size_t)l * r->model.gspec.n_experts + x]);
			k++;
		}
		if (k)
			fprintf(r->metrics, "]]");
		if (s->host_peak >= 0)
			fprintf(r->metrics, ", \"host_bytes_peak\": %lld", s->host_peak);
		else
			fprintf(r->metrics, ", \"host_bytes_peak\": null");
		if (r->bk->device)
			fprintf(r->metrics, ", \"device_bytes_peak\": %lld, \"host_syncs\": %ld, \"kernel_launches\": %ld",
				s->dev_peak, s->syncs, s->launches);
		if (r->dist) {
			metrics_comm(r->metrics, &r->comms);
			fprintf(r->metrics, ", \"comm_wait_s\": %.6f", s->waited);
		}
		for (int i = 0; s->pp_wait && i < r->world; i++)
			fprintf(r->metrics, "%s%.6f%s", i ? ", " : ", \"pp_wait_s\": [", s->pp_wait[i],
				i == r->world - 1 ? "]" : "");
	}
}

/* Evaluation every eval_steps, and after the last step (then the test
 * split too). */
static int evaluate_due(struct run *r, FILE *out, int talk, long step, long iters, struct hp_err *e)
{
	const struct hp_config *c = &r->cfg;
	int rc;

	for (int p = HP_SPLIT_VALID; c->training.eval_iters > 0 && p <= HP_SPLIT_TEST; p++) {
		const char *what = p == HP_SPLIT_VALID ? "eval" : "test";
		double el, et, t1 = now_s();
		int due = step == iters || (c->training.eval_steps > 0 && step % c->training.eval_steps == 0);

		if (!due || (p == HP_SPLIT_TEST && step != iters) || !(r->edata[p] || r->eonline[p]))
			continue;
		if ((rc = evaluate(r, p, step, &el, &et, e)))
			return rc;
		t1 = now_s() - t1;
		if (talk) {
			fprintf(out, "%s step %ld/%ld | %s loss %.6f | ppl %.3f | %.0f tokens | %.1f ms\n", what, step,
				iters, p == HP_SPLIT_VALID ? "validation" : "test", el, exp(el), et, t1 * 1e3);
			fflush(out);
		}
		if (r->metrics) {
			char b[32];

			fprintf(r->metrics, ", \"%s_loss\": %s, \"%s_tokens\": %.0f, \"%s_time_s\": %.6f", what,
				jnum(b, el), what, et, what, t1);
		}
	}
	return 0;
}

/* A checkpoint every save_steps, and after the last step (hp-verify saves
 * nothing: it checks a layout, it does not train one). */
static int save_due(struct run *r, const struct hp_train_opts *o, FILE *out, int talk, long step, long iters,
		    struct hp_err *e)
{
	const struct hp_config *c = &r->cfg;
	double held;
	int rc;

	if (!c->checkpoint.save_ckpt || o->verify ||
	    !((c->checkpoint.save_steps > 0 && step % c->checkpoint.save_steps == 0) || step == iters))
		return 0;
	if ((rc = save_ckpt(r, step, step == iters, &held, e)))
		return rc;
	if (talk)
		fprintf(out, "checkpoint: step %ld saved in %s/global_step_%ld (%.2f s)\n", step,
			c->checkpoint.checkpoint_dir, step, held);
	if (r->metrics)
		fprintf(r->metrics, ", \"checkpoint_s\": %.6f", held);
	return 0;
}

/* Each rank's peak resident memory, as the system measures it, against
 * the plan's host bytes: within 1.25 x its buffers + the fixed overhead
 * the plan states (HP_HOST_OVERHEAD_BYTES).  A device run's host holds
 * other things than the plan describes: its peak is only reported. */
static void host_verdict(struct run *r, const struct hp_rank_est *est, FILE *out, int talk)
{
	long long peak = hp_host_peak_bytes(), v[6] = { peak, -1, 0, (long long)r->bk->dev_bytes_peak, -1, 0 };
	double mib = 1.0 / (1 << 20);

	/* rank 0 of hp-verify and validation mode also holds the one-process
	 * reference, its optimizer and its recorded outputs: not the plan's */
	int ref = r->verifying && r->rank == 0;

	if (est) {
		v[1] = ref ? 0 : est->host_bytes;
		v[2] = !r->bk->device && !ref && peak >= 0 &&
		       (double)peak > 1.25 * (double)(est->host_bytes - est->host_overhead_bytes) +
				      (double)est->host_overhead_bytes;
	}
	if (v[2])
		hp_warn("host memory: rank %d's peak resident set is %.1f MiB, beyond 1.25 x the plan's %.1f MiB "
			"of buffers + %.1f MiB", r->rank, peak * mib, (double)(est->host_bytes -
			est->host_overhead_bytes) * mib, (double)est->host_overhead_bytes * mib);
	/* the device: the backend's count against the plan's device bytes,
	 * within 2% (the plan follows the backend's own sizing rules; what
	 * is left is the granule a GPU maps in, if not HP_CUDA_GRANULE) */
	if (est && r->bk->device && !ref && est->device_bytes) {
		double d = (double)r->bk->dev_bytes_peak / (double)est->device_bytes;

		v[4] = est->device_bytes;
		if ((v[5] = d < 0.98 || d > 1.02))
			hp_warn("device memory: rank %d's peak is %.1f MiB, the plan's %.1f MiB (%.1f%% off)", r->rank,
				(double)r->bk->dev_bytes_peak * mib, (double)est->device_bytes * mib, 100 * (d - 1));
	}
	if (ref)
		v[0] = v[3] = -1;   /* the largest peaks of the ranks that are held to the plan */
	if (r->dist)
		hp_comm_allreduce_raw(MPI_COMM_WORLD, v, 6, MPI_LONG_LONG, MPI_MAX);
	if (!talk || v[0] < 0)
		return;
	if (r->bk->device && v[4] > 0 && !v[5])
		fprintf(out, "host memory: peak resident %.1f MiB on the largest rank (the plan's host bytes "
			"describe a CPU run); device memory: peak %.1f MiB on the largest rank, the plan's %.1f MiB: "
			"every rank%s within 2%%\n", v[0] * mib, v[3] * mib, v[4] * mib, ref ? " but 0" : "");
	else if (r->bk->device)
		fprintf(out, "host memory: peak resident %.1f MiB on the largest rank (the plan's host bytes "
			"describe a CPU run); device memory: %.1f MiB at most on the largest rank, as the backend "
			"counts it\n", v[0] * mib, v[3] * mib);
	else if (!v[2])
		fprintf(out, "host memory: peak resident %.1f MiB on the largest rank%s, the plan's host bytes "
			"%.1f MiB: every rank%s within 1.25 x its buffers + %.0f MiB%s\n", v[0] * mib,
			ref ? " but 0" : "", v[1] * mib, ref ? " but 0" : "", (double)HP_HOST_OVERHEAD_BYTES * mib,
			ref ? " (rank 0 also holds the one-process reference)" : "");
}

/* HP_CUDA_PROFILE=1: the step's time per kernel family, added up */
static int kernel_times(struct run *r, struct hp_err *e)
{
	double ms[HP_KF_N];
	int rc = r->bk->kernel_times(r->bk, ms, e);

	for (int f = 0; !rc && f < HP_KF_N; f++)
		r->kernel_ms[f] += ms[f];
	r->profiled += !rc;
	return rc;
}

/* ... and its line: rank 0's shares of its compute stream's time */
static void report_kernels(struct run *r, FILE *out)
{
	double all = 0;

	for (int f = 0; f < HP_KF_N; f++)
		all += r->kernel_ms[f];
	if (all <= 0)
		return;
	fprintf(out, "kernel time: rank 0's compute stream, %ld steps, %.1f ms a step (HP_CUDA_PROFILE):", r->profiled,
		all / r->profiled);
	for (int f = 0; f < HP_KF_N; f++)
		if (r->kernel_ms[f] > 0)
			fprintf(out, " %s %.1f%%", hp_kfam_name(f), 100 * r->kernel_ms[f] / all);
	fputc('\n', out);
}

/* After the last step: the activations' bytes against the plan's
 * estimate, the process's memory, and over ranks each rank's traffic and
 * memory against it. */
static void report_end(struct run *r, FILE *out, int talk)
{
	struct hp_model *m = &r->model;
	const struct hp_rank_est *pe = r->est;

	if (r->bk->device) {
		/* the device's arena is its own layout (flash attention on every
		 * layer, the index arrays' device copies): not the plan's, the CPU's */
		long long v = (long long)m->a.aarena.cap;

		if (r->dist)
			hp_comm_allreduce_raw(MPI_COMM_WORLD, &v, 1, MPI_LONG_LONG, MPI_MAX);
		if (talk)
			fprintf(out, "activations: %lld bytes on the largest rank's device (the plan estimates the "
				"CPU's arena)\n", v);
	} else {
		/* activations: each rank's arena against the plan's estimate for it */
		long long v[3] = { (long long)((m->a.aarena.used + 63) & ~(size_t)63), pe ? pe->act_bytes : -1, 0 };
		int nck = 0;

		v[2] = v[0] != v[1];
		if (r->dist)
			hp_comm_allreduce_raw(MPI_COMM_WORLD, v, 3, MPI_LONG_LONG, MPI_MAX);
		for (int l = 0; l < r->spec.n_layers; l++)
			nck += m->k.ckpt[l] != HP_ACT_CKPT_OFF;
		if (talk)
			fprintf(out, "activations: %lld bytes on the largest rank, %s the plan's estimate on every "
				"rank; activation_checkpoint %s on %d of %d layers\n", v[0], v[2] ? "not" : "as",
				hp_act_ckpt_name(r->plan->act_ckpt), nck, r->spec.n_layers);
	}
	host_verdict(r, pe, out, talk);
	if (talk && r->profiled)
		report_kernels(r, out);
	if (!r->dist)
		return;
	/* did every rank move exactly what the plan estimates? */
	int bad = r->comm_bad, any = bad;

	hp_comm_allreduce_raw(MPI_COMM_WORLD, &any, 1, MPI_INT, MPI_MAX);
	if (bad)
		hp_warn("collectives differ from the plan's estimate: %s", r->comm_why);
	else if (!any && talk)
		fprintf(out, "comm: every rank's bytes per collective and mesh dim equal the plan's estimate\n");
	/* what each rank keeps between steps: weights, gradient sums and the
	 * two AdamW moments of its shards, against the one-process run's */
	long long mine[2] = { (long long)r->fsdp.total * 16, 0 }, most[2] = { 0, 0 };
	long long one = (long long)hp_model_spec_nparams(&r->spec) * 16;

	if (pe)
		mine[1] = pe->param_bytes + pe->grad_bytes + pe->optim_bytes;
	memcpy(most, mine, sizeof(most));
	hp_comm_allreduce_raw(MPI_COMM_WORLD, most, 2, MPI_LONG_LONG, MPI_MAX);
	long g[2] = { r->fsdp.gathers, r->fsdp.prefetched };
	hp_comm_allreduce_raw(MPI_COMM_WORLD, g, 2, MPI_LONG, MPI_SUM);
	if (talk && g[0])
		fprintf(out, "fsdp: %ld layer all-gathers over all ranks, %ld of them started a layer or more "
			"ahead (prefetch depth %ld forward, %ld backward)\n", g[0], g[1],
			r->plan->forward_prefetch, r->plan->backward_prefetch);
	if (talk)
		fprintf(out, "memory: weights, gradients and AdamW moments %lld bytes on the largest rank "
			"(the plan estimated %lld), %lld in one process: %.4f of it over %d ranks "
			"(1/%d = %.4f)\n", most[0], most[1], one, (double)most[0] / (double)one, r->world,
			r->world, 1.0 / r->world);
}

static int train_loop(struct run *r, const struct hp_train_opts *o, FILE *out, struct hp_err *e)
{
	struct hp_config *c = &r->cfg;
	struct hp_model *m = &r->model;
	long B = c->training.micro_batch_size, T = hp_config_seq_length(c);
	long accum = c->training.global_batch_size / B;
	long step_tokens = accum * B * T;
	int rc, talk = !o->quiet && r->rank == 0;
	long log_every = c->training.logging_steps > 0 ? c->training.logging_steps : 1;

	/* hp_plan_resolve has checked that a step's ids fit (lib/base/checked.h) */
	size_t ids = (size_t)step_tokens * sizeof(int32_t);
	int want_seg = r->online || r->docs.reset;

	r->inputs = hp_malloc(ids);
	r->labels = hp_malloc(ids);
	r->seg = want_seg ? hp_malloc(ids) : NULL;
	if (!r->inputs || !r->labels || (want_seg && !r->seg))
		return hp_err_set(e, HP_ENOMEM, "out of memory for %ld tokens per step", step_tokens);
	/* what a stage that reads nothing holds: no token, no target */
	for (long i = 0; i < step_tokens; i++) {
		r->inputs[i] = 0;
		r->labels[i] = HP_IGNORE_INDEX;
	}
	if (talk)
		print_table(out, r, accum);
	long iters = o->max_steps > 0 && o->max_steps < c->training.train_iters ? o->max_steps :
		     c->training.train_iters;

	for (long step = r->first_step; step <= iters; step++) {
		double t0 = now_s(), total = 0, norm, st[HP_ST_N];
		struct step_report rep = { .step = step, .iters = iters, .tokens = step_tokens };
		long syncs0 = r->bk->host_syncs, launches0 = r->bk->kernel_launches;

		r->read_tokens = 0;
		if ((rc = read_step(r, step, accum, e)))
			return rc;
		rep.lr = hp_lr_at(&r->opt, step);
		double w0 = hp_comm_waited(), p0 = hp_comm_waited_in(HP_COLL_P2P);
		hp_comms_reset(&r->comms);
		if ((rc = step_grads(r, step, o, &total, e)) || (rc = step_update(r, rep.lr, e)))
			return rc;
		/* the step's sums come to the host: a device's step is done (and
		 * its errors known) when they do, its one wait of the step */
		if ((rc = hp_model_stats(m, st, e)))
			return hp_err_prefix(e, "step %ld", step);
		if (r->bk->profile && (rc = kernel_times(r, e)))
			return hp_err_prefix(e, "step %ld", step);
		norm = sqrt(st[HP_ST_GRAD_SQ]);
		rep.loss = total > 0 ? st[HP_ST_LOSS] / total : 0.0;
		if (m->n_moe && m->spec.output_router_logits)
			rep.loss += m->spec.router_aux_loss_coef * st[HP_ST_AUX] / accum;
		/* a non-finite step was not applied (hp_clip_gate): the weights,
		 * and the checkpoints on disk, stay those of the last good step */
		if (c->debug.check_nan_inf && (!isfinite(rep.loss) || !isfinite(norm))) {
			char b0[32], b1[32];

			return hp_err_set(e, HP_ENUM, "step %ld: the loss is %s and the gradient norm %s: stopped "
					  "before its update, the last checkpoint is the last good one "
					  "(debug.check_nan_inf: false trains on)", step, num(b0, rep.loss), num(b1, norm));
		}
		/* DeepSeek's correction bias moves once the step is known good */
		if (r->bias_at) {
			if ((rc = bias_update(r, r->loads, e)))
				return hp_err_prefix(e, "step %ld", step);
			rep.loads = r->loads;
		}
		rep.dt = now_s() - t0;
		rep.norm = norm;
		rep.aux = st[HP_ST_AUX] / accum;
		rep.waited = hp_comm_waited() - w0;
		/* a pipeline's waits for the neighbouring stages, every rank's (a
		 * gather: with metrics only) */
		if (o->metrics && r->plan->pp > 1) {
			double mine = hp_comm_waited_in(HP_COLL_P2P) - p0;
			MPI_Request req;

			MPI_Igather(&mine, 1, MPI_DOUBLE, r->pp_wait, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD, &req);
			hp_comm_wait_op(&req, MPI_COMM_WORLD, HP_COMM_OP_GATHER);
			rep.pp_wait = r->pp_wait;
		}
		rep.syncs = r->bk->host_syncs - syncs0;
		rep.launches = r->bk->kernel_launches - launches0;
		/* for the metrics only: a collective and a read of /proc a step */
		if (o->metrics)
			mem_peaks(r, &rep);
		report_step(r, out, talk, log_every, &rep);
		if ((rc = evaluate_due(r, out, talk, step, iters, e)) || (rc = save_due(r, o, out, talk, step, iters, e)))
			return rc;
		if (r->metrics)
			fprintf(r->metrics, "}\n");
	}
	if (o->dump_params && (rc = dump_tensors(r, o->dump_params, 0, e)))
		return rc;
	if (o->verify) {
		int bad = r->verify.first[0] != 0;

		if (r->rank == 0)
			hp_verify_print(&r->verify, out, o->verify_json);
		hp_comm_bcast_raw(MPI_COMM_WORLD, &bad, 1, MPI_INT, 0);
		if (bad)
			return hp_err_set(e, HP_ENUM, "the parallel run differs from one process: %s",
					  r->rank == 0 ? r->verify.first : "see rank 0's table");
	}
	if (r->online && talk) {
		struct hp_online_stats st;

		hp_online_stats(r->online, &st);
		if (r->conv_indexed || conversations(&r->cfg))
			fprintf(out, "data: %llu conversations served cut to seq_length + 1 tokens, %llu without a "
				"target token left out\n", (unsigned long long)st.truncated,
				(unsigned long long)st.no_target);
	}
	report_end(r, out, talk);
	return 0;
}

static int is_regular(const char *path)
{
	struct stat st;

	return !stat(path, &st) && S_ISREG(st.st_mode);
}

/* Whether this run writes checkpoints (hp-verify checks a layout, it
 * trains none). */
static int saves(const struct run *r, const struct hp_train_opts *o)
{
	return r->cfg.checkpoint.save_ckpt && !o->verify;
}

/*
 * What the run writes, made sure of before any work, so that a bad path
 * fails in a second instead of after the training: the metrics file
 * opened, the places of the gradient and parameter dumps probed, the
 * checkpoint folder made, writable and locked against a second run.  Rank
 * 0 writes them all; every rank learns the outcome.
 */
static int open_outputs(struct run *r, const struct hp_train_opts *o, MPI_Comm comm, struct hp_err *e)
{
	char note[HP_ERR_MSG_MAX] = "";
	int rc = 0, any;

	if (r->rank == 0) {
		if (o->metrics)
			rc = open_metrics(r, o->metrics, e);
		if (!rc && o->dump_grads)
			rc = hp_outfile_probe(o->dump_grads, e);
		if (!rc && o->dump_params)
			rc = hp_outfile_probe(o->dump_params, e);
		if (!rc && saves(r, o))
			rc = hp_ckpt_lock(&r->lock, r->cfg.checkpoint.checkpoint_dir, note, sizeof(note), e);
		if (!rc && note[0])
			hp_warn("%s", note);
	}
	any = rc;
	if (r->world > 1)
		hp_comm_allreduce_raw(comm, &any, 1, MPI_INT, MPI_MIN);   /* codes are negative */
	if (!rc && any)
		rc = hp_err_set(e, any, "rank 0 could not open this run's outputs (see its message)");
	return rc;
}

/* debug.inject_fault: which fault, and whether the layout has what it breaks. */
static int set_fault(struct run *r, struct hp_err *e)
{
	const char *name = r->cfg.debug.inject_fault;
	const struct hp_plan *p = r->plan;
	int f, ok = 1;
	char list[256] = "";

	if (!name)
		return 0;
	for (int i = 1; i < HP_NFAULT; i++)
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i > 1 ? ", " : "",
			 hp_fault_name(i));
	if ((f = hp_fault_parse(name)) < 0)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.debug.inject_fault: unknown fault '%s' (known: %s)",
				  r->cfg.path, name, list);
	switch (f) {
	case HP_FAULT_TP_SKIP_REDUCE: ok = p->tp > 1; break;
	case HP_FAULT_SP_SKIP_GATHER: ok = p->tp > 1 && p->sequence_parallel; break;
	case HP_FAULT_CP_WRONG_OFFSET:
	case HP_FAULT_CP_SKIP_KV_GRAD_REDUCE: ok = p->cp > 1 && p->cp_mode != HP_CP_ULYSSES; break;
	case HP_FAULT_EP_WRONG_ROUTE:
	case HP_FAULT_EP_DROP_TOKEN: ok = p->ep > 1; break;
	case HP_FAULT_FSDP_STALE_SHARD: ok = p->dp_shard > 1; break;
	case HP_FAULT_GRAD_SCALE: ok = p->dp * p->cp > 1; break;
	case HP_FAULT_PP_STALE_ACTIVATION:
	case HP_FAULT_PP_OUT_OF_ORDER: ok = p->pp > 1 && p->accum > 1; break;
	}
	if (!ok || r->world == 1)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.debug.inject_fault: %s breaks a collective this "
				  "layout does not have (see hp-verify(1))", r->cfg.path, name);
	r->model.fault = f;
	return 0;
}

/* Whether path holds a plan (hp-plan's JSON) rather than a YAML config. */
static int is_plan_file(const char *path)
{
	FILE *f = fopen(path, "r");
	int c = EOF;

	if (!f)
		return 0;
	while ((c = getc(f)) != EOF && (c == ' ' || c == '\t' || c == '\n' || c == '\r'))
		;
	fclose(f);
	return c == '{';
}

/* The config and the plan at this world size: from a plan file (its
 * config and model as resolved), or resolved here from a config. */
static int load_plan(struct run *r, const struct hp_train_opts *o, struct hp_err *e)
{
	int rc;

	if (is_plan_file(o->config)) {
		if (o->noverrides)
			return hp_err_set(e, HP_ECONFIG, "'%s': a plan is resolved already; give overrides such as "
					  "'%s' to hp-plan", o->config, o->overrides[0]);
		if ((rc = hp_plan_load(&r->plan, &r->cfg, o->config, e)))
			return rc;
		if (r->plan->world != r->world)
			return hp_err_set(e, HP_ECONFIG, "'%s': the plan is for %d ranks, this job has %d; make "
					  "the plan with hp-plan --world %d or start %d ranks", o->config,
					  r->plan->world, r->world, r->world, r->plan->world);
		r->spec = r->plan->spec;
		return hp_train_check_config(&r->cfg, e);
	}
	if ((rc = hp_config_load(&r->cfg, o->config, o->noverrides, o->overrides, e)) ||
	    (rc = hp_train_check_config(&r->cfg, e)) || (rc = hp_hfconfig_load(&r->spec, r->cfg.model.path, e)))
		return rc;
	if (r->cfg.model.num_hidden_layers > 0) {
		/* HyperParallel's crop: the first N layers of the config */
		if (r->cfg.model.source != HP_MODEL_FROM_CONFIG)
			return hp_err_set(e, HP_ECONFIG, "'%s': $.model.num_hidden_layers: cropping applies to "
					  "from_config models only", r->cfg.path);
		if (r->cfg.model.num_hidden_layers < r->spec.n_layers)
			r->spec.n_layers = r->cfg.model.num_hidden_layers;
	}
	/* the plan's kernel bindings; HP_KERNELS=reference keeps HF's algorithms */
	if ((rc = hp_plan_resolve(&r->plan, &r->cfg, &r->spec, r->world, e)))
		return rc;
	for (int i = 0; i < r->plan->nwarnings; i++)
		hp_warn("%s", r->plan->warnings[i]);
	return 0;
}

/* This rank's part of the layout: its kernels, its communicators (one
 * process: every dim of size 1, no MPI communicator made, every
 * collective a no-op), its coordinates. */
static int join_layout(struct run *r, MPI_Comm comm, struct hp_err *e)
{
	int rc;

	hp_plan_model_kernels(r->plan, &r->kernels);
	if (r->reference) {   /* HF's algorithms; checkpointing is not a kernel */
		struct hp_model_kernels ref = { .ce_chunk = 0 };

		memcpy(ref.ckpt, r->kernels.ckpt, sizeof(ref.ckpt));
		r->kernels = ref;
	}
	if ((rc = hp_comms_init(&r->comms, comm, r->plan->size, e)))
		return rc;
	if (r->world == 1)
		return 0;
	r->dist = 1;
	hp_plan_model_par(r->plan, r->rank, &r->par);
	r->par.sharded = 1;
	r->par.cs = &r->comms;
	r->stage = r->par.pp_rank;
	if (r->plan->pp > 1) {
		int G = (int)r->plan->accum;

		/* a step's actions, then evaluation's forwards */
		if (!(r->pp_act = hp_calloc(3 * (size_t)G * r->plan->vpp + 1, sizeof(*r->pp_act))) ||
		    !(r->pp_wait = hp_calloc((size_t)r->world, sizeof(double))))
			return hp_err_set(e, HP_ENOMEM, "out of memory");
		r->pp_nact = hp_pp_actions(r->plan->pp_schedule, (int)r->plan->pp, r->plan->vpp, r->stage, G,
					   r->pp_act);
		r->pp_nfwd = hp_pp_forwards((int)r->plan->pp, r->plan->vpp, G, r->pp_act + r->pp_nact);
	}
	return 0;
}

/* The weights: over ranks straight into the shards, each rank reading its
 * pieces; in one process into the model, then to its device. */
static int load_weights(struct run *r, const struct hp_train_opts *o, MPI_Comm comm, struct hp_err *e)
{
	int rc;

	if (r->dist) {
		struct hp_src src;

		memset(&src, 0, sizeof(src));
		if ((rc = hp_fsdp_init(&r->fsdp, r->plan, &r->comms, &r->model, e)))
			return rc;
		rc = o->shards ? hp_src_open_shards_part(&src, r->plan, o->shards, r->rank, r->world, NULL, e) :
		     r->cfg.model.source == HP_MODEL_FROM_CONFIG ? hp_src_open_init(&src, r->plan, e) :
		     hp_src_open_hf(&src, r->plan, r->cfg.model.path, e);
		if (!rc)
			rc = hp_fsdp_load(&r->fsdp, &src, e);
		hp_src_close(&src);
		/* every rank must have its weights before any goes on */
		int any = rc != 0;
		hp_comm_allreduce_raw(comm, &any, 1, MPI_INT, MPI_MAX);
		if (rc)
			return rc;
		if (any)
			return hp_err_set(e, HP_EFORMAT, "another rank could not load its shard (see its message)");
		return 0;
	}
	if (o->shards)
		return hp_err_set(e, HP_ECONFIG, "--shards: a one-process run reads the model folder; shard "
				  "directories are for runs over ranks");
	if (r->cfg.model.source == HP_MODEL_FROM_CONFIG) {
		/* HF's _init_weights: normal(0, initializer_range) matrices, ones for
		 * norms (zeros for zero-centred ones), zero biases, the Gated
		 * DeltaNet's dt_bias and A_log; each tensor from (seed, name) alone */
		for (int i = 0; i < r->model.w.nparams; i++) {
			struct hp_param *p = &r->model.w.params[i];
			hp_init_tensor(p->w, &r->spec, (uint64_t)r->cfg.training.seed, p->name, p->numel,
				       (float)r->spec.initializer_range);
		}
		/* nn.Embedding(padding_idx=pad_token_id) starts that row at zero */
		if (r->spec.pad_token_id >= 0 && r->spec.pad_token_id < r->spec.vocab)
			hp_init_zero_row_slice(r->model.w.embed, 0, (size_t)r->spec.vocab * r->spec.hidden,
					       r->spec.pad_token_id, r->spec.hidden);
	} else if ((rc = hp_model_load_hf(&r->model, r->cfg.model.path, e))) {
		return rc;
	}
	return hp_model_upload(&r->model, e);
}

/* Over ranks, from now on the shards are the weights: the model's buffers
 * hold only what is gathered, the optimizer steps the shards, and the
 * layers come and go through FSDP's hook; validation mode and hp-verify
 * hold every module to rank 0's whole model. */
static int start_fsdp(struct run *r, const struct hp_train_opts *o, MPI_Comm comm, struct hp_err *e)
{
	struct hp_store shards;
	int rc;

	for (int u = 0; u < r->fsdp.nunits; u++) {
		hp_fsdp_release(&r->fsdp, u, 0);
		hp_fsdp_release(&r->fsdp, u, 1);
	}
	if ((rc = hp_fsdp_store(&r->fsdp, &shards, e)))
		return rc;
	hp_optim_use(&r->opt, &shards);
	r->model.hook = hp_fsdp_hook;
	r->model.hook_ctx = &r->fsdp;
	if (r->model.fault == HP_FAULT_FSDP_STALE_SHARD)
		r->fsdp.stale_unit = r->fsdp.layer_unit[0];
	if (o->verify || r->cfg.model.validate_placement) {
		/* rank 0 takes the whole model alongside, its weights
		 * assembled from the shards */
		if ((rc = hp_verify_init(&r->verify, r->plan, &r->fsdp, &r->model, r->reference ? NULL : &r->kernels,
					 &r->cfg, comm, &r->comms, e)))
			return rc;
		r->verifying = 1;
		r->verify.stop = !o->verify;
		r->verify.placement = 1;
		if (o->rtol > 0)
			r->verify.rtol = o->rtol;
		if (o->atol > 0)
			r->verify.atol = o->atol;
		if (o->prtol > 0)
			r->verify.prtol = o->prtol;
		r->model.probe = hp_verify_probe;
		r->model.probe_ctx = &r->verify;
	}
	/* a rank that dies is named by the survivors (lib/comm/comm.c) */
	return hp_comms_watch_peers(&r->comms, e);
}

static void run_free(struct run *r)
{
	hp_free(r->pp_act);
	hp_free(r->pp_wait);
	hp_free(r->loads);
	hp_free(r->bias_at);
	if (r->stale)
		r->bk->free(r->bk, r->stale);
	close_metrics(r, 0, NULL);
	hp_ckpt_unlock(&r->lock);
	hp_free(r->inputs);
	hp_free(r->labels);
	hp_free(r->seg);
	hp_batcher_free(r->data);
	hp_online_free(r->online);
	for (int p = 0; p < 3; p++) {
		hp_batcher_free(r->edata[p]);
		hp_online_free(r->eonline[p]);
	}
	hp_optim_release(&r->opt);
	if (r->verifying)
		hp_verify_free(&r->verify);
	hp_fsdp_free(&r->fsdp);
	hp_model_release(&r->model);
	hp_backend_close(r->bk);
	hp_comms_free(&r->comms);
	hp_plan_free(r->plan);
	hp_config_release(&r->cfg);
}

/* A layout whose device bytes (the plan's, this rank's) exceed what its
 * GPU has free (a share of it where ranks share one) is refused before
 * anything is allocated, on every rank alike. */
static int check_device_memory(struct run *r, MPI_Comm comm, struct hp_err *e)
{
	int shared = r->gpu_share;
	double gib = 1.0 / (1 << 30), have = (double)r->bk->dev_free / (shared > 1 ? shared : 1);
	int bad = 0;

	if (r->bk->device && r->est && (double)r->est->device_bytes > have) {
		bad = 1;
		hp_err_set(e, HP_ECONFIG, "'%s': rank %d needs %.2f GiB of device memory (hp-plan's device_bytes), "
			   "%s has %.2f GiB free%s: shard further (fsdp_config.dp_shard_size, tp_size, ep_size) or "
			   "checkpoint activations", r->cfg.path, r->rank, (double)r->est->device_bytes * gib, r->bk->name,
			   have * gib, shared > 1 ? " for each of the ranks that share it" : "");
	}
	if (r->dist)
		hp_comm_allreduce_raw(comm, &bad, 1, MPI_INT, MPI_MAX);
	if (bad && !e->code)
		return hp_err_set(e, HP_ECONFIG, "another rank's layout needs more device memory than its GPU has "
				  "(see its message)");
	return bad ? e->code : 0;
}

int hp_train_run(const struct hp_train_opts *o, MPI_Comm comm, FILE *out, struct hp_err *e)
{
	struct run r;
	int rc;

	memset(&r, 0, sizeof(r));
	MPI_Comm_size(comm, &r.world);
	MPI_Comm_rank(comm, &r.rank);
	r.reference = !strcmp(hp_cpu_ops_get()->name, "reference");
	if ((rc = load_plan(&r, o, e)))
		goto out;
	/* before any collective: a rank that waits longer ends the job */
	hp_comm_set_timeout(r.cfg.training.collective_timeout_s);
	if ((rc = open_outputs(&r, o, comm, e)) || (rc = join_layout(&r, comm, e)) ||
	    (rc = pick_device(&r, comm, e)) || (rc = hp_train_check_layout(&r.cfg, r.plan, r.bk, e)))
		goto out;
	/* device collectives: NCCL or host-staged, decided by every rank alike */
	r.est = hp_plan_estimate(r.plan, r.rank, &r.est_buf) ? NULL : &r.est_buf;
	if ((rc = check_device_memory(&r, comm, e)) || (r.dist && (rc = r.bk->attach(r.bk, &r.comms, e))))
		goto out;
	if ((rc = hp_model_init_par(&r.model, r.bk, &r.spec, &r.kernels, r.dist ? &r.par : NULL,
				    (int)r.cfg.training.micro_batch_size, (int)hp_config_seq_length(&r.cfg), e)) ||
	    (rc = set_fault(&r, e)) || (rc = check_bias_update(&r, o, e)))
		goto out;
	if (o->verify && !r.dist) {
		rc = hp_err_set(e, HP_ECONFIG, "hp-verify holds a layout over ranks to one process; run it "
				"under mpiexec -n N with the plan's world size");
		goto out;
	}
	if ((rc = load_weights(&r, o, comm, e)) || (rc = open_data(&r, e)) ||
	    (rc = hp_optim_init(&r.opt, &r.model, &r.cfg, !r.dist, e)))
		goto out;
	r.first_step = 1;
	if (r.cfg.checkpoint.restore_from && (rc = restore_ckpt(&r, o->quiet ? NULL : out, e)))
		goto out;
	if (r.dist && (rc = start_fsdp(&r, o, comm, e)))
		goto out;
	rc = train_loop(&r, o, out, e);
	{
		int rc2 = close_metrics(&r, rc == 0, e);
		if (!rc)
			rc = rc2;
	}
	if (rc && r.dumped && is_regular(o->dump_grads))
		unlink(o->dump_grads);   /* a failed run leaves no output behind (a stream keeps what it got) */
out:
	run_free(&r);
	return rc;
}
