/*
 * test-config.c - hp_config_load against the configs hp ships (t/config/),
 * its defaults, every kind of error message word for word, overrides,
 * relative paths, the printed table, and every allocation failing in turn.
 *
 * Most cases load YAML text through hp_config_load_buf() under the name
 * "train.yaml", so the expected messages read exactly as a user sees them;
 * the file cases run in a scratch directory that is removed at the end.
 * Fixtures are found through HP_SRC_DIR (the source tree, "." by default).
 */
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "config/config.h"
#include "../tap.h"

static char src_dir[PATH_MAX];
static char scratch[PATH_MAX];

/* The smallest config that loads: the two required sections. */
#define BASE "model:\n" \
	"  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained\n" \
	"  pretrained_model_name_or_path: /m\n" \
	"training: {train_iters: 3}\n"

static int load(struct hp_config *c, const char *yaml, int nov, char **ov, struct hp_err *e)
{
	hp_err_clear(e);
	return hp_config_load_buf(c, "train.yaml", yaml, strlen(yaml), nov, ov, e);
}

/* One error case: the code and the whole message. */
static void expect_err(const char *yaml, int nov, char **ov, int code, const char *msg,
		       const char *title)
{
	struct hp_config c;
	struct hp_err e;
	int rc = load(&c, yaml, nov, ov, &e);

	if (rc != code)
		tap_diag("  rc %d, want %d (%s)", rc, code, e.msg);
	is_str(rc == code ? e.msg : "(wrong code)", msg, "%s", title);
	hp_config_release(&c);
}

/* A float in the YAML is read by strtod, which rounds the decimal
 * correctly, as the compiler does the literal: "1.0e-3" and 1e-3 are the
 * same number, so the same double, exactly. */
static int same_double(double got, double want)
{
	return got == want;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f || fputs(text, f) < 0 || fclose(f)) {
		tap_diag("cannot write %s: %s", path, strerror(errno));
		exit(1);
	}
}

static void fixture(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/t/config/%s", src_dir, name);
}

static void test_stories260K(void)
{
	struct hp_config c;
	struct hp_err e;
	char path[PATH_MAX + 64];
	const char *tail = "data/stories260K/hf";
	int rc;

	fixture(path, sizeof(path), "stories260K.yaml");
	rc = hp_config_load(&c, path, 0, NULL, &e);
	if (!is_int(rc, 0, "stories260K.yaml loads")) {
		tap_diag("  %s", e.msg);
		return;
	}
	is_int(c.model.source, HP_MODEL_FROM_PRETRAINED, "from_pretrained");
	ok(strlen(c.model.path) > strlen(tail) &&
	   !strcmp(c.model.path + strlen(c.model.path) - strlen(tail), tail),
	   "model path ends in %s (%s)", tail, c.model.path);
	is_str(c.model.torch_dtype, "float32", "torch_dtype");
	is_int(c.training.train_iters, 10, "train_iters");
	is_int(c.training.global_batch_size, 4, "global_batch_size");
	is_int(c.training.micro_batch_size, 4, "micro_batch_size");
	ok(c.training.max_grad_norm == 1.0, "max_grad_norm");
	is_int(c.training.seed, 1234, "seed");
	is_int(c.dataset.kind, HP_DATASET_INDEXED, "indexed dataset");
	is_int(c.dataset.ndata_path, 1, "one data prefix");
	is_int(c.dataset.seq_length, 128, "seq_length");
	is_int(c.dataset.is_dataset_from_mr, 1, "is_dataset_from_mr");
	is_str(c.dataloader.target, "hyper_parallel.data.FixedBatchDataLoader", "dataloader");
	is_str(c.dataloader.sampler_type, "single", "sampler_type");
	is_int(c.dataloader.drop_last, 1, "drop_last");
	ok(same_double(c.optimizer.lr, 1e-3) && same_double(c.optimizer.weight_decay, 0.1) &&
	   same_double(c.optimizer.beta1, 0.9) && same_double(c.optimizer.beta2, 0.95) &&
	   same_double(c.optimizer.eps, 1e-8), "adamw_config");
	ok(c.optimizer.nno_decay_params == 2 && !strcmp(c.optimizer.no_decay_params[0], "bias") &&
	   !strcmp(c.optimizer.no_decay_params[1], "norm"), "no_decay_params");
	is_int(c.lr_scheduler.style, HP_LR_COSINE, "cosine schedule");
	ok(same_double(c.lr_scheduler.lr, 1e-3) && c.lr_scheduler.warmup_steps == 2 &&
	   same_double(c.lr_scheduler.min_lr, 1e-4), "lr_config");
	is_int(c.debug.check_nan_inf, 1, "check_nan_inf");
	hp_config_release(&c);
}

