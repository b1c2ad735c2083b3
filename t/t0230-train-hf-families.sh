#!/bin/sh
test_description='HF folders as transformers 4.57 and 5.24 write them: every family x RoPE type against transformers itself'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

# data/hf/tf4 and tf5: tiny random models that transformers built and saved
# (t/ref/make-hf-goldens.sh), with its float64 loss and gradients and its
# float32 AdamW steps.
HF=$DATA/hf
FAMILIES="llama mistral qwen2 qwen3 qwen3_moe"
ROPES="default linear dynamic yarn llama3"
A=--accelerator
F=--fsdp_config

# The bounds.  Loss 1e-6 relative and gradients 1e-5 relative L2: hp runs in
# float32 against transformers' float64 (whose RoPE table, RMSNorm and
# softmaxes are float32 islands), so both sides carry float32 rounding,
# about 6e-8 per operation, summed over a few hundred terms per element;
# measured worst 1.5e-7 and 4.7e-6.  AdamW losses 1e-5: both in float32,
# five steps of a division that amplifies rounding (measured 1.7e-7).
# inv_freq 1e-6: transformers computes it in float32 (pow, division), hp
# in double rounded once, a few float32 ulps apart.  attention factor
# 1e-12: both in double (math.log).

# rel_close A B TOL: |A - B| <= TOL * |B|
rel_close () {
	awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b;
		if (d <= t * m) exit 0; printf "%s vs %s: relative %g > %g\n", a, b, d / m, t; exit 1 }'
}

# golden_steps DIR [GRAD ADAMW]: DIR's loss within 1e-6, every gradient
# within 1e-5 (or GRAD; left in cmp), its 5 AdamW losses within 1e-5 (or
# ADAMW) of transformers'
golden_steps () {
	hp-test-tool refstep --dump-grads g.safetensors "$1" "$1/reference.json" >s.jsonl &&
	rel_close "$(metric s.jsonl 1 loss)" "$(jq -r .loss.loss_f64 "$1/reference.json")" 1e-6 &&
	hp-test-tool cmpst --max-rel-l2 "${2:-1e-5}" g.safetensors "$1/grads.safetensors" >cmp &&
	! grep -q FAIL cmp &&
	jq -r .loss s.jsonl >ours &&
	jq -r ".adamw.losses_f32[]" "$1/reference.json" >theirs &&
	test $(wc -l <ours) = 5 &&
	paste ours theirs | while read a b; do rel_close "$a" "$b" "${3:-1e-5}" || return 1; done
}

for line in tf4 tf5; do
	for fam in $FAMILIES; do
		for rope in $ROPES; do
			d=$HF/$line/$fam-$rope
			test_expect_success "$line $fam $rope: loss within 1e-6, gradients within 1e-5, 5 AdamW losses within 1e-5 of transformers" '
				golden_steps "$d"
			'
		done
	done
done

# GPT-OSS (sinks, biases, the clamped SwiGLU, stacked experts; default and
# gpt-oss's yarn): the tf5 folders with a swiglu_limit of 0.5 that clamps a
# fifth of the gate and up values, the tf4 ones with 4.57's fixed 7
for line in tf4 tf5; do
	for rope in default yarn; do
		d=$HF/$line/gpt_oss-$rope
		test_expect_success "$line gpt_oss $rope: loss within 1e-6, gradients within 1e-5, 5 AdamW losses within 1e-5 of transformers" '
			golden_steps "$d" && grep -q "self_attn.sinks" cmp && grep -q "experts.3.up_proj.bias" cmp
		'
	done
done

# DeepSeek-V3 (multi-head latent attention with and without q_lora_rank,
# rope_interleave both ways, v_head_dim below and above the query's, YaRN
# with mscale_all_dim; dense layer 0, MoE layers with shared experts and the
# sigmoid group-limited router and its correction bias): both lines
for line in tf4 tf5; do
	for v in default yarn nolora; do
		d=$HF/$line/deepseek_v3-$v
		test_expect_success "$line deepseek_v3 $v: loss within 1e-6, gradients within 1e-5, 5 AdamW losses within 1e-5 of transformers" '
			golden_steps "$d" && grep -q "self_attn.kv_b_proj.weight" cmp &&
			grep -q "mlp.shared_experts.down_proj.weight" cmp && ! grep -q e_score_correction_bias cmp
		'
	done
done

# Qwen3-Next and Qwen3.5 (Gated DeltaNet layers 0 and 2 beside gated full
# attention with partial RoPE, zero-centred norms; qwen3_next: dense layer
# 0, MoE with a gated shared expert; qwen3_5_moe: every layer MoE), and
# rows of 96 across the delta rule's chunk of 64 (qwen3_next-long).
# The bounds are wider than the other families' for what transformers
# computes, not for hp: torch in float32 is 4e-5 (rel L2) from torch in
# float64 on these models' gradients (measured: the delta rule's decays
# and gates feed every later token), and hp is as far (5e-5): so the
# gradients within 1e-4.  Two float32 runs whose first gradients differ by
# that much take AdamW's sign-like first steps apart on the elements with
# smaller gradients, which five steps grow to 9e-4 (measured, torch f32
# against hp): the AdamW losses within 2e-3.
for d in tf4/qwen3_next-default tf4/qwen3_next-yarn tf5/qwen3_next-default tf5/qwen3_next-yarn \
	 tf5/qwen3_next-long tf5/qwen3_5-default tf5/qwen3_5-yarn tf5/qwen3_5_moe-default tf5/qwen3_5_moe-yarn \
	 tf5/qwen3_5_moe-vl; do
	test_expect_success "${d%%/*} ${d#*/}: loss within 1e-6, gradients within 1e-4, 5 AdamW losses within 2e-3 of transformers" '
		golden_steps "$HF/$d" 1e-4 2e-3 && grep -q "linear_attn.A_log" cmp && grep -q "linear_attn.conv1d.weight" cmp
	'
