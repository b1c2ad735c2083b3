#!/bin/sh
test_description='Qwen3 and Qwen3-MoE: loss, gradients, aux loss and AdamW steps agree with the reference'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

REFS=$DATA/ref

# close KEY_JSON_PATH FILE VALUE TOL
close_to () {
	float_close "$2" "$(jq -r "$1" "$3")" "$4"
}

for mdl in qwen3-dense qwen3-moe-a qwen3-moe-b; do
	test_expect_success "$mdl: loss within 1e-5 and every gradient within 1e-4 of the float64 reference" '
		hp-test-tool refstep --dump-grads g-$mdl.safetensors "$REFS/$mdl" "$REFS/$mdl/reference.json" >s-$mdl.jsonl &&
		loss=$(jq -r "select(.step == 1) | .loss" s-$mdl.jsonl) &&
		echo "loss $loss" &&
		close_to .loss.loss_f64 "$loss" "$REFS/$mdl/reference.json" 1e-5 &&
		hp-test-tool cmpst --max-rel-l2 1e-4 g-$mdl.safetensors "$REFS/$mdl/grads.safetensors" >cmp &&
		sort -k5 -g cmp | tail -n 1
	'

	test_expect_success "$mdl: the losses of 5 AdamW steps within 1e-5" '
		jq -r ".loss" s-$mdl.jsonl >ours &&
		jq -r ".adamw.losses_f32[]" "$REFS/$mdl/reference.json" >theirs &&
		test $(wc -l <ours) = 5 &&
		paste ours theirs | while read a b; do float_close "$a" "$b" 1e-5 || return 1; done
	'

	test_expect_success "$mdl: the logits of row 0 within 1e-4" '
		ids=$(jq -r ".batch.input_ids[0] | map(tostring) | join(\" \")" "$REFS/$mdl/reference.json") &&
		hp-test-tool logits -o l.safetensors "$REFS/$mdl" $ids &&
		hp-test-tool cmpst --max-abs 1e-4 l.safetensors "$REFS/$mdl/logits.safetensors"
	'
done

test_expect_success 'qwen3-moe-a: the aux loss matches, and is absent with output_router_logits off' '
	aux=$(jq -r "select(.step == 1) | .aux" s-qwen3-moe-a.jsonl) &&
	close_to .loss.aux_f64 "$aux" "$REFS/qwen3-moe-a/reference.json" 1e-5 &&
	hp-test-tool refstep --steps 1 --no-router-logits "$REFS/qwen3-moe-a" "$REFS/qwen3-moe-a/reference.json" >off.jsonl &&
	close_to .loss.loss_without_router_logits_f64 "$(jq -r .loss off.jsonl)" "$REFS/qwen3-moe-a/reference.json" 1e-5 &&
	test "$(jq -r .loss off.jsonl)" = "$(jq -r .ce off.jsonl)"
'

test_expect_success 'the stacked expert layout loads and computes the same model' '
	hp-test-tool refstep --steps 1 --dump-grads gs.safetensors "$REFS/qwen3-moe-b-stacked" \
		"$REFS/qwen3-moe-b/reference.json" >st.jsonl &&
	close_to .loss.loss_f64 "$(jq -r .loss st.jsonl)" "$REFS/qwen3-moe-b/reference.json" 1e-5 &&
	hp-test-tool cmpst --max-rel-l2 1e-4 gs.safetensors "$REFS/qwen3-moe-b/grads.safetensors" >/dev/null
'

test_expect_success 'the BF16 copy loads and matches its reference loss' '
	hp-test-tool refstep --steps 1 "$REFS/qwen3-dense-bf16" "$REFS/qwen3-dense/reference.json" >bf.jsonl &&
	close_to .loss.loss_f64 "$(jq -r .loss bf.jsonl)" "$REFS/qwen3-dense-bf16/reference.json" 1e-5
'

# A Qwen3-MoE config with no weights, for from_config runs.
moe_config () {
	mkdir -p "$1" &&
	jq ".vocab_size = 512 | .num_hidden_layers = 4" "$REFS/qwen3-moe-a/config.json" >"$1/config.json"
}

test_expect_success 'hp-train trains a Qwen3-MoE checkpoint (two files, index) end to end' '
	make_tinystories ts 64 &&
	write_config moe.yaml "$REFS/qwen3-moe-a" ts 64 2 4 3 &&
	hp-train moe.yaml --metrics m.jsonl >out &&
	grep -q "^spec.moe_layers  *2 of 3$" out &&
	test $(wc -l <m.jsonl) = 3 &&
	jq -e "has(\"aux_loss\")" m.jsonl >/dev/null
'

test_expect_success 'from_config: a random Qwen3-MoE starts near ln(vocab_size)' '
	moe_config rnd &&
	sed -e "s|from_pretrained|from_config|" -e "s|pretrained_model_name_or_path: .*|config_path: $PWD/rnd|" \
		moe.yaml >rnd.yaml &&
	hp-train -q rnd.yaml --metrics r1.jsonl &&
	l=$(metric r1.jsonl 1 loss) &&
	echo "first loss $l, ln 512 = 6.238" &&
	float_close "$l" 6.2383 0.1
