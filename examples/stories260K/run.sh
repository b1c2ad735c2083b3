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
# 5. supervised fine-tuning on conversations (sft.jsonl, the Mistral-Instruct
#    chat template, loss on the assistant's replies), metrics to sft.jsonl;
# 6. plot the loss curves to loss.png (gnuplot, when installed).
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

echo "== 1. data: TinyStories text -> $out/tinystories.{bin,idx}, the last 400 lines held out"
head -n -400 "$src/data/corpus/tinystories_val_excerpt.txt" >train.txt
tail -n 400 "$src/data/corpus/tinystories_val_excerpt.txt" >heldout.txt
hp-data build --tokenizer "$src/data/stories260K/hf" --format text --append-eod --pack-to-seq-len 128 \
	-o tinystories train.txt 2>&1 | sed 's/^/   /'
held=$(hp-data build --tokenizer "$src/data/stories260K/hf" --format text --append-eod --pack-to-seq-len 128 \
	-o heldout heldout.txt 2>&1 | sed -n 's/^hp-data: \([0-9]*\) sequences of .*/\1/p')
[ -n "$held" ] && [ "$held" -gt 0 ] || { echo "run.sh: no held-out records" >&2; exit 1; }
[ "$held" -le 64 ] || held=64

# val_loss MODEL_DIR: the mean loss over the held-out records (one step at
# learning rate 0 reads them all; nothing is saved)
val_loss () {
	hp-train -q "$src/examples/stories260K/train.yaml" --model.pretrained_model_name_or_path="$1" \
		--dataset.data_path="$out/heldout" --training.train_iters=1 --training.global_batch_size=$held \
		--training.micro_batch_size=$held --optimizer.adamw_config.adamw_lr=0 --lr_scheduler.lr_config.lr=0 \
		--lr_scheduler.lr_config.min_lr=0 --checkpoint.save_ckpt=false --metrics val.jsonl &&
	jq .loss val.jsonl
}

echo "== 2. one step on PyTorch's reference batch: loss and gradients"
jq -c '.loss_and_grads as $l | range(0; 2) as $b | {ids: ($l.input_ids[$b] + [$l.target_ids[$b][-1]])}' \
	"$src/data/stories260K/reference/reference.json" >refbatch.jsonl
hp-test-tool mkidx --vocab 512 -o refbatch refbatch.jsonl
hp-train -q "$src/examples/stories260K/train.yaml" --training.train_iters=1 \
	--training.global_batch_size=2 --training.micro_batch_size=2 \
	--dataset.data_path="$out/refbatch" --checkpoint.save_ckpt=false --metrics ref.jsonl \
	--dump-grads grads.safetensors
echo "   loss $(jq .loss ref.jsonl)   (PyTorch float64: 1.3300582624570836)"
hp-test-tool cmpst --max-rel-l2 1e-4 grads.safetensors \
	"$src/data/stories260K/reference/grads_batch.safetensors" |
	awk '{ if ($5 > w) { w = $5; n = $1 } } END { printf "   worst gradient relative L2 error: %.2e (%s)\n", w, n }'

echo "== 3. fine-tune 200 steps (offline), then export it"
v0=$(val_loss "$src/data/stories260K/hf")
rm -rf checkpoints
hp-train "$src/examples/stories260K/train.yaml" --dataset.data_path="$out/tinystories" \
	--checkpoint.checkpoint_dir="$out/checkpoints" --checkpoint.save_consolidated=final \
	--metrics metrics.jsonl | grep -E '^(step|checkpoint:)'
v1=$(val_loss "$out/checkpoints/global_step_200/hf")
echo "   held-out loss ($held records of 129 tokens): $v0 before -> $v1 after"
rm -rf hf
hp-convert -q --export checkpoints/global_step_200/model -o hf
ids="1 403 407 261 378 260 275 326 259 370 401 284 1097"
hp-test-tool logits -o logits-hf.safetensors hf $ids
hp-test-tool logits -o logits-ckpt.safetensors checkpoints/global_step_200/hf $ids
cmp logits-hf.safetensors logits-ckpt.safetensors &&
	echo "   $out/hf: the exported folder gives the checkpoint's logits, bit for bit"