done
test_expect_success 'qwen3_next, qwen3_5: hp-train says what it computes' '
	hf_records rq "$HF/tf5/qwen3_next-default" &&
	write_config qn.yaml "$HF/tf5/qwen3_next-default" rq 32 1 2 1 </dev/null &&
	hp-train qn.yaml >out &&
	grep "^spec.linear_attention  *2 of 4 layers: 2 key heads of 8, 4 value heads of 8, conv 4 (in_proj_qkvz, in_proj_ba)$" out &&
	grep "^spec.gated_attention  *output gate, RoPE on 4 of 16, zero-centred norms$" out &&
	grep "^spec.shared_expert  *intermediate 24, sigmoid gate$" out &&
	grep "^spec.moe_layers  *3 of 4$" out &&
	write_config q5.yaml "$HF/tf5/qwen3_5-default" rq 32 1 2 1 </dev/null &&
	hp-train q5.yaml >out &&
	grep "^spec.linear_attention  *2 of 4 layers: .*(in_proj_qkv, in_proj_z, in_proj_b, in_proj_a)$" out &&
	! grep -q "^spec.shared_expert" out
'
# Qwen3.5-MoE as released: a Qwen3_5MoeForConditionalGeneration folder
# (t/ref/make-vl-golden.py: tf5/qwen3_5_moe-default's language model under
# model.language_model.*, a vision tower under model.visual.*)
test_expect_success 'qwen3_5_moe ForConditionalGeneration: the text model trains as the text folder, bit for bit; the vision tower leaves in the export unchanged' '
	d=$HF/tf5/qwen3_5_moe-vl &&
	hp-test-tool refstep "$d" "$d/reference.json" >vl.jsonl &&
	hp-test-tool refstep "$HF/tf5/qwen3_5_moe-default" "$d/reference.json" >tx.jsonl &&
	cmp vl.jsonl tx.jsonl &&
	hf_records rv "$d" &&
	write_config vl.yaml "$d" rv 32 1 2 1 </dev/null &&
	hp-plan vl.yaml --world 2 --accelerator.ep_size=2 -o vl.json &&
	hp-plan --explain vl.json >ex &&
	grep -q "^  multimodal  *the language model of a Qwen3_5MoeForConditionalGeneration folder" ex &&
	rm -rf vls vlx && hp-convert -q --plan vl.json -o vls "$d" &&
	hp-convert -q --export vls -o vlx &&
	test $(jq "[.weight_map | to_entries[] | select(.key | startswith(\"model.visual.\"))] | length" \
		vlx/model.safetensors.index.json) = 21 &&
	# the second file of the export holds the vision tower alone: cmpst fails on
	# the text tensors it lacks, and the 21 visual ones must be exact
	{ hp-test-tool cmpst --max-abs 0 vlx/model-00002-of-00002.safetensors "$d/model.safetensors" || :; } >cmp &&
	test $(grep -c "^model.visual.* max_abs 0.000e+00 rel_l2 0.000e+00" cmp) = 21 &&
	test "$(jq -S . vlx/config.json)" = "$(jq -S . "$d/config.json")" &&
	hp-train -q vl.yaml --metrics m.jsonl
'

test_expect_success 'qwen3_5_moe ForConditionalGeneration: what it refuses, by name' '
	d=$HF/tf5/qwen3_5_moe-vl &&
	rm -rf vb && mkdir vb && cp "$d/model.safetensors" vb/ && hf_records rv "$d" &&
	write_config vb.yaml "$PWD/vb" rv 32 1 2 1 </dev/null &&
	jq ".tie_word_embeddings = true" "$d/config.json" >vb/config.json &&
	test_must_fail_with 4 hp-train -q vb.yaml 2>err && test_one_line err &&
	grep -q "tie_word_embeddings true and text_config.tie_word_embeddings false differ" err &&
	jq ".text_config.model_type = \"qwen3_moe\"" "$d/config.json" >vb/config.json &&
	test_must_fail_with 4 hp-train -q vb.yaml 2>err && test_one_line err &&
	grep -q "text_config.model_type must be .qwen3_5_moe_text. in a Qwen3_5MoeForConditionalGeneration folder" err &&
	jq "del(.text_config)" "$d/config.json" >vb/config.json &&
	test_must_fail_with 3 hp-train -q vb.yaml 2>err && test_one_line err &&
	grep -q "key .text_config.: expected an object" err &&
	cp "$d/config.json" vb/ && hp-plan vb.yaml --world 1 -o vbp.json && rm -rf vbs vbx &&
	hp-convert -q --plan vbp.json -o vbs vb && rm -rf vb &&
	test_must_fail_with 5 hp-convert -q --export vbs -o vbx 2>err && test_one_line err &&
	grep -q "the vision tower (model.visual.\*) of a Qwen3.5 multimodal folder comes from its source folder" err &&
	test ! -e vbx &&
	mkdir vb && jq ".architectures = [\"Qwen3_5MoeForCausalLM\"]" "$d/config.json" >vb/config.json &&
	cp "$d/model.safetensors" vb/ &&
	test_must_fail_with 4 hp-train -q vb.yaml 2>err && test_one_line err &&
	grep -q "architectures must be ..Qwen3_5MoeForConditionalGeneration.. for model_type .qwen3_5_moe." err &&
	cp "$d/config.json" vb/ &&
	hp-test-tool stdrop "$d/model.safetensors" vb/model.safetensors \
		$(hp-test-tool cmpst "$d/model.safetensors" "$d/model.safetensors" | awk "/^model.visual./ { print \$1 }") &&
	hp-train -q vb.yaml --metrics nv.jsonl &&
	hp-plan vb.yaml --world 1 -o vbp.json && rm -rf vbs vbx && hp-convert -q --plan vbp.json -o vbs vb &&
	test_must_fail_with 4 hp-convert -q --export vbs -o vbx 2>err && test_one_line err &&
	grep -q "no model.visual.\* tensor: a Qwen3.5 multimodal folder holds its vision tower" err && test ! -e vbx
