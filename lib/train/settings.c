/*
 * settings.c - the settings hp-train refuses (see settings.h).
 */
#include <string.h>

#include "train/settings.h"

int hp_train_check_config(const struct hp_config *c, struct hp_err *e)
{
	const char *p = c->path;

	if (c->dataset.kind == HP_DATASET_NONE)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.dataset: missing; training needs data", p);
	if (c->dataset.kind == HP_DATASET_INDEXED && c->dataset.ndata_path != 1)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.dataset.data_path: the indexed dataset takes "
				  "one prefix, got %d", p, c->dataset.ndata_path);
	if (c->dataset.kind == HP_DATASET_INDEXED && c->dataset.nvalid_data_path > 1)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.dataset.valid_data_path: the indexed dataset takes "
				  "one prefix, got %d", p, c->dataset.nvalid_data_path);
	if (c->training.eval_steps > 0 && c->training.eval_iters <= 0)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.training.eval_steps: %ld, but eval_iters is 0: "
				  "nothing to evaluate (set eval_iters, the global batches per evaluation)", p,
				  c->training.eval_steps);
	if (c->dataset.nvalid_data_path && c->training.eval_iters <= 0)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.dataset.valid_data_path: given, but "
				  "training.eval_iters is 0: nothing would read it", p);
	/* settings hp cannot honor: refused, not accepted and ignored */
	if (c->fsdp.nreplicate_params)
		return hp_err_set(e, HP_EUNSUP, "'%s': $.fsdp_config.replicate_params: keeping parameters "
				  "replicated outside FSDP is not implemented yet (every parameter is sharded as "
				  "hp-plan says)", p);
	if (!c->dataloader.drop_last)
		return hp_err_set(e, HP_EUNSUP, "'%s': $.dataloader.drop_last: false is not implemented: every "
				  "batch hp serves is full", p);
	if (!c->optimizer.fp32_main_params)
		return hp_err_set(e, HP_EUNSUP, "'%s': $.optimizer.fp32_main_params: false is not implemented: "
				  "hp keeps float32 main parameters", p);
	if (!c->checkpoint.save_train_state)
		return hp_err_set(e, HP_EUNSUP, "'%s': $.checkpoint.save_train_state: false is not implemented: "
				  "a checkpoint cannot resume without its step and data cursor, so hp always writes "
				  "them", p);
	if (c->dataset.kind != HP_DATASET_INDEXED &&
	    (c->dataset.eod_mask_loss || c->dataset.reset_position_ids || c->dataset.reset_attention_mask ||
	     c->dataset.eod_token_id >= 0))
		return hp_err_set(e, HP_ECONFIG, "'%s': $.dataset.%s: for the indexed dataset; online data packs "
				  "each document apart (block-diagonal, positions from its start) and never predicts "
				  "across documents", p, c->dataset.eod_mask_loss ? "data_config.eod_mask_loss" :
				  c->dataset.reset_position_ids ? "data_config.reset_position_ids" :
				  c->dataset.reset_attention_mask ? "data_config.reset_attention_mask" :
				  "model_assets.tokenizer.eod_token_id");
	if (c->dataset.reset_position_ids != c->dataset.reset_attention_mask)
		return hp_err_set(e, HP_EUNSUP, "'%s': $.dataset.data_config.%s without %s is not implemented: "
				  "hp restarts positions and attention together at each EOD (set both)", p,
				  c->dataset.reset_position_ids ? "reset_position_ids" : "reset_attention_mask",
				  c->dataset.reset_position_ids ? "reset_attention_mask" : "reset_position_ids");
	if (c->dataset.labels_are_shifted)
		return hp_err_set(e, HP_EUNSUP, "'%s': $.dataset.data_config.labels_are_shifted "
				  "is not implemented yet", p);
	if (c->training.micro_batch_size <= 0 || c->training.global_batch_size <= 0 ||
	    c->training.global_batch_size % c->training.micro_batch_size)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.training: global_batch_size %ld must be a "
				  "positive multiple of micro_batch_size %ld", p,
				  c->training.global_batch_size, c->training.micro_batch_size);
	if (c->training.train_iters <= 0)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.training.train_iters: must be positive", p);
	if (hp_config_seq_length(c) <= 0)
		return hp_err_set(e, HP_ECONFIG, "'%s': $.dataset.data_config.seq_length: missing "
				  "(or data_transform.max_seq_len for online data)", p);
	return 0;
}

/*
 * fsdp_config.mix_precision: on a GPU over ranks, FSDP gathers the
 * parameters in param_dtype and reduces the gradients in reduce_dtype
 * (bfloat16 or float32); elsewhere it would change nothing or be ignored,
 * so anything but float32 is refused there.  output_dtype: the modules'
 * outputs are float32 on every backend.  With them, the settings that
 * depend on the device or the layout: the CPU computes in float32, and
 * rank_average is token_weighted on one data-parallel rank.
 */
int hp_train_check_layout(const struct hp_config *c, const struct hp_plan *p, const struct hp_backend *bk,
			  struct hp_err *e)
{
	const char *const mp[3] = { c->fsdp.param_dtype, c->fsdp.reduce_dtype, c->fsdp.output_dtype };
	static const char *const mpk[3] = { "param_dtype", "reduce_dtype", "output_dtype" };

	for (int i = 0; i < 3; i++) {
		if (!mp[i] || !strcmp(mp[i], "float32") || !strcmp(mp[i], "fp32"))
			continue;
		if (!bk->device)
			return hp_err_set(e, HP_EUNSUP, "'%s': $.fsdp_config.mix_precision.%s: %s is not implemented on "
					  "the CPU, which trains in float32 (training.device: cuda gathers and reduces "
					  "in bfloat16 over ranks); set it to float32 or leave it out", c->path, mpk[i],
					  mp[i]);
		if (i == 2)
			return hp_err_set(e, HP_EUNSUP, "'%s': $.fsdp_config.mix_precision.output_dtype: %s is not "
					  "implemented: the modules' outputs are float32 on every backend (bf16 is what "
					  "the tensor cores read); set it to float32 or leave it out", c->path, mp[i]);
		if (strcmp(mp[i], "bfloat16"))
			return hp_err_set(e, HP_EUNSUP, "'%s': $.fsdp_config.mix_precision.%s: %s is not implemented "
					  "(bfloat16 or float32)", c->path, mpk[i], mp[i]);
		if (p->world == 1)
			return hp_err_set(e, HP_EUNSUP, "'%s': $.fsdp_config.mix_precision.%s: %s: one rank has no "
					  "FSDP gathers or reductions for it to apply to (the GPU's GEMMs read bf16 "
					  "operands whatever it says); leave it out", c->path, mpk[i], mp[i]);
	}
	if (!bk->device && c->model.torch_dtype && (!strcmp(c->model.torch_dtype, "bfloat16") ||
						       !strcmp(c->model.torch_dtype, "float16")))
		return hp_err_set(e, HP_EUNSUP, "'%s': $.model.torch_dtype: %s is not implemented on the CPU, "
				  "which trains in float32 (use float32 or auto; training.device: cuda computes in "
				  "bf16)", c->path, c->model.torch_dtype);
	if (c->training.loss_aggregation == HP_LOSS_RANK_AVERAGE && p->dp * p->cp > 1)
		return hp_err_set(e, HP_EUNSUP, "'%s': $.training.loss_aggregation: rank_average over %ld data "
				  "and context parallel ranks is not implemented yet (token_weighted is)", c->path,
				  (long)(p->dp * p->cp));
	return 0;
}
