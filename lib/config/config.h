/*
 * config.h - the training config (HyperParallel's YAML schema), typed.
 *
 * hp_config_load() reads a YAML file, applies "--a.b=c" overrides (each
 * value parsed as a YAML scalar or flow collection, then type-checked), checks
 * every key against the schema (unknown keys, wrong types and missing
 * required keys are HP_ECONFIG errors naming the path, e.g.
 *   "'train.yaml': $.accelerator.tp_sise: unknown key; did you mean tp_size"
 *   "'train.yaml': $.training.train_iters: expected int, got str"),
 * fills defaults, and writes a struct hp_config.  A key hp does not act on
 * is refused by name where it is read (hp-config(5)), never ignored.
 *
 * Ownership: every string in struct hp_config is owned by the config and
 * freed by hp_config_release().  Paths are stored as written, except that
 * relative paths are resolved against the directory of the YAML file
 * (HyperParallel resolves them against the working directory; we do the same
 * when the path exists there, else against the YAML's directory).
 */
#ifndef HP_CONFIG_H
#define HP_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/err.h"

enum hp_model_source {
	HP_MODEL_FROM_PRETRAINED = 0,   /* ...HyperAutoModelForCausalLM.from_pretrained */
	HP_MODEL_FROM_CONFIG,           /* ...HyperAutoModelForCausalLM.from_config */
};

enum hp_dataset_kind {
	HP_DATASET_NONE = 0,
	HP_DATASET_INDEXED,             /* ...build_indexed_text_dataset (offline) */
	HP_DATASET_ONLINE,              /* ...build_online_text_dataset */
	HP_DATASET_ONLINE_MAPPING,      /* ...build_online_text_mapping_dataset */
};

enum hp_loss_tokens {
	HP_LOSS_TOKENS_ASSISTANT = 0,   /* conversations: the assistant's replies */
	HP_LOSS_TOKENS_ALL,             /* every token */
};

enum hp_lr_style {
	HP_LR_CONSTANT = 0,
	HP_LR_LINEAR,
	HP_LR_COSINE,
};

enum hp_loss_agg {
	HP_LOSS_TOKEN_WEIGHTED = 0,
	HP_LOSS_RANK_AVERAGE,
};

/* training.device: where the step runs (hp-config(5)) */
enum hp_device {
	HP_DEVICE_CPU = 0,
	HP_DEVICE_CUDA,
	HP_DEVICE_AUTO,   /* cuda when the build has it and a GPU is visible, else cpu */
};

struct hp_plan_override {
	char **match;            /* globs ("*" crosses dots), nmatch of them */
	int nmatch;
	char *when;              /* "cp", "ep" or NULL */
	char *module_type;       /* HF class path or NULL */
	char *exact_type;
	char *replace_target;    /* replace_module._target_ or NULL */
	char *local_compute_fn_target;
	char *inner_target;
	char *inner_wrapper_target;
	int region_dispatch;     /* -1 unset, else 0/1 */
};

/* accelerator.pp_vpp: chunks of layers per pipeline stage, at most */
#define HP_MAX_VPP 8

/* accelerator.pp_schedule */
enum hp_pp_schedule { HP_PP_1F1B = 0, HP_PP_GPIPE };

struct hp_config {
	char *path;                      /* the YAML file as given */

	struct {
		enum hp_model_source source;
		char *target;                /* _target_ as written */
		char *path;                  /* pretrained_model_name_or_path or config_path */
		char *torch_dtype;           /* "auto" (default), "float32", "bfloat16", "float16" */
		int num_hidden_layers;       /* 0: as in config.json */
		int validate_placement;      /* bool, default 0 */
		int force_hf, local_files_only;
		char *attn_implementation;   /* accepted, ignored */
	} model;

