#!/bin/sh
# run.sh - the main demo (`make demo`): fine-tune stories260K on TinyStories.
#
# 1. tokenize the TinyStories validation text with the model's own
#    tokenizer.json (hp-data build) into a Megatron indexed dataset of
#    129-token records, the offline mode's input;
# 2. check the model against PyTorch's reference gradients (one step);
# 3. train 200 steps offline with hp-train, metrics to metrics.jsonl;
# 4. train 60 steps in online mode on Pride and Prejudice (raw text,
#    tokenized while training, packed rows), metrics to online.jsonl;
# 5. plot both loss curves to loss.png (gnuplot, when installed).
# Everything lands in $HP_BUILD_DIR/demo (default build/demo).
set -eu

src=$(cd "$(dirname "$0")/../.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
out=$build/demo
PATH=$build/bin:$PATH
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}

command -v hp-train >/dev/null || { echo "run.sh: hp-train not built; run make first" >&2; exit 1; }
mkdir -p "$out"
cd "$out"

echo "== 1. data: TinyStories text -> $out/tinystories.{bin,idx}"
hp-data build --tokenizer "$src/data/stories260K/hf" --format text --append-eod --pack-to-seq-len 128 \
	-o tinystories "$src/data/corpus/tinystories_val_excerpt.txt" 2>&1 | sed 's/^/   /'

echo "== 2. one step on PyTorch's reference batch: loss and gradients"
jq -c '.loss_and_grads as $l | range(0; 2) as $b | {ids: ($l.input_ids[$b] + [$l.target_ids[$b][-1]])}' \
	"$src/data/stories260K/reference/reference.json" >refbatch.jsonl
hp-test-tool mkidx --vocab 512 -o refbatch refbatch.jsonl
hp-train -q "$src/examples/stories260K/train.yaml" --training.train_iters=1 \
	--training.global_batch_size=2 --training.micro_batch_size=2 \
	--dataset.data_path="$out/refbatch" --metrics ref.jsonl --dump-grads grads.safetensors
echo "   loss $(jq .loss ref.jsonl)   (PyTorch float64: 1.3300582624570836)"
hp-test-tool cmpst --max-rel-l2 1e-4 grads.safetensors \
	"$src/data/stories260K/reference/grads_batch.safetensors" |
	awk '{ if ($5 > w) { w = $5; n = $1 } } END { printf "   worst gradient relative L2 error: %.2e (%s)\n", w, n }'

echo "== 3. fine-tune 200 steps (offline)"
hp-train "$src/examples/stories260K/train.yaml" --dataset.data_path="$out/tinystories" \
	--metrics metrics.jsonl | grep '^step'
first=$(head -n 10 metrics.jsonl | jq -s 'map(.loss) | add / length')
last=$(tail -n 10 metrics.jsonl | jq -s 'map(.loss) | add / length')
tps=$(jq -s 'map(.tokens) | add' metrics.jsonl)
secs=$(jq -s 'map(.step_time_s) | add' metrics.jsonl)
echo "   mean loss steps 1-10: $first -> steps 191-200: $last"
echo "   $tps tokens in $(printf %.2f "$secs") s of steps"

echo "== 4. online mode: 60 steps on Pride and Prejudice, tokenized while training"
hp-train "$src/examples/stories260K/online.yaml" --metrics online.jsonl | grep -E '^(step|data\.)'
first=$(head -n 5 online.jsonl | jq -s 'map(.loss) | add / length')
last=$(tail -n 5 online.jsonl | jq -s 'map(.loss) | add / length')
echo "   mean loss steps 1-5: $first -> steps 56-60: $last"

echo "== 5. loss curves"
if command -v gnuplot >/dev/null; then
	w=20    # running mean over 20 steps
	jq -r '[.step, .loss] | @tsv' metrics.jsonl |
		awk -v w="$w" '{ l[NR] = $2; s += $2; if (NR > w) s -= l[NR - w];
			printf "%s\t%s\t%s\n", $1, $2, (NR >= w ? s / w : "NaN") }' >loss.tsv
	jq -r '[.step, .loss] | @tsv' online.jsonl >online.tsv
	gnuplot <<-GP
	set terminal pngcairo size 800,480 noenhanced
	set output "loss.png"
	set title "stories260K fine-tunes (hp-train, 1 process)"
	set xlabel "step"; set ylabel "loss (token-weighted cross-entropy)"
	set grid
	plot "loss.tsv" using 1:2 with lines lw 1 title "offline, TinyStories (per step)", \\
	     "loss.tsv" using 1:3 with lines lw 3 title "offline, mean of the last $w steps", \\
	     "online.tsv" using 1:2 with lines lw 2 title "online, Pride and Prejudice"
	GP
	echo "   $out/loss.png"
else
	echo "   gnuplot not installed: no plot (apt-get install gnuplot-nox)"
fi
echo "results: $out/metrics.jsonl $out/online.jsonl $out/grads.safetensors"