'

# Qwen3.5's released configs carry the multimodal RoPE's mrope_section and
# mrope_interleaved; on text the three position ids are one, and
# transformers computes the same loss with them (4.57960700989 either way,
# checked with 5.24.0): read, no warning, the same bits in hp
# A from_config multimodal model drawn into shards starts its embedding's
# pad_token_id row at zero (nn.Embedding's padding_idx), its name being
# model.language_model.embed_tokens.weight
test_expect_success 'qwen3_5_moe ForConditionalGeneration from_config: the pad row of its shards'\'' embedding is zero' '
	d=$HF/tf5/qwen3_5_moe-vl &&
	rm -rf pv && mkdir pv && cp "$d/model.safetensors" pv/ &&
	jq ".text_config.pad_token_id = 3" "$d/config.json" >pv/config.json &&
	hf_records rp "$d" && write_config pv.yaml "$PWD/pv" rp 32 1 2 1 </dev/null &&
	as_from_config pv.yaml "$PWD/pv/config.json" &&
	hp-plan pv.yaml --world 2 --fsdp_config.dp_shard_size=2 -o pvp.json && rm -rf pvs pvx &&
	hp-convert -q --plan pvp.json -o pvs && hp-convert -q --export pvs -o pvx &&
	hp-test-tool stget pvx/model-00001-of-00002.safetensors model.language_model.embed_tokens.weight >emb &&
	test "$(sed -n "97,128p" emb | sort -u)" = 0 && test "$(sed -n "65,96p" emb | sort -u | wc -l)" -gt 1
'

# Qwen3_5MoeTextConfig has no intermediate_size (every layer is MoE): one
# given is a key hp does not read, and says so, as transformers ignores it
test_expect_success 'qwen3_5_moe_text: an intermediate_size is named as unused, the same bits' '
	d=$HF/tf5/qwen3_5_moe-default &&
	rm -rf im && mkdir im && cp "$d/model.safetensors" im/ &&
	jq ".intermediate_size = 48" "$d/config.json" >im/config.json &&
	hp-test-tool refstep --steps 1 im "$d/reference.json" >a.jsonl &&
	hp-test-tool refstep --steps 1 "$d" "$d/reference.json" >b.jsonl &&
	cmp a.jsonl b.jsonl &&
	hf_records ri "$d" && write_config im.yaml "$PWD/im" ri 32 1 2 1 </dev/null &&
	hp-train im.yaml >out 2>err && grep -q "keys hp does not know.*: intermediate_size$" err &&
	write_config im0.yaml "$d" ri 32 1 2 1 </dev/null &&
	hp-train im0.yaml >out 2>err && ! grep -q "keys hp does not know" err
'

test_expect_success 'qwen3_5: mrope_section and mrope_interleaved leave a text batch as it is' '
	d=$HF/tf5/qwen3_5-default &&
	rm -rf mr && mkdir mr && cp "$d/model.safetensors" mr/ &&
	jq ".rope_parameters.mrope_section = [1, 1, 0] | .rope_parameters.mrope_interleaved = true" "$d/config.json" \
		>mr/config.json &&
	hp-test-tool refstep --steps 2 mr "$d/reference.json" >a.jsonl &&
	hp-test-tool refstep --steps 2 "$d" "$d/reference.json" >b.jsonl &&
	cmp a.jsonl b.jsonl &&
	hf_records rm5 "$d" && write_config mr.yaml "$PWD/mr" rm5 32 1 2 1 </dev/null &&
	hp-train mr.yaml >out 2>err && ! grep -q "keys hp does not know" err &&
	jq ".rope_parameters.bogus = 1" mr/config.json >mr/c && mv mr/c mr/config.json &&
	hp-train mr.yaml >out 2>err && grep -q "keys hp does not know.*rope_parameters.bogus$" err
'

test_expect_success 'qwen3_next: a conv1d of another kernel size is named with the checkpoint'\''s shape (hp-train and hp-convert)' '
	d=$HF/tf5/qwen3_next-default &&
	rm -rf cv && mkdir cv && cp "$d/model.safetensors" cv/ &&
	jq ".linear_conv_kernel_dim = 3" "$d/config.json" >cv/config.json &&
	hf_records rc "$d" &&
	write_config cv.yaml "$PWD/cv" rc 32 1 2 1 </dev/null &&
	test_must_fail_with 4 hp-train -q cv.yaml 2>err && test_one_line err &&
	grep -q "tensor .model.layers.0.linear_attn.conv1d.weight. has shape \[64, 1, 4\], config.json implies \[64, 1, 3\]" err &&
	hp-plan cv.yaml --world 1 -o cvp.json && rm -rf cvs &&
	test_must_fail_with 4 hp-convert -q --plan cvp.json -o cvs cv 2>err && test_one_line err &&
	grep -q "the plan.s model needs \[64, 1, 3\]" err && test ! -e cvs
'

test_expect_success 'qwen3_next, qwen3_5_moe: output_router_logits true adds 0.001 x the load-balancing loss of the MoE layers, as transformers' '
	for d in tf4/qwen3_next-default tf5/qwen3_next-default tf5/qwen3_5_moe-default; do
		rm -rf orl && mkdir orl && cp "$HF/$d/model.safetensors" orl/ &&
		jq ".output_router_logits = true" "$HF/$d/config.json" >orl/config.json &&
		hp-test-tool refstep --steps 1 orl "$HF/$d/reference.json" >a.jsonl &&
		rel_close "$(jq -r .aux a.jsonl)" "$(jq -r .output_router_logits_true.aux_loss_f64 "$HF/$d/reference.json")" 1e-5 &&
		rel_close "$(jq -r .loss a.jsonl)" "$(jq -r .output_router_logits_true.loss_f64 "$HF/$d/reference.json")" 1e-6 ||
		{ echo "in $d"; return 1; }
	done