'

test_expect_success 'from_config: one seed gives bit-identical weights and losses; another seed differs' '
	hp-train -q rnd.yaml --metrics r2.jsonl --dump-grads ga.safetensors &&
	hp-train -q rnd.yaml --metrics r3.jsonl --dump-grads gb.safetensors &&
	cmp ga.safetensors gb.safetensors &&
	jq .loss r2.jsonl >a && jq .loss r3.jsonl >b && cmp a b &&
	hp-train -q rnd.yaml --training.seed=5 --metrics r4.jsonl &&
	jq .loss r4.jsonl >c && ! cmp -s a c
'

test_expect_success 'from_config: num_hidden_layers crops the config' '
	hp-train rnd.yaml --model.num_hidden_layers=2 --training.train_iters=1 >out &&
	grep -q "^spec.num_hidden_layers  *2$" out
'

test_expect_success 'bad input: top-k above the number of experts' '
	mkdir -p badk && cp "$REFS/qwen3-moe-b/"*.safetensors badk/ &&
	jq ".num_experts_per_tok = 17" "$REFS/qwen3-moe-b/config.json" >badk/config.json &&
	write_config bk.yaml "$PWD/badk" ts 64 2 2 1 &&
	test_must_fail_with 3 hp-train -q bk.yaml 2>err &&
	test_one_line err && grep -q "num_experts_per_tok 17" err
'

test_expect_success 'bad input: a missing expert tensor names it' '
	mkdir -p miss && cp "$REFS/qwen3-moe-b/config.json" miss/ &&
	hp-test-tool stdrop "$REFS/qwen3-moe-b/model.safetensors" miss/model.safetensors \
		model.layers.1.mlp.experts.7.up_proj.weight &&
	write_config mi.yaml "$PWD/miss" ts 64 2 2 1 &&
	test_must_fail_with 4 hp-train -q mi.yaml 2>err &&
	test_one_line err && grep -q "model.layers.1.mlp.experts.7.up_proj.weight. is missing" err
'

test_expect_success 'bad input: a shape mismatch names the tensor' '
	mkdir -p shp && cp "$REFS/qwen3-moe-b/"*.safetensors shp/ &&
	jq ".moe_intermediate_size = 20" "$REFS/qwen3-moe-b/config.json" >shp/config.json &&
	write_config sh.yaml "$PWD/shp" ts 64 2 2 1 &&
	test_must_fail_with 4 hp-train -q sh.yaml 2>err &&
	test_one_line err && grep -q "experts.0.gate_proj.weight. has shape" err
'

test_expect_success 'bad input: a stacked expert tensor of the wrong shape names it' '
	mkdir -p stk && cp "$REFS/qwen3-moe-b-stacked/"*.safetensors stk/ &&
	jq ".moe_intermediate_size = 20" "$REFS/qwen3-moe-b-stacked/config.json" >stk/config.json &&
	write_config st.yaml "$PWD/stk" ts 64 2 2 1 &&
	test_must_fail_with 4 hp-train -q st.yaml 2>err &&
	test_one_line err && grep -q "experts.gate_up_proj. has the wrong shape" err
'

test_expect_success 'bad input: a tensor the config does not use names it' '
	mkdir -p nob && cp "$REFS/qwen3-dense/model.safetensors" nob/ &&
	jq ".attention_bias = false" "$REFS/qwen3-dense/config.json" >nob/config.json &&
	write_config nb.yaml "$PWD/nob" ts 64 2 2 1 &&
	test_must_fail_with 4 hp-train -q nb.yaml 2>err &&
	test_one_line err && grep -q "unexpected tensor .model.layers.0.self_attn.[a-z]*_proj.bias." err
'

test_expect_success 'bad input: a tied config whose lm_head differs from the embedding' '
	mkdir -p tie && cp "$REFS/qwen3-dense/model.safetensors" tie/ &&
	jq ".tie_word_embeddings = true" "$REFS/qwen3-dense/config.json" >tie/config.json &&
	write_config ti.yaml "$PWD/tie" ts 64 2 2 1 &&
	test_must_fail_with 4 hp-train -q ti.yaml 2>err &&
	test_one_line err && grep -q "lm_head.weight. differs from the embedding" err
'

test_expect_success 'bad input: a rope type hp does not compute is refused, naming it' '
	mkdir -p rs && cp "$REFS/qwen3-dense/"*.safetensors rs/ &&
	jq ".rope_scaling = {\"rope_type\": \"longrope\", \"factor\": 4.0}" "$REFS/qwen3-dense/config.json" >rs/config.json &&
	write_config rs.yaml "$PWD/rs" ts 64 2 2 1 &&
	test_must_fail_with 4 hp-train -q rs.yaml 2>err &&
	test_one_line err && grep -q "rope type .longrope. is not supported" err
'

test_done
