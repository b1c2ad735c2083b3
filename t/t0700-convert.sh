#!/bin/sh
test_description='hp-convert: HF folders to shards and back, resharding, random init, integrity'
. "$(dirname "$0")/test-lib.sh"

PLANS=$TEST_DIR/plan

# model_of PLAN: the HF folder a golden plan's config names (relative to t/plan)
model_of () {
	echo "$PLANS/$(jq -r .config.model.pretrained_model_name_or_path "$1")"
}

# plan_for MODEL WORLD [OVERRIDES...]: a plan of the fsdp-2 config for MODEL
plan_for () {
	m=$1 w=$2; shift 2
	sed -e "s|pretrained_model_name_or_path: .*|pretrained_model_name_or_path: $m|" \
		"$PLANS/fsdp-2.yaml" >pf.yaml &&
	hp-plan pf.yaml --world "$w" "$@"
}

for p in "$PLANS"/*.json; do
	n=$(basename "$p" .json)
	test_expect_success "round trip HF -> shards -> HF is bit-identical: $n" '
		hp-convert -q --plan "$p" -o "s-$n" "$(model_of "$p")" &&
		test $(ls "s-$n" | grep -c "^rank-.*-of-.*\.safetensors$") = $(jq .world_size "$p") &&
		cmp "$p" "s-$n/plan.json" &&
		hp-convert -q --verify "s-$n" 2>verify &&
		grep -q "shards match plan" verify &&
		hp-convert -q --export "s-$n" -o "hf-$n" &&
		hp-test-tool stsame "$(model_of "$p")" "hf-$n"
	'
done

test_expect_success 'a shard holds the rank'\''s pieces, with global shapes, offsets and checksums' '
	f=s-all-8/rank-00003-of-00008.safetensors &&
	head -c 8 $f | od -An -tu8 | tr -d " " >hlen &&
	tail -c +9 $f | head -c $(cat hlen) >hdr.json &&
	jq_meta () { jq -r ".__metadata__[\"$1\"]" hdr.json; } &&
	test "$(jq_meta hp_format)" = hp-shard/1 &&
	test "$(jq_meta hp_rank)" = 3 && test "$(jq_meta hp_world)" = 8 &&
	test "$(jq_meta hp_plan)" = "$(jq -r .hash "$PLANS/all-8.json")" &&
	test "$(jq_meta hp_global.model.layers.1.self_attn.o_proj.weight)" = "64,64" &&
	test "$(jq -c ".[\"model.layers.1.self_attn.o_proj.weight\"].shape" hdr.json)" = "[32,32]" &&
	test "$(jq_meta hp_offset.model.layers.1.self_attn.o_proj.weight)" = "32,32" &&
	jq_meta hp_crc32c.model.norm.weight | grep -q "^[0-9a-f]\{8\}$" &&
	! jq -e "has(\"model.layers.1.mlp.experts.0.up_proj.weight\")" hdr.json >/dev/null &&
	jq -e "has(\"model.layers.1.mlp.experts.7.up_proj.weight\")" hdr.json >/dev/null
'

test_expect_success 'BF16, two files with an index: back to BF16 bit for bit, in one file or split' '
	m=$DATA/stories260K/hf-bf16-sharded &&
	plan_for "$m" 4 --fsdp_config.dp_shard_size=4 >pb.json &&
	hp-convert -q --plan pb.json -o sb "$m" &&
	hp-convert -q --export sb -o hb1 &&
	test "$(jq -r .torch_dtype hb1/config.json)" = bfloat16 &&
	hp-test-tool stsame "$m" hb1 &&
	hp-convert -q --export sb -o hb3 --max-shard-size 200KB &&
	ls hb3 | grep -q "^model-00001-of-0000[3-9].safetensors$" &&
	test "$(jq .metadata.total_size hb3/model.safetensors.index.json)" = \
		"$(jq .metadata.total_size "$m/model.safetensors.index.json")" &&
	hp-test-tool stsame "$m" hb3 &&
	hp-convert -q --export sb -o hf32 --dtype f32 &&
	test "$(jq -r .torch_dtype hf32/config.json)" = float32 &&
	tail -c +9 hf32/model.safetensors | head -c 400 | grep -q "\"dtype\":\"F32\"" &&
	hp-test-tool cmpst --max-rel-l2 0.01 "$DATA/stories260K/hf/model.safetensors" hf32/model.safetensors >/dev/null
'

test_expect_success 'stacked experts (transformers 5) export as the per-expert folder' '
	plan_for "$DATA/ref/qwen3-moe-b-stacked" 4 --accelerator.ep_size=4 --fsdp_config.dp_shard_size=2 >pst.json &&
	hp-convert -q --plan pst.json -o sst "$DATA/ref/qwen3-moe-b-stacked" &&
	hp-convert -q --export sst -o hst &&
	hp-test-tool stsame "$DATA/ref/qwen3-moe-b" hst
'

test_expect_success 'resharding A -> B equals converting straight to B, byte for byte' '
	hp-convert -q --plan "$PLANS/ep-4.json" -o s-a-to-b s-all-8 &&
	for f in s-ep-4/*; do cmp "$f" "s-a-to-b/$(basename "$f")" || return 1; done &&
	hp-convert -q --plan "$PLANS/all-8.json" -o s-b-to-a s-cp-4 &&
	for f in s-all-8/*; do cmp "$f" "s-b-to-a/$(basename "$f")" || return 1; done
'

test_expect_success MPI 'under mpiexec each process writes its ranks; the files are the same' '
	mpiexec -n 8 hp-convert -q --plan "$PLANS/all-8.json" -o s-mpi8 "$DATA/ref/qwen3-moe-a" &&
	mpiexec -n 3 hp-convert -q --plan "$PLANS/all-8.json" -o s-mpi3 "$DATA/ref/qwen3-moe-a" &&
	for f in s-all-8/*; do
		cmp "$f" "s-mpi8/$(basename "$f")" && cmp "$f" "s-mpi3/$(basename "$f")" || return 1
	done &&
	mpiexec -n 2 hp-convert -q --export s-mpi8 -o hf-mpi2 --max-shard-size 300KB &&
	hp-test-tool stsame "$DATA/ref/qwen3-moe-a" hf-mpi2
'

test_expect_success 'the plan can come from a pipe' '
	(cd "$PLANS" && hp-plan fsdp-2.yaml --world 2) | hp-convert -q --plan - -o s-pipe "$DATA/ref/qwen3-dense" &&
	for f in s-fsdp-2/*; do cmp "$f" "s-pipe/$(basename "$f")" || return 1; done
'

# A from_config model of the seed layout, drawn for 1, 2, 4 and 8 ranks.
test_expect_success 'random init: the same global tensors for world sizes 1, 2, 4 and 8 and any layout' '
	cat >init.yaml <<-EOF &&
	model:
	  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_config
	  config_path: $DATA/ref/qwen3-moe-a
	training: {train_iters: 1, seed: 7}
	accelerator: {tp_size: 2, cp_size: 2, ep_size: 2, sequence_parallel: true}
	fsdp_config: {dp_shard_size: 2, edp_shard_size: 2}
	dataset:
	  _target_: hyper_parallel.data.build_online_text_dataset
	  data_path: [x.jsonl]
	  data_config: {seq_length: 64}
	EOF
	hp-plan init.yaml --world 8 | hp-convert -q --plan - -o i8 &&
	hp-plan init.yaml --world 4 --accelerator.cp_size=1 --fsdp_config.edp_shard_size=1 | hp-convert -q --plan - -o i4 &&
	hp-plan init.yaml --world 2 --accelerator.tp_size=1 --accelerator.cp_size=1 --accelerator.sequence_parallel=false \
		--fsdp_config.dp_shard_size=2 --fsdp_config.edp_shard_size=1 | hp-convert -q --plan - -o i2 &&
	hp-plan init.yaml --world 1 --accelerator.tp_size=1 --accelerator.cp_size=1 --accelerator.ep_size=1 \
		--fsdp_config.dp_shard_size=1 --fsdp_config.edp_shard_size=1 | hp-convert -q --plan - -o i1 &&
	for w in 1 2 4 8; do hp-convert -q --export i$w -o ihf$w || return 1; done &&
	hp-test-tool stsame ihf1 ihf2 && hp-test-tool stsame ihf1 ihf4 && hp-test-tool stsame ihf1 ihf8 &&
	! hp-test-tool stsame ihf1 "$DATA/ref/qwen3-moe-a" >/dev/null &&
	hp-plan init.yaml --world 8 --training.seed=8 | hp-convert -q --plan - -o i8b &&
	hp-convert -q --export i8b -o ihf8b && ! hp-test-tool stsame ihf8 ihf8b >/dev/null
'

# bad CODE SUBSTRING ARGS...: hp-convert fails with CODE and one line naming
# SUBSTRING, and leaves neither the output nor a temporary behind
bad () {
	code=$1 msg=$2; shift 2
	test_must_fail_with "$code" hp-convert -q "$@" -o out 2>err &&
	test_one_line err && grep -F -q -e "$msg" err &&
	! test -e out && ! ls | grep -q "^out\.tmp\."
}

test_expect_success 'bad input: a plan made for another model' '
	bad 3 "architectures is [\"Qwen3ForCausalLM\"], the plan" --plan "$PLANS/fsdp-1.json" "$DATA/ref/qwen3-dense" &&
	grep -q "the plan was made for another model" err
'

test_expect_success 'bad input: a truncated or corrupt safetensors file' '
	mkdir -p trunc && cp "$DATA/ref/qwen3-dense/config.json" trunc/ &&
	head -c 30000 "$DATA/ref/qwen3-dense/model.safetensors" >trunc/model.safetensors &&
	bad 4 "trunc/model.safetensors" --plan "$PLANS/fsdp-2.json" trunc &&
	printf "\377\377\377\377\377\377\377\177garbage" >trunc/model.safetensors &&
	bad 4 "header length" --plan "$PLANS/fsdp-2.json" trunc
'

test_expect_success 'bad input: an index naming a missing file' '
	mkdir -p noshard && cp "$DATA/stories260K/hf-bf16-sharded/"* noshard/ &&
	rm noshard/model-00002-of-00002.safetensors &&
	plan_for "$PWD/noshard" 2 >pn.json &&
	bad 5 "model-00002-of-00002.safetensors" --plan pn.json noshard
'

test_expect_success 'bad input: a tensor the plan needs is missing, or one it does not know is there' '
	mkdir -p missing && cp "$DATA/ref/qwen3-dense/config.json" missing/ &&
	hp-test-tool stdrop "$DATA/ref/qwen3-dense/model.safetensors" missing/model.safetensors \
		model.layers.1.mlp.up_proj.weight &&
	bad 4 "tensor '\''model.layers.1.mlp.up_proj.weight'\'' that the plan needs is missing" \
		--plan "$PLANS/fsdp-2.json" missing
'

# The shim cannot go before a sanitizer's runtime, so ASan builds skip this.
if test -e "$HP_BUILD_DIR/t/libenospc.so" && ! ldd "$HP_BUILD_DIR/bin/hp-convert" | grep -q "libasan"; then
	test_set_prereq PRELOAD
fi
test_expect_success PRELOAD 'bad input: a write that fails (ENOSPC) leaves nothing behind' '
	HP_ENOSPC_AFTER=100000 LD_PRELOAD=$HP_BUILD_DIR/t/libenospc.so \
		hp-convert -q --plan "$PLANS/all-8.json" -o out "$DATA/ref/qwen3-moe-a" 2>err
	test $? = 5 && test_one_line err && grep -q "No space left on device" err &&
	! test -e out && ! ls | grep -q "^out\.tmp\."
'

test_expect_success 'one flipped byte in a shard is found, naming the tensor' '
	cp -r s-all-8 flip &&
	f=flip/rank-00003-of-00008.safetensors &&
	printf "\125" | dd of=$f bs=1 seek=$(($(stat -c %s $f) - 3)) conv=notrunc 2>/dev/null &&
	test_must_fail_with 4 hp-convert -q --verify flip 2>err &&
	test_one_line err &&
	grep -q "rank-00003-of-00008.safetensors.: tensor .model.norm.weight. fails its checksum" err &&
	bad 4 "fails its checksum" --export flip &&
	bad 4 "fails its checksum" --plan "$PLANS/ep-4.json" flip
'

test_expect_success 'shards of another plan, or a missing rank file, are refused' '
	cp -r s-all-8 other &&
	(cd "$PLANS" && hp-plan all-8.yaml --world 8 --training.seed=1) >other/plan.json &&
	test_must_fail_with 4 hp-convert -q --verify other 2>err &&
	grep -q "made for plan .*not for this plan" err &&
	cp -r s-all-8 gone && rm gone/rank-00005-of-00008.safetensors &&
	test_must_fail_with 5 hp-convert -q --verify gone 2>err &&
	grep -q "rank-00005-of-00008.safetensors.: cannot open" err
'

test_expect_success 'an output folder that exists and is not empty is refused' '
	mkdir -p full && touch full/x &&
	test_must_fail_with 5 hp-convert -q --plan "$PLANS/fsdp-2.json" -o full "$DATA/ref/qwen3-dense" 2>err &&
	grep -q "exists and is not empty" err && test -e full/x &&
	mkdir -p empty && hp-convert -q --plan "$PLANS/fsdp-2.json" -o empty "$DATA/ref/qwen3-dense"
'

test_expect_success 'command lines' '
	hp-convert -h >help && grep -q "^usage: hp-convert --plan" help &&
	test_must_fail_with 2 hp-convert 2>/dev/null &&
	test_must_fail_with 2 hp-convert --plan a --export b 2>/dev/null &&
	test_must_fail_with 2 hp-convert --export s-fsdp-2 --dtype f8 2>/dev/null &&
	test_must_fail_with 2 hp-convert --export s-fsdp-2 --max-shard-size lots 2>/dev/null &&
	test_must_fail_with 2 hp-convert --plan "$PLANS/fsdp-2.json" --dtype bf16 2>/dev/null &&
	test_must_fail_with 4 hp-convert --plan - -o never <"$PLANS/fsdp-2.yaml" 2>err &&
	test_one_line err && grep -q "<stdin>" err && ! test -e never
'

test_done