'
test_expect_success 'deepseek_v3: the correction bias is loaded (a folder without it is refused by name), and hp-train says what it computes' '
	d=$HF/tf5/deepseek_v3-default &&
	rm -rf nb && mkdir nb && cp "$d/config.json" nb/ &&
	hp-test-tool stdrop "$d/model.safetensors" nb/model.safetensors model.layers.2.mlp.gate.e_score_correction_bias &&
	hf_records rn "$d" &&
	write_config nb.yaml "$PWD/nb" rn 32 1 2 1 </dev/null &&
	test_must_fail_with 4 hp-train -q nb.yaml 2>err && test_one_line err &&
	grep -q "tensor .model.layers.2.mlp.gate.e_score_correction_bias. is missing" err &&
	write_config ok.yaml "$d" rn 32 1 2 1 </dev/null &&
	hp-train ok.yaml >out &&
	grep "^spec.latent_attention  *q_lora_rank 24, kv_lora_rank 16, qk 8 + 8, v 12, softmax scale x 1$" out &&
	grep "^spec.deepseek_router  *4 groups, top 2 kept, routed_scaling_factor 2.5, 2 shared experts$" out &&
	hf_records r4 "$HF/tf4/deepseek_v3-yarn" &&
	write_config y4.yaml "$HF/tf4/deepseek_v3-yarn" r4 32 1 2 1 </dev/null &&
	hp-train y4.yaml >out &&
	grep "^spec.deepseek_router .*(4.x: dropped groups score 0)$" out &&
	x=$(sed -n "s/^spec.latent_attention .*softmax scale x //p" out) &&
	rel_close "$x" "$(jq -r ".attention.scaling * 4" "$HF/tf4/deepseek_v3-yarn/reference.json")" 1e-12
'

test_expect_success 'gpt_oss: swiglu_limit is read: without the clamp, transformers'\''s loss without it' '
	d=$HF/tf5/gpt_oss-default &&
	rm -rf nc && mkdir nc && cp "$d/model.safetensors" nc/ &&
	jq ".swiglu_limit = 1e30" "$d/config.json" >nc/config.json &&
	hp-test-tool refstep --steps 1 nc "$d/reference.json" >a.jsonl &&
	rel_close "$(jq -r .loss a.jsonl)" "$(jq -r .ablations.loss_f64_no_clamp "$d/reference.json")" 1e-6 &&
	! rel_close "$(jq -r .loss a.jsonl)" "$(jq -r .loss.loss_f64 "$d/reference.json")" 1e-4
'

# Sliding windows shorter than the rows (8 of 32 keys): mistral on every
# layer, qwen2 on layer 1 (max_window_layers / layer_types), gpt_oss on
# layer 0; transformers keeps key j for query i when i - 8 < j <= i
for line in tf4 tf5; do
	for fam in mistral qwen2 gpt_oss; do
		d=$HF/$line/$fam-window
		test_expect_success "$line $fam window 8: loss within 1e-6, gradients within 1e-5, 5 AdamW losses within 1e-5 of transformers" '
			golden_steps "$d"
		'
	done
done

test_expect_success 'the window is read: a window of the rows'\'' length gives transformers'\'' full-attention loss, hp-train says which' '
	for fam in mistral qwen2 gpt_oss; do
		d=$HF/tf5/$fam-window &&
		rm -rf fw && mkdir fw && cp "$d/model.safetensors" fw/ &&
		jq ".sliding_window = 32" "$d/config.json" >fw/config.json &&
		hp-test-tool refstep --steps 1 fw "$d/reference.json" >a.jsonl &&
		rel_close "$(jq -r .loss a.jsonl)" "$(jq -r .loss.loss_f64_full_attention "$d/reference.json")" 1e-6 &&
		! rel_close "$(jq -r .loss a.jsonl)" "$(jq -r .loss.loss_f64 "$d/reference.json")" 1e-5 || return 1
	done &&
	hf_records rw "$HF/tf5/qwen2-window" &&
	write_config w.yaml "$HF/tf5/qwen2-window" rw 32 1 2 1 </dev/null &&
	hp-train w.yaml >out &&
	grep "^spec.sliding_window  *8 on 1 of 2 layers$" out
'

# MXFP4: the experts of data/hf/tf5/gpt_oss-mxfp4 are blocks and scales, as
# the released gpt-oss checkpoints store them (t/ref/make-mxfp4-golden.py)
test_expect_success 'gpt_oss MXFP4: dequantized on load as transformers does, bit for bit; its loss and gradients' '
	d=$HF/tf5/gpt_oss-mxfp4 &&
	hp-test-tool refstep --steps 1 --dump-grads g.safetensors "$d" "$d/reference.json" >s.jsonl &&
	rel_close "$(metric s.jsonl 1 loss)" "$(jq -r .loss.loss_f64 "$d/reference.json")" 1e-6 &&
	hp-test-tool cmpst --max-rel-l2 1e-5 g.safetensors "$d/grads.safetensors" >cmp &&
	! grep -q FAIL cmp &&
	hf_records rm "$d" &&
	write_config mx.yaml "$d" rm 32 1 2 1 </dev/null &&
	rm -rf msh mex &&
	hp-plan mx.yaml --world 2 --accelerator.ep_size=2 -o mplan.json &&
	hp-convert -q --plan mplan.json -o msh "$d" &&
	hp-convert -q --export msh -o mex --dtype f32 &&
	jq -e "has(\"quantization_config\") | not" mex/config.json &&
	{ hp-test-tool cmpst --max-abs 0 mex/model.safetensors "$d/dequantized.safetensors" || :; } >cmp &&
	test $(grep -c "experts\.\(gate_up\|down\)_proj  *max_abs 0.000e+00 rel_l2 0.000e+00" cmp) = 4 &&
	hp-train -q mx.yaml --metrics m1.jsonl &&
	mpiexec -n 2 hp-train -q mx.yaml --accelerator.ep_size=2 --metrics m2.jsonl &&
	test "$(jq .loss m1.jsonl)" = "$(jq .loss m2.jsonl)"