static void test_seed(void)
{
	struct hp_config c;
	struct hp_err e;
	char path[PATH_MAX + 64];
	int rc;

	fixture(path, sizeof(path), "seed-8rank.yaml");
	rc = hp_config_load(&c, path, 0, NULL, &e);
	if (!is_int(rc, 0, "seed-8rank.yaml loads")) {
		tap_diag("  %s", e.msg);
		return;
	}
	ok(c.accelerator.tp_size == 2 && c.accelerator.cp_size == 2 &&
	   c.accelerator.ep_size == 2 && c.accelerator.pp_size == 1 &&
	   c.accelerator.sequence_parallel, "accelerator TP2 x CP2 x EP2, sequence parallel");
	ok(c.fsdp.dp_shard_size == 2 && c.fsdp.edp_shard_size == 2 &&
	   c.fsdp.reshard_after_forward && c.fsdp.reshard_after_backward &&
	   c.fsdp.forward_prefetch_depth == 1 && c.fsdp.backward_prefetch_depth == 1,
	   "fsdp_config");
	if (is_int(c.noverrides, 3, "three plan overrides")) {
		struct hp_plan_override *o = c.overrides;

		ok(o[0].nmatch == 3 && !strcmp(o[0].match[0], "*.input_layernorm") &&
		   !strcmp(o[0].match[2], "model.norm"), "a list of globs");
		ok(o[1].nmatch == 1 && !strcmp(o[1].match[0], "*.self_attn"),
		   "one glob as a string");
		is_str(o[1].module_type,
		       "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeAttention",
		       "module_type");
		is_str(o[2].replace_target,
		       "hyper_parallel.models.qwen3_moe.adapter.replacements."
		       "replace_qwen3_moe_grouped_experts",
		       "replace_module._target_");
		ok(!o[0].when && !o[0].local_compute_fn_target && o[0].region_dispatch == -1,
		   "unset plan keys");
	}
	is_int(c.dataset.kind, HP_DATASET_ONLINE, "online dataset");
	ok(c.dataset.ndata_path == 2 && !strcmp(c.dataset.data_path[1], "/data/b.jsonl"),
	   "data_path list");
	is_str(c.dataset.tokenizer_path, "/models/Qwen3-30B-A3B", "tokenizer path");
	ok(c.dataset.ntext_keys == 1 && c.dataset.max_seq_len == 4096 && c.dataset.shuffle,
	   "data_transform and data_config");
	is_str(c.dataloader.target, "hyper_parallel.data.DynamicBatchDataLoader", "dynamic loader");
	ok(same_double(c.optimizer.lr, 3e-4) && same_double(c.optimizer.eps, 1e-8), "1e-4 style floats");
	ok(c.lr_scheduler.style == HP_LR_LINEAR && same_double(c.lr_scheduler.lr, 3e-4) &&
	   same_double(c.lr_scheduler.min_lr, 3e-5), "lr_config.lr absent: the optimizer's");
	ok(!strcmp(c.checkpoint.checkpoint_dir, "/ckpt/qwen3") && c.checkpoint.save_steps == 50 &&
	   !strcmp(c.checkpoint.save_consolidated, "final"), "checkpoint");
	is_str(hp_act_ckpt_name(c.activation_checkpoint.mode), "full", "activation checkpointing");
	hp_config_release(&c);
}