	struct {
		long train_iters;            /* required */
		long global_batch_size;      /* 8 */
		long micro_batch_size;       /* 1 */
		double max_grad_norm;        /* 1.0; 0 = off */
		long seed;                   /* 42 */
		int enable_full_determinism; /* 0 */
		long logging_steps;          /* 1 */
		long eval_iters;             /* 0: global batches per evaluation (0 = none) */
		long eval_steps;             /* 0: evaluate every N steps (0 = after the last) */
		enum hp_loss_agg loss_aggregation;
		char *init_device;           /* NULL */
		enum hp_device device;       /* cpu */
		char *loss_fn;               /* loss_fn._target_: ...ChunkedCausalLMLoss or NULL */
		long loss_chunk_size;        /* loss_fn.chunk_size: tokens per chunk (1024) */
		double collective_timeout_s; /* 600; 0 = wait forever */
		double moe_router_bias_update_rate;   /* 0: off; DeepSeek's correction bias moves by it a step */
	} training;

	struct {
		long tp_size, cp_size, ep_size, pp_size;   /* 1 */
		int sequence_parallel, loss_parallel;      /* 0 */
		int pp_schedule;                           /* enum hp_pp_schedule (1f1b) */
		long pp_vpp;                               /* virtual stages per rank (1, at most HP_MAX_VPP) */
		int *pp_layer_split, npp_layer_split;      /* layers per stage (none: even) */
		long pp_micro_batch_num;                   /* 0: not given */
	} accelerator;

	struct {
		long dp_shard_size, edp_shard_size;        /* 1 */
		int reshard_after_forward, reshard_after_backward;   /* 1 */
		int requires_grad_sync;      /* 1; 0: reduce only after the step's last micro-batch */
		long forward_prefetch_depth, backward_prefetch_depth; /* 1 */
		char *param_dtype, *reduce_dtype, *output_dtype;    /* mix_precision; NULL */
		char **replicate_params; int nreplicate_params;
		int enable_offload;
	} fsdp;

	struct hp_plan_override *overrides;
	int noverrides;

	struct {
		enum hp_dataset_kind kind;
		char *target;
		char **data_path; int ndata_path;   /* offline: one prefix; online: files/dirs */
		char **valid_data_path; int nvalid_data_path;   /* hp's own: the validation data */
		char *tokenizer_path;               /* model_assets.tokenizer.pretrained_model_name_or_path */
		char *data_type;                    /* data_transform.data_type: plaintext|conversation */
		char **text_keys; int ntext_keys;   /* conversation: the messages ("messages") */
		long max_seq_len;
		char *chat_template;                /* model_assets.chat_template: "auto" */
		char *role_key, *content_key;       /* data_transform: "role", "content" */
		int loss_tokens;                    /* hp's own: HP_LOSS_TOKENS_* */
		long seq_length;                    /* data_config.seq_length (required for offline) */
		char *split;                        /* "98,1,1"; "100,0,0" with valid_data_path */
		int is_dataset_from_mr;             /* 0 */
		int labels_are_shifted;             /* 0 */
		int eod_mask_loss, reset_position_ids, reset_attention_mask, shuffle;
		int create_attention_mask_in_dataloader;
		long eod_token_id;                  /* model_assets.tokenizer.eod_token_id: -1 unset */
		int skip_invalid_lines;             /* hp extension, online mode: 0 */
	} dataset;

	struct {
		char *target;                       /* FixedBatchDataLoader (default) | DynamicBatchDataLoader */
		char *sampler_type;                 /* cyclic (wraps) | single (one pass) */
		int drop_last;                      /* 1 */
	} dataloader;

	struct {
		char *target;
		double lr;                          /* adamw_config.adamw_lr, else lr_config.lr, else 1e-4 */
		double weight_decay;                /* 0.01 */
		double beta1, beta2;                /* 0.9, 0.999 */
		double eps;                         /* 1e-8 */
		char **no_decay_params; int nno_decay_params;   /* default {bias, norm, ln_} */
		int fp32_main_params;               /* 1 */
	} optimizer;