'

test_expect_success 'pad_token_id: its embedding row gets no gradient (nn.Embedding padding_idx), as transformers, both lines' '
	for line in tf4 tf5; do
		d=$HF/$line/llama-default-pad &&
		hp-test-tool refstep --dump-grads g.safetensors "$d" "$d/reference.json" >s.jsonl &&
		rel_close "$(metric s.jsonl 1 loss)" "$(jq -r .loss.loss_f64 "$d/reference.json")" 1e-6 &&
		hp-test-tool cmpst --max-rel-l2 1e-5 g.safetensors "$d/grads.safetensors" >cmp &&
		! grep -q FAIL cmp || return 1
	done &&
	rm -rf nopad && mkdir nopad && cp "$d/model.safetensors" nopad/ &&
	jq "del(.pad_token_id)" "$d/config.json" >nopad/config.json &&
	hp-test-tool refstep --steps 1 --dump-grads gn.safetensors nopad "$d/reference.json" >/dev/null &&
	hp-test-tool cmpst --max-rel-l2 1e-5 gn.safetensors "$d/grads.safetensors" >cmp;
	grep "model.embed_tokens.weight.*FAIL" cmp
'

test_expect_success 'the RoPE tables: inverse frequencies within 1e-6 and the attention factor within 1e-12 of transformers (both lines)' '
	for d in "$HF"/tf4/* "$HF"/tf5/*; do
		hp-test-tool spec "$d" | jq .hp_rope >r.json &&
		jq -r ".inv_freq_f32[]" r.json >ours &&
		jq -r ".rope.inv_freq_f32[]" "$d/reference.json" >theirs &&
		test $(wc -l <ours) = $(wc -l <theirs) &&
		paste ours theirs | while read a b; do rel_close "$a" "$b" 1e-6 || return 1; done &&
		rel_close "$(jq -r .attention_factor r.json)" "$(jq -r .rope.attention_scaling "$d/reference.json")" 1e-12 ||
		{ echo "in $d"; return 1; }
	done
'

test_expect_success 'the RoPE type matters: without its rope key a folder is the default-RoPE model, not the golden one' '
	for rope in linear yarn llama3; do
		for fam in llama qwen3_moe; do
			d=$HF/tf5/$fam-$rope &&
			rm -rf plain && mkdir plain && cp "$d"/model*.safetensors plain/ &&
			jq ".rope_parameters = {rope_type: \"default\", rope_theta: .rope_parameters.rope_theta}" \
				"$d/config.json" >plain/config.json &&
			hp-test-tool refstep --steps 1 --dump-grads gp.safetensors plain "$d/reference.json" >p.jsonl &&
			rel_close "$(jq -r .loss p.jsonl)" "$(jq -r .loss.loss_f64_default_rope "$d/reference.json")" 1e-6 &&
			! rel_close "$(jq -r .loss p.jsonl)" "$(jq -r .loss.loss_f64 "$d/reference.json")" 1e-6 &&
			hp-test-tool cmpst --max-rel-l2 1e-5 gp.safetensors "$d/grads.safetensors" >cmp;
			grep -q FAIL cmp || { echo "$fam $rope: the default-RoPE gradients pass too"; return 1; }
		done
	done
'

test_expect_success 'dynamic RoPE below max_position_embeddings is the unscaled table, and hp-train says so' '
	hp-test-tool spec "$HF/tf5/llama-dynamic" | jq .hp_rope >a.json &&
	hp-test-tool spec "$HF/tf5/llama-default" | jq .hp_rope >b.json &&
	test "$(jq -c .inv_freq_f32 a.json)" = "$(jq -c .inv_freq_f32 b.json)" &&
	hf_records recs "$HF/tf5/llama-dynamic" &&
	write_config dyn.yaml "$HF/tf5/llama-dynamic" recs 32 1 2 1 </dev/null &&
	hp-train dyn.yaml >out &&
	grep "^spec.rope_type  *dynamic factor 2 (positions below max_position_embeddings: the unscaled table)$" out
'

# same_run NAME: every step's loss within 1e-5 relative of the one-process
# run, and step 1's gradients within 1e-5 relative L2
same_run () {
	jq -r .loss "s-$1.jsonl" >a && jq -r .loss p.jsonl >b &&
	test $(wc -l <a) = $(wc -l <b) &&
	paste a b | while read x y; do rel_close "$x" "$y" 1e-5 || return 1; done &&
	hp-test-tool cmpst --max-rel-l2 1e-5 "sg-$1.safetensors" pg.safetensors >cmp &&
	! grep -q FAIL cmp
}

PAR="llama-default llama-linear llama-dynamic llama-yarn llama-llama3
qwen3_moe-default qwen3_moe-linear qwen3_moe-dynamic qwen3_moe-yarn qwen3_moe-llama3
mistral-yarn qwen2-yarn qwen3-llama3 gpt_oss-default gpt_oss-yarn
mistral-window qwen2-window gpt_oss-window deepseek_v3-default deepseek_v3-yarn deepseek_v3-nolora"

test_expect_success MPI 'the seed'\''s 8-rank layout (TP2 x CP2 x EP2, SP, FSDP) and CP 4 equal one process, RoPE positions across chunks' '
	for n in $PAR; do
		d=$HF/tf5/$n &&
		hf_records r-$n "$d" &&
		write_config $n.yaml "$d" r-$n 32 1 2 4 </dev/null &&
		hp-train -q $n.yaml --metrics s-$n.jsonl --dump-grads sg-$n.safetensors &&
		echo "# $n: seed layout" &&
		mpiexec -n 8 hp-train -q $n.yaml $A.tp_size=2 $A.cp_size=2 $A.ep_size=2 \
			$A.sequence_parallel=true $F.dp_shard_size=2 $F.edp_shard_size=2 \
			--metrics p.jsonl --dump-grads pg.safetensors &&
		same_run $n &&
		echo "# $n: CP 4" &&
		mpiexec -n 4 hp-train -q $n.yaml $A.cp_size=4 --metrics p.jsonl --dump-grads pg.safetensors &&
		same_run $n || return 1
	done
'

# bad_in MODEL NAME JQ EXIT PATTERN: the tf5 folder MODEL with its config
# changed by JQ is refused with EXIT, one line matching PATTERN, nothing
# written; bad NAME JQ EXIT PATTERN: the same on qwen3-default
bad_in () {
	src=$HF/tf5/$1; shift
	rm -rf b-$1 && mkdir b-$1 && cp "$src/model.safetensors" b-$1/ &&
	jq "$2" "$src/config.json" >b-$1/config.json &&
	hf_records rb "$src" &&
	write_config b-$1.yaml "$PWD/b-$1" rb 32 1 2 1 </dev/null &&
	test_must_fail_with $3 hp-train -q b-$1.yaml --metrics m-$1.jsonl 2>err &&
	test_one_line err && cat err && grep -q -- "$4" err &&
	test ! -e m-$1.jsonl
}

bad () {
	bad_in qwen3-default "$@"
}

test_expect_success 'refused by name, with exit 4: values hp does not compute' '
	bad prf ".partial_rotary_factor = 0.5" 4 "partial_rotary_factor 0.5 is not supported" &&
	bad prf2 ".rope_parameters.partial_rotary_factor = 0.25" 4 "partial_rotary_factor 0.25 is not supported for qwen3" &&
	bad act ".hidden_act = \"gelu\"" 4 "hidden_act gelu is not supported" &&
	bad quant ".quantization_config = {quant_method: \"bitsandbytes\"}" 4 "quantization_config (quant_method bitsandbytes) is not supported" &&
	bad quant4 ".quantization_config = {quant_method: \"mxfp4\"}" 4 "quantization_config (quant_method mxfp4) is not supported" &&
	bad drop ".attention_dropout = 0.1" 4 "attention_dropout 0.1 is not supported" &&
	bad long ".rope_parameters = {rope_type: \"longrope\", rope_theta: 1e6, short_factor: [1], long_factor: [1]}" 4 \
		"rope type .longrope. is not supported" &&
	bad both ".rope_scaling = {rope_type: \"linear\", factor: 2.0}" 4 "both rope_scaling and rope_parameters" &&
	bad types ".rope_parameters = {rope_type: \"linear\", type: \"yarn\", factor: 2.0, rope_theta: 1e6}" 4 \
		"rope_type .linear. and type .yarn. differ" &&
	bad theta ".rope_theta = 10000.0" 4 "rope_theta 10000 and rope_parameters.rope_theta 1e+06 differ" &&
	bad nested ".rope_parameters = {full_attention: {rope_type: \"default\", rope_theta: 1e6}}" 4 \
		"per-layer-type RoPE parameters" &&
	bad arch ".architectures = [\"LlamaForCausalLM\"]" 4 "architectures .*LlamaForCausalLM.* does not match model_type .qwen3." &&
	bad ltype ".layer_types = [\"full_attention\", \"chunked_attention\"]" 4 "layer_types.1. .chunked_attention. is not supported" &&
	bad mtype ".model_type = \"gemma\"" 4 "model_type .gemma. is not supported"
'

test_expect_success 'gpt_oss: refused by name what transformers'\''s two lines compute differently or hp does not compute' '
	bad_in gpt_oss-default o-aux ".output_router_logits = true" 4 "output_router_logits true is not supported for gpt_oss" &&
	bad_in gpt_oss-default o-null ".rope_parameters = null" 4 "rope_parameters is null: transformers 4.x reads that as default" &&
	bad_in gpt_oss-default o-4x ".transformers_version = \"4.57.6\"" 4 \
		"swiglu_limit 0.5, swiglu_alpha 1.702 in a folder of transformers 4.57.6" &&
	bad_in gpt_oss-default o-lt ".layer_types = [\"full_attention\"]" 3 "layer_types.: expected a list of 2" &&
	bad_in gpt_oss-default o-lim ".swiglu_limit = 0" 3 "swiglu_limit must be positive" &&
	bad_in gpt_oss-default o-arch ".architectures = [\"Qwen3MoeForCausalLM\"]" 4 "does not match model_type .gpt_oss." &&
	bad_in qwen3_next-default n-lt ".layer_types[1] = \"sliding_attention\"" 4 \
		"layer_types.1. .sliding_attention. is not supported; supported: full_attention, linear_attention" &&
	bad_in qwen3_next-default n-ltn ".layer_types = [\"full_attention\"]" 3 "layer_types.: expected a list of 4" &&
	bad_in qwen3_next-default n-vh ".linear_num_value_heads = 3" 3 \
		"linear_num_value_heads 3 is not a multiple of linear_num_key_heads 2" &&
	bad_in qwen3_next-default n-prf ".rope_parameters.partial_rotary_factor = 0.1" 3 \
		"partial_rotary_factor 0.1 rotates 1 of head_dim 16 values" &&
	bad_in qwen3_next-default n-prf2 ".partial_rotary_factor = 0.5" 4 \
		"partial_rotary_factor 0.5 and rope_parameters.partial_rotary_factor 0.25 differ" &&
	bad_in qwen3_next-default n-conv ".linear_conv_kernel_dim = 0" 3 "linear_conv_kernel_dim must be positive" &&
	bad_in gpt_oss-default o-sw ".sliding_window = null | del(.layer_types)" 4 \
		"sliding_window is null but the default layer_types has sliding_attention layers" &&
	jq ".head_dim = 520" "$HF/tf5/gpt_oss-default/config.json" >b-o-lim/config.json &&
	test_must_fail_with 4 hp-plan b-o-lim.yaml --world 1 2>err && test_one_line err &&
	grep -q "attention with sinks runs the flash kernel, which takes head_dim up to 512; the model has 520" err
'

test_expect_success 'gpt_oss: a stacked expert tensor of the wrong shape, or one missing, is named (hp-train and hp-convert)' '
	d=$HF/tf5/gpt_oss-default &&
	rm -rf sx && mkdir sx && jq ".intermediate_size = 20" "$d/config.json" >sx/config.json &&
	cp "$d/model.safetensors" sx/ && hf_records rs "$d" &&
	write_config sx.yaml "$PWD/sx" rs 32 1 2 1 </dev/null &&
	test_must_fail_with 4 hp-train -q sx.yaml 2>err && test_one_line err &&
	grep -q "tensor .model.layers.0.mlp.experts.gate_up_proj. has the wrong shape for 4 experts of this config.json: expected \[4, 32, 40\]" err &&
	hp-plan sx.yaml --world 2 --accelerator.ep_size=2 -o sxp.json &&
	rm -rf sxs && test_must_fail_with 4 hp-convert -q --plan sxp.json -o sxs sx 2>err && test_one_line err &&
	grep -q "tensor .model.layers.0.mlp.experts.gate_up_proj. has the wrong shape for 4 experts of this config.json: expected \[4, 32, 40\]" err &&
	test ! -e sxs &&
	hp-test-tool stdrop "$d/model.safetensors" sx/model.safetensors model.layers.1.mlp.experts.down_proj_bias &&
	cp "$d/config.json" sx/ &&
	test_must_fail_with 4 hp-train -q sx.yaml 2>err && test_one_line err &&
	grep -q "tensor .model.layers.1.mlp.experts.0.down_proj.bias. is missing" err
'

test_expect_success 'bad config.json values are named, with exit 3 (a wrong value) or 4 (what the two lines read apart)' '
	bad_in qwen3_moe-default experts ".num_experts = 8" 3 "num_experts and num_local_experts differ" &&
	bad dtypes ".torch_dtype = \"bfloat16\"" 3 "dtype and torch_dtype differ" &&
	bad ropeobj ".rope_parameters = 5" 3 "key .rope_parameters.: expected an object" &&
	bad nofactor ".rope_parameters = {rope_type: \"linear\", rope_theta: 1e6}" 3 \
		"rope type needs .rope_parameters.factor." &&
	bad zerofactor ".rope_parameters = {rope_type: \"linear\", factor: 0, rope_theta: 1e6}" 3 \
		"rope_parameters.factor must be positive" &&
	bad noorig ".rope_parameters = {rope_type: \"llama3\", factor: 8, low_freq_factor: 1, high_freq_factor: 4, rope_theta: 1e6}" 3 \
		"rope type needs .rope_parameters.original_max_position_embeddings." &&
	bad bands ".rope_parameters = {rope_type: \"llama3\", factor: 8, low_freq_factor: 4, high_freq_factor: 1, original_max_position_embeddings: 16, rope_theta: 1e6}" 3 \
		"high_freq_factor must exceed low_freq_factor" &&
	bad orig ".original_max_position_embeddings = 8 | .rope_parameters = {rope_type: \"yarn\", factor: 4, original_max_position_embeddings: 16, rope_theta: 1e6}" 4 \
		"original_max_position_embeddings 8 and rope_parameters.original_max_position_embeddings 16 differ" &&
	bad nlayers ".layer_types = [\"full_attention\"]" 3 "key .layer_types.: expected a list of 2 layer types" &&
	bad nowin ".layer_types = [\"full_attention\", \"sliding_attention\"]" 4 "layer_types.1. is sliding_attention but there is no window" &&
	bad zerowin ".use_sliding_window = true | .sliding_window = 0" 3 "sliding_window must be positive or null" &&
	bad archstr ".architectures = \"Qwen3ForCausalLM\"" 3 "key .architectures.: expected a list of one class name" &&
	bad pad ".pad_token_id = 64" 3 "pad_token_id 64 is not below vocab_size 64" &&
	bad odd ".head_dim = 15" 3 "head_dim 15 must be positive, even" &&
	bad maxpos ".max_position_embeddings = 16" 3 "sequence length 32 exceeds the model.s max_position_embeddings 16"
'

test_expect_success 'export: the source config.json key for key; without the source, the plan spec in the source line spelling' '
	for n in tf5/qwen3_moe-yarn tf4/llama-llama3 tf5/gpt_oss-yarn tf4/gpt_oss-default tf5/deepseek_v3-yarn \
		tf4/deepseek_v3-nolora; do
		d=$HF/$n && rm -rf src sh ex fb && cp -r "$d" src &&
		hf_records re "$d" &&
		write_config ex.yaml "$PWD/src" re 32 1 2 1 </dev/null &&
		hp-plan ex.yaml --world 2 --fsdp_config.dp_shard_size=2 -o plan.json &&
		hp-convert -q --plan plan.json -o sh src &&
		hp-convert -q --export sh -o ex &&
		jq -S . src/config.json >a && jq -S . ex/config.json >b && cmp a b &&
		cmp src/generation_config.json ex/generation_config.json &&
		hp-test-tool stsame src ex &&
		rm -rf src && hp-convert -q --export sh -o fb &&
		test ! -e fb/generation_config.json &&
		hp-test-tool stsame "$d" fb &&
		hp-test-tool spec "$d" | jq -S "del(.transformers_version)" >a &&
		hp-test-tool spec fb | jq -S "del(.transformers_version)" >b && cmp a b &&
		case $n in
		tf5/deepseek_v3*) jq -e "has(\"rope_parameters\") and has(\"dtype\") and has(\"n_routed_experts\") and
			(has(\"rope_scaling\") or has(\"torch_dtype\") or has(\"num_local_experts\") | not)" fb/config.json ;;
		tf5/*) jq -e "has(\"rope_parameters\") and has(\"dtype\") and has(\"num_local_experts\") and
			(has(\"rope_scaling\") or has(\"torch_dtype\") or has(\"num_experts\") | not)" fb/config.json ;;
		tf4/*) jq -e "has(\"rope_scaling\") and has(\"torch_dtype\") and (has(\"rope_parameters\") | not)" \
			fb/config.json ;;
		esac || return 1
	done
'

test_expect_success 'deepseek_v3: refused by name what transformers does not compute or hp does not; a wrong shape named' '
	D=deepseek_v3-default &&
	bad_in $D d-aux ".output_router_logits = true" 4 "output_router_logits true is not supported for deepseek_v3" &&
	bad_in $D d-hd ".head_dim = 16" 4 "head_dim 16 is not qk_rope_head_dim 8" &&
	bad_in $D d-qkhd ".qk_head_dim = 12" 4 "qk_head_dim 12 is not qk_nope_head_dim + qk_rope_head_dim 16" &&
	bad_in $D d-kv ".num_key_value_heads = 2" 4 "num_key_value_heads 2 is not num_attention_heads 4" &&
	bad_in $D d-sf ".scoring_func = \"softmax\"" 4 "scoring_func softmax is not supported" &&
	bad_in $D d-tm ".topk_method = \"group_limited_greedy\"" 4 "topk_method group_limited_greedy is not supported" &&
	bad_in $D d-lf ".moe_layer_freq = 2" 4 "moe_layer_freq must be 1" &&
	bad_in $D d-q ".quantization_config = {quant_method: \"fp8\"}" 4 "quantization_config (quant_method fp8) is not supported" &&
	bad_in $D d-ng ".n_group = 3" 3 "n_routed_experts 8 must split into n_group 3 groups" &&
	bad_in $D d-tg ".topk_group = 5" 3 "num_experts_per_tok 2 must come from topk_group 5" &&
	bad_in $D d-lr ".kv_lora_rank = 0" 3 "kv_lora_rank must be positive" &&
	bad_in $D d-rs ".routed_scaling_factor = 0" 3 "routed_scaling_factor must be positive" &&
	bad_in $D d-fk ".first_k_dense_replace = -1" 3 "key .first_k_dense_replace.: value -1 out of range" &&
	bad_in $D d-sh ".kv_lora_rank = 12" 4 "kv_a_proj_with_mqa.weight.* shape" &&
	bad_in qwen3_moe-default d-fam ".model_type = \"deepseek_v2\"" 4 "model_type .deepseek_v2. is not supported"
'

test_expect_success 'gpt_oss MXFP4: blocks and scales of the wrong shape, another quant_method, an unknown key: refused by name' '
	d=$HF/tf5/gpt_oss-mxfp4 &&
	bad_in gpt_oss-mxfp4 q-m ".quantization_config.quant_method = \"fp8\"" 4 "quantization_config (quant_method fp8) is not supported" &&
	bad_in gpt_oss-mxfp4 q-k ".quantization_config.block_size = 32" 4 "quantization_config.block_size is not supported with mxfp4" &&
	rm -rf mq && mkdir mq && jq ".intermediate_size = 64" "$d/config.json" >mq/config.json && cp "$d/model.safetensors" mq/ &&
	hf_records rq "$d" && write_config mq.yaml "$PWD/mq" rq 32 1 2 1 </dev/null &&
	test_must_fail_with 4 hp-train -q mq.yaml 2>err && test_one_line err &&
	grep -q "MXFP4 tensors .model.layers.0.mlp.experts.gate_up_proj_blocks. and .*_scales. are not U8 \[4, 128, 1, 16\]" err
'

test_expect_success 'refused: llama-only values (pretraining_tp 2, mlp_bias true)' '
	for kv in "pretraining_tp = 2" "mlp_bias = true"; do
		rm -rf bl && mkdir bl && cp "$HF/tf5/llama-default/model.safetensors" bl/ &&
		jq ".$kv" "$HF/tf5/llama-default/config.json" >bl/config.json &&
		hf_records rl "$HF/tf5/llama-default" &&
		write_config bl.yaml "$PWD/bl" rl 32 1 2 1 </dev/null &&
		test_must_fail_with 4 hp-train -q bl.yaml 2>err &&
		test_one_line err && grep -q "$(echo $kv | sed "s/ = / /")" err || return 1
	done
'

test_expect_success 'a key in none of the lists: one warning line from hp-train and hp-plan, recorded in the plan; the run goes on' '
	rm -rf unk && mkdir unk && cp "$HF/tf5/qwen3-default/model.safetensors" unk/ &&
	jq ".frobnicate = 3 | .rope_parameters.wibble = 1" "$HF/tf5/qwen3-default/config.json" >unk/config.json &&
	hf_records ru "$HF/tf5/qwen3-default" &&
	write_config unk.yaml "$PWD/unk" ru 32 1 2 1 </dev/null &&
	hp-train -q unk.yaml --metrics mu.jsonl 2>err &&
	test $(grep -c "warning: .*keys hp does not know" err) = 1 &&
	grep -q "left unused (transformers may read them): rope_parameters.wibble, frobnicate$" err &&
	test $(wc -l <mu.jsonl) = 1 &&
	hp-plan unk.yaml --world 1 -o plan.json 2>perr &&
	test $(grep -c "keys hp does not know" perr) = 1 &&
	jq -e ".model.hp_unknown_keys == \"rope_parameters.wibble, frobnicate\"" plan.json
'

test_expect_success 'a 4.x and a 5.x folder of the same model make the same plan model, but for the version' '
	hp-test-tool spec "$HF/tf4/qwen3-yarn" | jq -S "del(.transformers_version)" >a &&
	hp-test-tool spec "$HF/tf5/qwen3-yarn" | jq -S "del(.transformers_version)" >b &&
	jq -e ".hp_rope.type == \"yarn\"" a &&
	cmp a b
'

test_done