static void test_defaults(void)
{
	struct hp_config c;
	struct hp_err e;

	if (!is_int(load(&c, BASE, 0, NULL, &e), 0, "the two required sections load")) {
		tap_diag("  %s", e.msg);
		return;
	}
	ok(c.training.global_batch_size == 8 && c.training.micro_batch_size == 1 &&
	   c.training.max_grad_norm == 1.0 && c.training.seed == 42 &&
	   c.training.logging_steps == 1 && !c.training.enable_full_determinism &&
	   c.training.loss_aggregation == HP_LOSS_TOKEN_WEIGHTED && !c.training.init_device,
	   "training defaults");
	ok(c.accelerator.tp_size == 1 && c.accelerator.cp_size == 1 && c.accelerator.ep_size == 1 &&
	   c.accelerator.pp_size == 1 && !c.accelerator.sequence_parallel, "accelerator defaults");
	ok(c.fsdp.dp_shard_size == 1 && c.fsdp.reshard_after_forward &&
	   c.fsdp.forward_prefetch_depth == 1 && !c.fsdp.nreplicate_params && !c.fsdp.param_dtype,
	   "fsdp defaults");
	ok(!c.noverrides && !c.overrides, "no plan overrides");
	is_int(c.dataset.kind, HP_DATASET_NONE, "no dataset section: kind none");
	ok(!strcmp(c.dataset.split, "98,1,1") && !c.dataset.data_path, "dataset defaults");
	is_str(c.model.torch_dtype, "auto", "torch_dtype auto");
	ok(c.optimizer.lr == 1e-4 && c.optimizer.weight_decay == 0.01 &&
	   c.optimizer.beta1 == 0.9 && c.optimizer.beta2 == 0.999 && c.optimizer.eps == 1e-8 &&
	   c.optimizer.fp32_main_params, "adamw defaults");
	ok(c.optimizer.nno_decay_params == 3 && !strcmp(c.optimizer.no_decay_params[2], "ln_"),
	   "no_decay_params default [bias, norm, ln_]");
	ok(c.lr_scheduler.style == HP_LR_CONSTANT && c.lr_scheduler.lr == 1e-4 && c.optimizer.lr == 1e-4 &&
	   c.lr_scheduler.warmup_steps == 0, "constant schedule at the optimizer's lr");
	ok(c.checkpoint.save_ckpt && !strcmp(c.checkpoint.checkpoint_dir, "./checkpoints") &&
	   !c.checkpoint.save_steps && !c.checkpoint.restore_from &&
	   !strcmp(c.checkpoint.save_consolidated, "none"), "checkpoint defaults");
	is_str(hp_act_ckpt_name(c.activation_checkpoint.mode), "off", "activation checkpointing off");
	ok(!strcmp(c.dataloader.sampler_type, "cyclic") && c.dataloader.drop_last,
	   "dataloader defaults");
	hp_config_release(&c);
	ok(!c.path && !c.model.path && !c.optimizer.no_decay_params, "release zeroes");
	hp_config_release(&c);
	ok(1, "release twice is harmless");
}

static void test_scalars(void)
{
	struct hp_config c;
	struct hp_err e;
	const char *yaml =
		"model: {_target_: HyperAutoModelForCausalLM.from_config, config_path: cfg}\n"
		"training:\n"
		"  train_iters: 0x10\n"
		"  seed: -7\n"
		"  max_grad_norm: .5\n"
		"  init_device: ~\n"
		"optimizer: {adamw_config: {adamw_lr: 1e-4, adamw_eps: 1, adamw_betas: [0, 0]}}\n"
		"dataloader: {drop_last: no}\n"
		"debug: {check_nan_inf: on, inject_fault: \"null\"}\n"
		"activation_checkpoint: {mode: off}\n"
		"lr_scheduler: null\n"
		"dataset:\n"
		"profiling: {enable: false, anything: [goes, {here: 1}]}\n";

	if (!is_int(load(&c, yaml, 0, NULL, &e), 0, "YAML 1.1 scalars load")) {
		tap_diag("  %s", e.msg);
		return;
	}
	ok(c.model.source == HP_MODEL_FROM_CONFIG && !strcmp(c.model.path, "cfg"),
	   "from_config with config_path");
	is_int(c.training.train_iters, 16, "hex int");
	is_int(c.training.seed, -7, "negative int");
	ok(c.training.max_grad_norm == 0.5, ".5");
	ok(c.optimizer.lr == 1e-4, "1e-4 is a float");
	ok(c.optimizer.eps == 1.0 && c.optimizer.beta1 == 0.0, "ints where floats go");
	is_int(c.dataloader.drop_last, 0, "no is false");
	is_int(c.debug.check_nan_inf, 1, "on is true");
	is_str(c.debug.inject_fault ? c.debug.inject_fault : "(null)", "null",
	       "a quoted null stays a string");
	is_str(hp_act_ckpt_name(c.activation_checkpoint.mode), "off", "mode: off is the value off");
	is_int(c.lr_scheduler.style, HP_LR_CONSTANT, "lr_scheduler: null is constant");
	is_int(c.dataset.kind, HP_DATASET_NONE, "an empty dataset section is none");
	hp_config_release(&c);

	if (is_int(load(&c, "model: {_target_: transformers.AutoModelForCausalLM.from_pretrained,"
			" pretrained_model_name_or_path: p}\ntraining: {train_iters: 1}\n",
			0, NULL, &e), 0, "AutoModelForCausalLM.from_pretrained"))
		is_int(c.model.source, HP_MODEL_FROM_PRETRAINED, "  is from_pretrained");
	hp_config_release(&c);
}

