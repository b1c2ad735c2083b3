#!/bin/sh
# run_parallel_offline.sh - the seed's 8-rank training demo, offline data.
#
# usage: run_parallel_offline.sh [MODEL_DIR | CONFIG.yaml] [--a.b=c ...]
#
# With no argument it trains train_parallel.yaml: a Qwen3-MoE cropped to 4
# layers, TP2 x CP2 x EP2 with FSDP, the three kernel replacements.  A
# MODEL_DIR (an HF folder of a Llama, Qwen3 or Qwen3-MoE) trains that model
# from its weights in the same layout; a CONFIG.yaml replaces the config.
# The overrides go to hp-plan, as HyperParallel's trainer takes them.
#
#   1. hp-data: TinyStories text -> a Megatron indexed dataset of 257-token
#      records, with the model's tokenizer (stories260K's for the demo model)
#   2. hp-plan: the config for 8 ranks -> plan.json
#   3. hp-convert: the weights (or the random init) -> one shard per rank
#   4. mpiexec -n 8 hp-verify: two steps against the one-process model
#   5. mpiexec -n 8 hp-train: train, checkpoints every 20 steps, the
#      validation loss every 10 (split 98,1,1 of the records), the test
#      loss at the end
#   6. hp-convert --export: the last checkpoint -> an HF folder
#   7. the training and validation loss curves -> loss.png (gnuplot, when
#      installed)
# Everything lands in $HP_DEMO_DIR (default build/training_demo/offline).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
mode=${HP_DEMO_MODE:-offline}
out=${HP_DEMO_DIR:-$build/training_demo/$mode}
ranks=${HP_DEMO_RANKS:-8}
PATH=$build/bin:$PATH
export OPENBLAS_NUM_THREADS=1

command -v hp-train >/dev/null || { echo "run_parallel_$mode.sh: hp-train not built; run make first" >&2; exit 1; }
command -v mpiexec >/dev/null || { echo "run_parallel_$mode.sh: needs mpiexec (sh scripts/install-deps.sh installs mpich, as root or through sudo)" >&2; exit 1; }

# the config, with its relative paths made absolute so it can live in $out
config=$here/train_parallel.yaml model=
tok=$src/data/stories260K/hf
if [ $# -ge 1 ] && [ "${1#--}" = "$1" ]; then
	if [ -d "$1" ]; then
		model=$(cd "$1" && pwd)
		# its own tokenizer, else stories260K's (a 512-token vocabulary)
		[ -f "$model/tokenizer.json" ] && tok=$model
	else
		config=$1
	fi
	shift
fi
rm -rf "$out"
mkdir -p "$out/data"
sed -e "s#config_path: qwen3_moe_demo#config_path: $here/qwen3_moe_demo#" "$config" >"$out/train.yaml"
if [ -n "$model" ]; then
	# from the folder's weights: the model section replaced
	awk -v m="$model" '/^model:/ { print "model:\n  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained\n  pretrained_model_name_or_path: " m "\n  torch_dtype: float32"; skip = 1; next }
		skip && /^[^ ]/ { skip = 0 } !skip' "$out/train.yaml" >"$out/train.yaml.new"
	mv "$out/train.yaml.new" "$out/train.yaml"
fi
if [ "$mode" = online ]; then
	# raw JSONL, tokenized while training and packed into rows
	jq -R -c '{text: .}' "$src/data/corpus/tinystories_val_excerpt.txt" | grep -v '^{"text":""}$' >"$out/data/stories.jsonl"
	awk -v d="$out/data/stories.jsonl" -v t="$tok" '/^dataset:/ {
		print "dataset:\n  _target_: hyper_parallel.data.build_online_text_dataset\n  data_path: [" d "]"
		print "  model_assets:\n    tokenizer: {pretrained_model_name_or_path: " t "}"
		print "  data_transform: {data_type: plaintext, text_keys: [text], max_seq_len: 256}"
		print "  data_config: {shuffle: true}"; skip = 1; next }
		skip && /^[^ ]/ { skip = 0 } !skip' "$out/train.yaml" >"$out/train.yaml.new"
	mv "$out/train.yaml.new" "$out/train.yaml"