	struct {
		enum hp_lr_style style;             /* lr_decay_style; null section = constant */
		double lr;                          /* lr_config.lr: always optimizer.lr (both given must agree) */
		long warmup_steps;                  /* 0 */
		double min_lr;                      /* 0 */
	} lr_scheduler;

	struct {
		int save_ckpt;                      /* 1 */
		char *checkpoint_dir;               /* ./checkpoints */
		long save_steps;                    /* 0 */
		char *restore_from;                 /* NULL | path | LATEST */
		int save_optimizer, save_train_state;  /* 1 */
		char *save_consolidated;            /* none | final | every */
		long keep_last;                     /* 0 = keep all */
	} checkpoint;

	struct {
		int mode;                           /* enum hp_act_ckpt (model.h): off */
		long layer_count;                   /* selection: the first n layers; 0 unset */
		int *layer_indices, nlayer_indices; /* selection: these layers */
	} activation_checkpoint;

	struct {
		int check_nan_inf;                  /* 1 */
		char *inject_fault;                 /* NULL */
	} debug;
};

/*
 * Load path and apply overrides (each "--a.b=c" or "a.b=c").  On error returns
 * HP_ECONFIG (HP_EUNSUP for a HyperParallel section hp has nothing for,
 * switched on; HP_EIO for an unreadable file) with a one-line message that
 * names the file and the key path; c is left released.
 */
int hp_config_load(struct hp_config *c, const char *path,
		   int noverrides, char *const *overrides, struct hp_err *e);

/*
 * The same from YAML text in memory (len bytes of buf; no NUL needed); name
 * stands for the file in messages and relative paths.  For tests and the
 * fuzz target.
 */
/* "off", "full" or "selective": activation_checkpoint.mode's value names */
const char *hp_act_ckpt_name(int mode);

int hp_config_load_buf(struct hp_config *c, const char *name, const char *buf, size_t len,
		       int noverrides, char *const *overrides, struct hp_err *e);

/*
 * The same for a config that hp_config_json() wrote (a plan's "config"):
 * its paths were resolved when it was first loaded and are kept as they are.
 */
int hp_config_load_resolved(struct hp_config *c, const char *name, const char *buf, size_t len,
			    struct hp_err *e);

/*
 * The resolved config as a JSON object in the YAML schema's shape (a new
 * reference; NULL when out of memory): every section hp reads with every
 * key, defaults filled in and paths as resolved, so that
 * hp_config_load_resolved() of its text gives back the same config.
 * profiling, wandb, compile and mixed_precision are left out (hp reads
 * none of their keys), and so are builder keywords of local_compute_fn.
 */
struct json_t;
struct json_t *hp_config_json(const struct hp_config *c);

/* Free everything owned by c (safe on a zeroed or released config). */
void hp_config_release(struct hp_config *c);

/*
 * Print the resolved config as "section.key  value" rows (the table that
 * rank 0 shows at start-up), one per line, to f.
 */
void hp_config_print(const struct hp_config *c, FILE *f);

/* Every key of the schema, one "yaml.path<TAB>type<TAB>values|..." line
 * each (a list of mappings as "path[].key"): what t/t0990 audits. */
void hp_config_schema(FILE *f);

/* Tokens per row: data_config.seq_length, else (online) data_transform.max_seq_len. */
long hp_config_seq_length(const struct hp_config *c);

/* data_config.split: the train, validation and test shares, normalized */
struct hp_split {
	double w[3];
};
enum { HP_SPLIT_TRAIN = 0, HP_SPLIT_VALID, HP_SPLIT_TEST };

/*
 * Parse Megatron's split string: up to three non-negative numbers
 * separated by ',' or '/' ("98,1,1", "949/50/1", "1"), missing ones 0,
 * divided by their sum.  HP_ECONFIG with a message naming the string when
 * it is not that (a fourth number, a negative one, all zero).
 */
int hp_split_parse(struct hp_split *s, const char *str, struct hp_err *e);

#endif