static void test_errors(void)
{
	char *ov[2];

	expect_err(BASE "accelerator: {tp_sise: 2}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.accelerator.tp_sise: unknown key; did you mean tp_size",
		   "unknown key with a suggestion");
	expect_err(BASE "accelerator: {pipeline: 2}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.accelerator.pipeline: unknown key",
		   "unknown key without one");
	expect_err(BASE "trainig: {}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.trainig: unknown key; did you mean training",
		   "unknown root key");
	expect_err("model: {_target_: HyperAutoModelForCausalLM.from_pretrained,"
		   " pretrained_model_name_or_path: p}\ntraining: {train_iters: ten}\n",
		   0, NULL, HP_ECONFIG,
		   "'train.yaml': $.training.train_iters: expected int, got str",
		   "wrong type");
	expect_err(BASE "accelerator: {tp_size: \"2\"}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.accelerator.tp_size: expected int, got str",
		   "a quoted number is a string");
	expect_err(BASE "accelerator: {tp_size: 2.0}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.accelerator.tp_size: expected int, got float",
		   "no float where an int goes");
	expect_err(BASE "accelerator: {tp_size: 0}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.accelerator.tp_size: must be at least 1, got 0",
		   "below the minimum");
	expect_err(BASE "optimizer: {adamw_config: {adamw_eps: .NaN}}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.optimizer.adamw_config.adamw_eps: .NaN is not a finite number", "no .nan");
	expect_err(BASE "optimizer: {adamw_config: {adamw_lr: -1.0e-3}}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.optimizer.adamw_config.adamw_lr: must be at least 0, got -1.0e-3",
		   "a negative lr is refused, not taken as unset");
	expect_err(BASE "optimizer: {adamw_config: {adamw_betas: [0.9, 1]}}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.optimizer.adamw_config.adamw_betas[1]: must be in [0, 1), got 1",
		   "betas in [0, 1), as torch");
	expect_err(BASE "optimizer: {adamw_config: {adamw_weight_decay: -1}}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.optimizer.adamw_config.adamw_weight_decay: must be at least 0, got -1",
		   "weight decay at least 0, as torch");
	expect_err(BASE "lr_scheduler: {lr_config: {min_lr: -1.0e-5}}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.lr_scheduler.lr_config.min_lr: must be at least 0, got -1.0e-5",
		   "min_lr at least 0");
	expect_err(BASE "lr_scheduler: {lr_decay_style: cosine, lr_config: {lr: 1.0e-4, min_lr: 1.0e-3}}\n",
		   0, NULL, HP_ECONFIG, "'train.yaml': $.lr_scheduler.lr_config.min_lr: 1.0e-3 is above the "
		   "peak rate 0.0001: the cosine decay would raise the rate", "min_lr at most the peak");
	expect_err(BASE "optimizer: {adamw_config: {adamw_lr: 1.0e-3}}\n"
		   "lr_scheduler: {lr_config: {lr: 2.0e-3}}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.optimizer.adamw_config.adamw_lr: 1.0e-3, but lr_scheduler.lr_config.lr is "
		   "2.0e-3: both name the learning rate; give one (or the same)",
		   "two learning rates in the file are refused");
	expect_err(BASE "optimizer: {no_decay_params: [bias, 3]}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.optimizer.no_decay_params[1]: expected str, got int",
		   "list items are typed");
	expect_err("model: {_target_: HyperAutoModelForCausalLM.from_pretrained,"
		   " pretrained_model_name_or_path: p}\ntraining: {seed: 1}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.training.train_iters: missing required key",
		   "missing required key");
	expect_err("training: {train_iters: 1}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.model: missing required key", "missing section");
	expect_err("model: {_target_: HyperAutoModelForCausalLM.from_pretrained}\n"
		   "training: {train_iters: 1}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.model.pretrained_model_name_or_path: missing required key",
		   "from_pretrained needs a path");
	expect_err(BASE "dataset: {_target_: hyper_parallel.data.build_indexed_text_dataset,"
		   " data_path: d}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.dataset.data_config.seq_length: missing required key",
		   "an indexed dataset needs seq_length");
	expect_err(BASE "dataset: {_target_: foo.Bar}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.dataset._target_: unknown 'foo.Bar'; known: "
		   "...build_indexed_text_dataset, ...build_online_text_dataset, "
		   "...build_online_text_mapping_dataset", "unknown _target_");
	expect_err(BASE "optimizer: {_target_: torch.optim.SGD}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.optimizer._target_: unknown 'torch.optim.SGD'; known: ...AdamW",
		   "unknown optimizer");
	expect_err(BASE "optimizer: {_target_: hyper_parallel.NotAdamW}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.optimizer._target_: unknown 'hyper_parallel.NotAdamW'; "
		   "known: ...AdamW", "a _target_ matches whole dotted names");
	expect_err(BASE "lr_scheduler: {lr_decay_style: cosin}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $.lr_scheduler.lr_decay_style: unknown value 'cosin'; "
		   "expected one of constant, linear, cosine", "unknown enum value");
	expect_err(BASE "plan_overrides:\n  - {match: a}\n  - {match: b, replace_module: {}}\n",
		   0, NULL, HP_ECONFIG,
		   "'train.yaml': $.plan_overrides[1].replace_module._target_: "
		   "missing required key",
		   "plan override paths have indices");
	expect_err("model:\n  _target_: x\n  torch_dtype\ntraining: {}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml' line 3: yaml parse error: could not find expected ':' "
		   "while scanning a simple key", "yaml syntax error names the line");
	expect_err(BASE "accelerator: {tp_size: [1, 2}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml' line 5: yaml parse error: did not find expected ',' or ']' "
		   "while parsing a flow sequence", "unclosed flow sequence");
	expect_err(BASE "debug: &d {check_nan_inf: true}\nprofiling: *d\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml' line 6: yaml aliases are not supported (*d)", "aliases refused");
	expect_err(BASE "training: {train_iters: 4}\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml' line 5: duplicate key 'training'", "duplicate key");
	expect_err("- 1\n- 2\n", 0, NULL, HP_ECONFIG,
		   "'train.yaml': $: expected mapping, got list", "the root is a mapping");

	ov[0] = "--training.max_grad_norm=.inf";
	expect_err(BASE, 1, ov, HP_ECONFIG,
		   "--training.max_grad_norm=.inf: $.training.max_grad_norm: .inf is not a finite number", "no .inf");
	{
		/* the command line's rate beats the file's, under either name */
		struct hp_config c;
		struct hp_err e;
		const char *two = BASE "optimizer: {adamw_config: {adamw_lr: 1.0e-3}}\n"
				  "lr_scheduler: {lr_config: {lr: 1.0e-3}}\n";

		ov[0] = "--optimizer.adamw_config.adamw_lr=3e-4";
		if (is_int(load(&c, two, 1, ov, &e), 0, "an overridden adamw_lr loads"))
			ok(c.optimizer.lr == 3e-4 && c.lr_scheduler.lr == 3e-4, "  and is the rate under both names");
		hp_config_release(&c);
		ov[0] = "--lr_scheduler.lr_config.lr=2e-4";
		if (is_int(load(&c, two, 1, ov, &e), 0, "an overridden lr_config.lr loads"))
			ok(c.optimizer.lr == 2e-4 && c.lr_scheduler.lr == 2e-4, "  and is the rate under both names");
		hp_config_release(&c);
	}
	ov[0] = "--training.train_iter=5";
	expect_err(BASE, 1, ov, HP_ECONFIG,
		   "--training.train_iter=5: unknown key training.train_iter; "
		   "did you mean train_iters",
		   "override of an unknown key");
	ov[0] = "--model._target_=foo.Bar";
	expect_err(BASE, 1, ov, HP_ECONFIG,
		   "--model._target_=foo.Bar: _target_ cannot be overridden",
		   "override of _target_");
	ov[0] = "--dataset={_target_: x}";
	expect_err(BASE, 1, ov, HP_ECONFIG,
		   "--dataset={_target_: x}: _target_ cannot be overridden",
		   "no _target_ inside an override value either");
	ov[0] = "--accelerator.tp_size=two";
	expect_err(BASE, 1, ov, HP_ECONFIG,
		   "--accelerator.tp_size=two: $.accelerator.tp_size: expected int, got str",
		   "override type error");
	ov[0] = "--optimizer.no_decay_params=[a, 1]";
	expect_err(BASE, 1, ov, HP_ECONFIG,
		   "--optimizer.no_decay_params=[a, 1]: $.optimizer.no_decay_params[1]: "
		   "expected str, got int", "override list item type error");
	ov[0] = "--accelerator.tp_size=[1,";
	expect_err(BASE, 1, ov, HP_ECONFIG,
		   "--accelerator.tp_size=[1,: yaml parse error: did not find expected node "
		   "content while parsing a flow node", "override yaml error");
	ov[0] = "--accelerator";
	expect_err(BASE, 1, ov, HP_ECONFIG,
		   "--accelerator: expected --key.path=value", "override without a value");
	ov[0] = "--training.seed.low=1";
	expect_err(BASE, 1, ov, HP_ECONFIG,
		   "--training.seed.low=1: unknown key training.seed.low",
		   "no keys below a scalar");
	ov[0] = "--accelerator.tp_size=2";
	expect_err(BASE "accelerator: 3\n", 1, ov, HP_ECONFIG,
		   "--accelerator.tp_size=2: $.accelerator: expected mapping, got int",
		   "no override below a scalar of the file");
	ov[0] = "--training.seed=1";
	ov[1] = "--accelerator.pp_vpp=2";
	expect_err(BASE, 2, ov, HP_ECONFIG,
		   "--accelerator.pp_vpp=2: $.accelerator.pp_vpp: 2 virtual stages per rank: interleaving "
		   "needs pp_size 2 or more", "the second override is named");
}