fi
cd "$out"
set -- --dataset.data_path="$out/data/tinystories" --checkpoint.checkpoint_dir="$out/checkpoints" "$@"
[ "$mode" = online ] && shift

if [ "$mode" = offline ]; then
	echo "== 1. data: TinyStories text -> $out/data/tinystories.{bin,idx}"
	hp-data build --tokenizer "$tok" --format text --append-eod --pack-to-seq-len 256 \
		-o data/tinystories "$src/data/corpus/tinystories_val_excerpt.txt" 2>&1 | sed 's/^/   /'
else
	echo "== 1. data: TinyStories as JSONL, tokenized while training -> $out/data/stories.jsonl"
fi

echo "== 2. hp-plan for $ranks ranks -> plan.json"
hp-plan train.yaml --world "$ranks" "$@" -o plan.json
hp-plan --explain plan.json | sed -n '1,12p' | sed 's/^/   /'

echo "== 3. hp-convert -> shards/ (one file per rank)"
if [ -n "$model" ]; then
	mpiexec -n "$ranks" hp-convert -q --plan plan.json "$model" -o shards
else
	mpiexec -n "$ranks" hp-convert -q --plan plan.json -o shards
fi
ls shards | sed 's/^/   /' | head -n 3

echo "== 4. mpiexec -n $ranks hp-verify: the layout against the one-process model, 2 steps"
mpiexec -n "$ranks" hp-verify plan.json --shards shards --steps 2 >verify.txt
tail -n 1 verify.txt | sed 's/^/   /'

echo "== 5. mpiexec -n $ranks hp-train (metrics -> metrics.jsonl)"
mpiexec -n "$ranks" hp-train plan.json --shards shards --metrics metrics.jsonl |
	grep -E '^(step |eval |test |comm:|memory:|fsdp:|checkpoint:)' | sed 's/^/   /'

last=$(cat checkpoints/latest_checkpoint_iteration.txt)
echo "== 6. hp-convert --export: checkpoints/global_step_$last -> hf/"
hp-convert -q --export "checkpoints/global_step_$last/model" -o hf
ls hf | sed 's/^/   /'

echo "== 7. loss curve"
first=$(head -n 5 metrics.jsonl | jq -s 'map(.loss) | add / length')
end=$(tail -n 5 metrics.jsonl | jq -s 'map(.loss) | add / length')
echo "   mean loss of the first 5 steps $first -> of the last 5 $end"
ev=$(jq -r 'select(.eval_loss != null) | "\(.step): \(.eval_loss * 10000 | round / 10000)"' metrics.jsonl | paste -sd ' ' -)
[ -z "$ev" ] || echo "   validation loss after step $ev"
if command -v gnuplot >/dev/null; then
	jq -r '[.step, .loss] | @tsv' metrics.jsonl >loss.tsv
	jq -r 'select(.eval_loss != null) | [.step, .eval_loss] | @tsv' metrics.jsonl >eval.tsv
	plot="'loss.tsv' using 1:2 with lines title 'training loss'"
	[ -s eval.tsv ] && plot="$plot, 'eval.tsv' using 1:2 with linespoints pt 7 title 'validation loss'"
	gnuplot -e "set terminal png size 800,480 noenhanced; set output 'loss.png'; set xlabel 'step'; set ylabel 'loss';
		set title 'hp training_demo ($mode): $ranks ranks, $(jq -r '.parallel | "pp \(.pp), tp \(.tp), cp \(.cp), ep \(.ep)"' plan.json) + FSDP'; set grid;
		plot $plot"
	echo "   loss.png"
fi
echo "results in $out: metrics.jsonl, loss.png, verify.txt, checkpoints/, hf/"
awk -v a="$first" -v b="$end" 'BEGIN { exit !(b < a) }' || { echo "the loss did not go down" >&2; exit 1; }