awk -v a="$v0" -v b="$v1" 'BEGIN { exit !(b < a) }' || { echo "the held-out loss did not go down" >&2; exit 1; }
first=$(head -n 10 metrics.jsonl | jq -s 'map(.loss) | add / length')
last=$(tail -n 10 metrics.jsonl | jq -s 'map(.loss) | add / length')
tps=$(jq -s 'map(.tokens) | add' metrics.jsonl)
secs=$(jq -s 'map(.step_time_s) | add' metrics.jsonl)
echo "   mean loss steps 1-10: $first -> steps 191-200: $last"
echo "   $tps tokens in $(printf %.2f "$secs") s of steps"

echo "== 4. online mode: 60 steps on Pride and Prejudice, tokenized while training"
hp-train "$src/examples/stories260K/online.yaml" --checkpoint.save_ckpt=false --metrics online.jsonl |
	grep -E '^(step|data\.)'
first=$(head -n 5 online.jsonl | jq -s 'map(.loss) | add / length')
last=$(tail -n 5 online.jsonl | jq -s 'map(.loss) | add / length')
echo "   mean loss steps 1-5: $first -> steps 56-60: $last"

echo "== 5. supervised fine-tuning: 60 steps on conversations, loss on the assistant's replies"
rm -f sft-metrics.jsonl
hp-train "$src/examples/stories260K/sft.yaml" --checkpoint.save_ckpt=false --metrics sft-metrics.jsonl |
	grep -E '^(step|eval|data\.(conversations|packing))'
e0=$(jq -s 'map(select(.eval_loss != null)) | first | .eval_loss' sft-metrics.jsonl)
e1=$(jq -s 'map(select(.eval_loss != null)) | last | .eval_loss' sft-metrics.jsonl)
echo "   validation loss on the assistant's tokens: step 10 $e0 -> step 60 $e1"
awk -v a="$e0" -v b="$e1" 'BEGIN { exit !(b < a) }' ||
	{ echo "the assistant-token validation loss did not go down" >&2; exit 1; }

echo "== 6. loss curves"
if command -v gnuplot >/dev/null; then
	w=20    # running mean over 20 steps
	jq -r '[.step, .loss] | @tsv' metrics.jsonl |
		awk -v w="$w" '{ l[NR] = $2; s += $2; if (NR > w) s -= l[NR - w];
			printf "%s\t%s\t%s\n", $1, $2, (NR >= w ? s / w : "NaN") }' >loss.tsv
	jq -r '[.step, .loss] | @tsv' online.jsonl >online.tsv
	jq -r '[.step, .loss] | @tsv' sft-metrics.jsonl >sft.tsv
	gnuplot <<-GP
	set terminal pngcairo size 800,480 noenhanced
	set output "loss.png"
	set title "stories260K fine-tunes (hp-train, 1 process)"
	set xlabel "step"; set ylabel "loss (token-weighted cross-entropy)"
	set grid
	plot "loss.tsv" using 1:2 with lines lw 1 title "offline, TinyStories (per step)", \\
	     "loss.tsv" using 1:3 with lines lw 3 title "offline, mean of the last $w steps", \\
	     "online.tsv" using 1:2 with lines lw 2 title "online, Pride and Prejudice", \\
	     "sft.tsv" using 1:2 with lines lw 2 title "SFT, conversations (assistant tokens)"
	GP
	echo "   $out/loss.png"
else
	echo "   gnuplot not installed: no plot (sh scripts/install-deps.sh installs gnuplot-nox)"
fi
echo "results: $out/metrics.jsonl $out/online.jsonl $out/sft-metrics.jsonl $out/grads.safetensors $out/hf"