static void test_overrides(void)
{
	struct hp_config c;
	struct hp_err e;
	char *ov[] = {
		"--accelerator.tp_size=2",
		"optimizer.adamw_config.adamw_lr=1",
		"--optimizer.adamw_config.adamw_betas=[0.8, 0.9]",
		"--debug.check_nan_inf=yes",
		"--dataset.data_path=[a, b]",
		"--training.seed=7",
		"--training.seed=8",
		"--lr_scheduler.lr_decay_style=linear",
		"--model.torch_dtype=bfloat16",
		"--profiling.steps.first=3",
		"--profiling.enable=false",
	};
	const char *yaml = BASE
		"dataset: {_target_: build_online_text_dataset, data_path: x}\n"
		"debug: {check_nan_inf: false}\n"
		"lr_scheduler: null\n";
	int n = (int)(sizeof(ov) / sizeof(ov[0]));

	if (!is_int(load(&c, yaml, n, ov, &e), 0, "overrides apply")) {
		tap_diag("  %s", e.msg);
		return;
	}
	is_int(c.accelerator.tp_size, 2, "int override creates its section");
	ok(c.optimizer.lr == 1.0, "float override given as an int");
	ok(c.optimizer.beta1 == 0.8 && c.optimizer.beta2 == 0.9, "pair override");
	is_int(c.debug.check_nan_inf, 1, "bool override");
	ok(c.dataset.ndata_path == 2 && !strcmp(c.dataset.data_path[0], "a") &&
	   !strcmp(c.dataset.data_path[1], "b"), "list override replaces a string");
	is_int(c.training.seed, 8, "the later override wins");
	is_int(c.lr_scheduler.style, HP_LR_LINEAR, "override into a null section");
	is_str(c.model.torch_dtype, "bfloat16", "string override");
	hp_config_release(&c);

	ov[0] = "--lr_scheduler=null";
	if (is_int(load(&c, BASE "lr_scheduler: {lr_decay_style: cosine}\n", 1, ov, &e), 0,
		   "--lr_scheduler=null"))
		is_int(c.lr_scheduler.style, HP_LR_CONSTANT, "  gives a constant schedule");
	hp_config_release(&c);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

static void test_paths(void)
{
	struct hp_config c;
	struct hp_err e;
	char cwd[PATH_MAX];
	char *ov[] = { "--dataset.model_assets.tokenizer.pretrained_model_name_or_path=tok" };
	int rc;

	if (!getcwd(cwd, sizeof(cwd)) || chdir(scratch)) {
		tap_skip("no scratch directory", "relative paths");
		return;
	}
	mkdir("sub", 0777);
	mkdir("sub/model", 0777);
	mkdir("here", 0777);
	write_file("sub/tokens.bin", "");
	write_file("sub/c.yaml",
		   "model:\n"
		   "  _target_: HyperAutoModelForCausalLM.from_pretrained\n"
		   "  pretrained_model_name_or_path: model\n"
		   "training: {train_iters: 1}\n"
		   "dataset:\n"
		   "  _target_: build_indexed_text_dataset\n"
		   "  data_path: [tokens, here, ./nowhere, /abs/x]\n"
		   "  data_config: {seq_length: 8}\n"
		   "checkpoint: {checkpoint_dir: ckpt}\n");
	rc = hp_config_load(&c, "sub/c.yaml", 1, ov, &e);
	if (is_int(rc, 0, "config in a subdirectory loads")) {
		is_str(c.model.path, "sub/model",
		       "a path missing here is taken from the yaml's directory");
		is_str(c.dataset.data_path[0], "sub/tokens", "a prefix exists when its .bin does");
		is_str(c.dataset.data_path[1], "here", "a path that exists here is kept");
		is_str(c.dataset.data_path[2], "sub/nowhere", "./ is dropped when joining");
		is_str(c.dataset.data_path[3], "/abs/x", "absolute paths are kept");
		is_str(c.checkpoint.checkpoint_dir, "sub/ckpt", "checkpoint_dir too");
		is_str(c.dataset.tokenizer_path, "tok", "a path from an override is kept");
	} else {
		tap_diag("  %s", e.msg);
	}
	hp_config_release(&c);

	rc = hp_config_load(&c, "sub/missing.yaml", 0, NULL, &e);
	is_int(rc, HP_EIO, "missing file is an i/o error");
	is_str(e.msg, "'sub/missing.yaml': cannot open: No such file or directory",
	       "  with its message");
	if (chdir(cwd))
		tap_diag("cannot return to %s", cwd);
}

static void test_print(void)
{
	struct hp_config c;
	struct hp_err e;
	char *buf = NULL, *line;
	size_t size = 0;
	FILE *f;
	int col = -1, aligned = 1, rows = 0;
	char path[PATH_MAX + 64];

	fixture(path, sizeof(path), "seed-8rank.yaml");
	if (hp_config_load(&c, path, 0, NULL, &e) || !(f = open_memstream(&buf, &size))) {
		tap_skip("no config", "print");
		return;
	}
	hp_config_print(&c, f);
	fclose(f);
	ok(strstr(buf, "\ntraining.train_iters ") != NULL, "rows are dotted keys");
	ok(strstr(buf, " 0.0003\n") && strstr(buf, "\noptimizer.lr "), "floats read back exactly");
	ok(strstr(buf, "\nplan_overrides[2].replace_target ") != NULL, "plan overrides are rows");
	ok(strstr(buf, "\nmodel.path ") && strstr(buf, "\ndataset.kind ") &&
	   strstr(buf, "\ncheckpoint.keep_last "), "derived and hp-only fields");
	for (line = buf; *line; rows++) {
		char *end = strchr(line, '\n'), *sp = strstr(line, "  ");
		int at;

		if (!end || !sp)
			break;
		at = (int)(sp - line);
		while (line[at] == ' ')
			at++;
		if (col < 0)
			col = at;
		aligned &= at == col;
		line = end + 1;
	}
	ok(aligned && rows > 100, "%d rows, values aligned at column %d", rows, col);
	free(buf);
	hp_config_release(&c);
}

/*
 * The printed table without the rows that depend on where the file is:
 * the file itself and the paths resolved against its directory.
 */
static char *table(const struct hp_config *c)
{
	static const char *const skip[] = { "config ", "model.path ", "dataset.data_path ", NULL };
	char *buf = NULL, *out, *line, *end;
	size_t size = 0, n = 0;
	FILE *f = open_memstream(&buf, &size);

	if (!f)
		return NULL;
	hp_config_print(c, f);
	fclose(f);
	out = calloc(1, size + 1);
	for (line = buf; out && *line; line = end) {
		int keep = 1;

		end = strchr(line, '\n');
		end = end ? end + 1 : line + strlen(line);
		for (int i = 0; skip[i]; i++)
			keep &= strncmp(line, skip[i], strlen(skip[i])) != 0;
		if (keep) {
			memcpy(out + n, line, (size_t)(end - line));
			n += (size_t)(end - line);
		}
	}
	free(buf);
	return out;
}

/*
 * The manual is a test: the first example of man/hp-config.5 must load, with
 * the overrides of the second, and mean what t/config/stories260K.yaml means.
 */
static void test_man_example(void)
{
	char path[PATH_MAX + 64], *text = NULL, *yaml, *ov[8], *p, *q;
	size_t size = 0, n = 0;
	struct hp_config c, ref;
	struct hp_err e;
	int nov = 0, in = 0, block = 0, rc;
	FILE *f;

	snprintf(path, sizeof(path), "%s/man/hp-config.5", src_dir);
	if (!(f = fopen(path, "r"))) {
		tap_skip("no man page", "man page example");
		return;
	}
	yaml = calloc(1, 1 << 16);
	while (yaml && getline(&text, &size, f) > 0) {
		if (!strncmp(text, ".EX", 3)) {
			in = 1;
			block++;
			continue;
		}
		if (!strncmp(text, ".EE", 3)) {
			in = 0;
			continue;
		}
		if (!in)
			continue;
		/* undo the roff escapes the page uses: \- and \e */
		for (p = text, q = text; *p; p++) {
			if (p[0] == '\\' && (p[1] == '-' || p[1] == 'e'))
				*q++ = *++p == 'e' ? '\\' : '-';
			else
				*q++ = *p;
		}
		*q = '\0';
		if (block == 1 && n + strlen(text) < (1 << 16)) {
			memcpy(yaml + n, text, strlen(text) + 1);
			n += strlen(text);
		}
		/* the hp-train line: every word that starts with -- */
		p = block == 2 ? strstr(text, "--") : NULL;
		for (; p && nov < 8; p = strstr(p, " --")) {
			p += *p == ' ';
			ov[nov++] = strndup(p, strcspn(p, " \\\n"));
			p++;
		}
	}
	fclose(f);
	free(text);
	fixture(path, sizeof(path), "stories260K.yaml");
	rc = yaml ? load(&c, yaml, nov, ov, &e) : -1;
	if (is_int(rc, 0, "the man page's example loads with its %d overrides", nov))
		ok(nov == 3 && c.training.train_iters == 50 && c.optimizer.lr == 3e-4 &&
		   !c.debug.check_nan_inf, "  the overrides apply");
	else
		tap_diag("  %s", e.msg);
	hp_config_release(&c);
	if (!yaml || load(&c, yaml, 0, NULL, &e) || hp_config_load(&ref, path, 0, NULL, &e)) {
		ok(0, "the example is the fixture: %s", e.msg);
	} else {
		char *t1 = table(&c), *t2 = table(&ref);

		is_str(t1 ? t1 : "", t2 ? t2 : "-", "the example is the fixture");
		free(t1);
		free(t2);
		hp_config_release(&ref);
	}
	hp_config_release(&c);
	for (int i = 0; i < nov; i++)
		free(ov[i]);
	free(yaml);
}

/*
 * Fail every allocation of a full load in turn, until one succeeds: each
 * failure must be reported as out of memory and leave nothing behind (LSan
 * checks the leaks at exit).
 */
static void test_alloc_failures(void)
{
	char *ov[] = { "--training.train_iters=7", "--dataset.data_path=[a, b]",
		       "--lr_scheduler=null", "--accelerator.cp_size=2" };
	const char *names[] = { "seed-8rank.yaml", "stories260K.yaml" };

	for (int i = 0; i < 2; i++) {
		struct hp_config c;
		struct hp_err e;
		char path[PATH_MAX + 64];
		int rc = -1, bad = 0, nconfig = 0;
		long k;

		fixture(path, sizeof(path), names[i]);
		for (k = 1; k < 100000; k++) {
			hp_alloc_fail_at(k);
			rc = hp_config_load(&c, path, 4, ov, &e);
			if (!rc)
				break;
			if ((rc != HP_ENOMEM && rc != HP_ECONFIG) || c.path) {
				if (!bad++)
					tap_diag("  allocation %ld: rc %d: %s", k, rc, e.msg);
			} else if (rc == HP_ECONFIG && !nconfig++) {
				tap_diag("  allocation %ld: config error, not out of memory: %s", k,
					 e.msg);
			}
		}
		hp_alloc_fail_at(0);
		ok(!rc && !bad && c.training.train_iters == 7 && c.dataset.ndata_path == 2,
		   "%s: %ld allocations, each failure clean", names[i], k - 1);
		is_int(nconfig, 0, "  and each one reported as out of memory");
		hp_config_release(&c);
	}
}

int main(void)
{
	const char *s = getenv("HP_SRC_DIR");
	const char *tmp = getenv("TMPDIR");

	snprintf(src_dir, sizeof(src_dir), "%s", s && *s ? s : ".");
	if (src_dir[0] != '/') {
		char cwd[PATH_MAX / 2];

		if (getcwd(cwd, sizeof(cwd)))
			snprintf(src_dir, sizeof(src_dir), "%s/%s", cwd, s && *s ? s : ".");
	}
	snprintf(scratch, sizeof(scratch), "%s/hp-test-config.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(scratch))
		scratch[0] = '\0';

	test_stories260K();
	test_seed();
	test_defaults();
	test_scalars();
	test_errors();
	test_overrides();
	test_paths();
	test_print();
	test_man_example();
	test_alloc_failures();

	if (scratch[0])
		nftw(scratch, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	return tap_done();
}
