#!/bin/sh
test_description='kernel substitution: the plan_overrides kernels train as HF'\''s algorithms do'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

REFS=$DATA/ref

# The seed's plan_overrides, from the seed's config (both spellings of
# HyperParallel's factories work; t0600 checks that).
overrides () {
	awk '/^plan_overrides:/ { on = 1; print; next } on && /^[^ ]/ { exit } on' "$TEST_DIR/config/seed-8rank.yaml"
}

# same_losses A B STEPS TOL: per-step losses of two metrics files agree within TOL relative
same_losses () {
	for s in $(seq 1 $3); do
		a=$(metric "$1" $s loss) b=$(metric "$2" $s loss)
		awk -v a="$a" -v b="$b" -v t="$4" -v s="$s" 'BEGIN {
			d = (a - b) / b; if (d < 0) d = -d
			if (d > t || a == "" || b == "") { printf "step %s: %s vs %s (%.2e)\n", s, a, b, d; exit 1 }
		}' || return 1
	done
}

for m in qwen3-moe-a qwen3-moe-b; do
	test_expect_success "$m: 10 steps with the seed's overrides equal the reference kernels (1e-5)" '
		make_tinystories ts 64 &&
		write_config ref.yaml "$REFS/'$m'" ts 64 2 4 10 </dev/null &&
		overrides | write_config fast.yaml "$REFS/'$m'" ts 64 2 4 10 &&
		hp-train ref.yaml --metrics ref.jsonl >ref.out &&
		hp-train fast.yaml --metrics fast.jsonl >fast.out &&
		L=$(jq .num_hidden_layers "$REFS/'$m'/config.json") &&
		E=$(awk "/^spec.moe_layers/ {print \$2}" ref.out) && test "$E" -gt 0 &&
		grep -q "flash_attention $L/$L layers, fused_rmsnorm $((2 * L + 1))/$((2 * L + 1)) norms, grouped_experts $E/$E MoE layers, chunked_ce 0" fast.out &&
		grep -q "flash_attention 0/$L layers, fused_rmsnorm 0/$((2 * L + 1)) norms, grouped_experts 0/$E" ref.out &&
		same_losses ref.jsonl fast.jsonl 10 1e-5 &&
		test "$(metric ref.jsonl 10 grad_norm)" != "" &&
		sed -e "s/^training:\$/training:\n  loss_fn: {_target_: ChunkedCausalLMLoss, chunk_size: 24}/" \
			fast.yaml >chunk.yaml &&
		hp-train chunk.yaml --metrics chunk.jsonl >chunk.out &&
		grep -q "chunked_ce 24" chunk.out &&
		same_losses ref.jsonl chunk.jsonl 10 1e-5
	'
done

# fast.yaml and ref.jsonl are qwen3-moe-b's (2 layers, both MoE), from the loop above
test_expect_success 'HP_KERNELS=reference keeps HF'\''s algorithms whatever the plan binds' '
	HP_KERNELS=reference hp-train fast.yaml --metrics r.jsonl >r.out &&
	grep -q "flash_attention 0/2 layers, fused_rmsnorm 0/5 norms, grouped_experts 0/2" r.out &&
	same_losses ref.jsonl r.jsonl 10 1e-5
'

test_expect_success 'stories260K (llama): flash attention and fused norms through plan_overrides' '
	make_refbatch rb &&
	write_config l.yaml "$MODEL" rb 128 2 2 5 </dev/null &&
	write_config lf.yaml "$MODEL" rb 128 2 2 5 <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: flash_attention}}
	  - {match: ["*norm"], replace_module: {_target_: fused_rmsnorm}}
	YAML
	hp-train l.yaml --metrics l.jsonl >/dev/null &&
	hp-train lf.yaml --metrics lf.jsonl >lf.out &&
	grep -q "flash_attention 5/5 layers, fused_rmsnorm 11/11" lf.out &&
	same_losses l.jsonl lf.jsonl 5 1e-5
'

test_expect_success 'a kernel bound to the wrong kind of module is refused' '
	write_config bad.yaml "$MODEL" rb 128 2 2 1 <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: fused_rmsnorm}}
	YAML
	test_must_fail_with 3 hp-train bad.yaml 2>err &&
	test_one_line err && grep -q "kernel .fused_rmsnorm. computes rmsnorm" err
'

# supports() of the registry's row (lib/backend/kernels.c) decides at
# binding: the CPU's flash kernel takes head_dim up to 512, so hp-plan
# refuses it for a model of 520, naming the module (t0950 shows the same
# refusal from hp-train)
test_expect_success 'a kernel that cannot run the module it matches is refused at binding, by module' '
	mkdir -p hd520 &&
	jq ".head_dim = 520" "$REFS/qwen3-moe-a/config.json" >hd520/config.json &&
	write_config hd.yaml "$PWD/hd520" rb 128 2 2 1 <<-YAML &&
	plan_overrides:
	  - {match: "*.self_attn", replace_module: {_target_: flash_attention}}
	YAML
	sed -i -e "s|from_pretrained|from_config|" -e "s|pretrained_model_name_or_path:|config_path:|" hd.yaml &&
	test_must_fail_with 3 hp-plan hd.yaml --world 1 >plan.json 2>err &&
	test_one_line err &&
	grep -q "plan_overrides\[0\]: .model.layers.0.self_attn.: flash_attention takes head_dim up to 512, the model has 520" err &&
	sed -i "s/_target_: flash_attention/_target_: fused_rmsnorm/; s/self_attn/input_layernorm/" hd.yaml &&
	hp-plan hd.yaml --world 1 >plan.json
'

test_done
