#!/bin/sh
# bench/moe-bench.sh - training tokens/s of a Qwen3-MoE at world size 1:
# hp-train against PyTorch running the faithful port of HF's modeling code
# (t/ref/qwen3_ref.py; transformers itself does not import on Debian's
# torch 1.13), same weights, same token batches, same threads, in one run.
# Config (the issue's): hidden 256, 4 layers, 16 experts, top-4,
# moe_intermediate_size 128, seq 256, batch 4; 10 steps, first 2 untimed.
set -u

src=$(cd "$(dirname "$0")/.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
py=${HP_BENCH_PYTHON:-/usr/bin/python3}
steps=${HP_BENCH_STEPS:-10}
[ -x "$build/bin/hp-train" ] || { echo "moe-bench: hp-train not built" >&2; exit 1; }
"$py" -c 'import torch' 2>/dev/null || { echo "moe-bench: no torch in $py; skipped" >&2; exit 0; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/hp-moe-bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

"$py" "$src/bench/moe_torch.py" make "$tmp/model" || exit 1
"$build/bin/hp-test-tool" mkidx --vocab 512 --records-of 257 -o "$tmp/ts" \
	"$src/data/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" || exit 1
cat >"$tmp/moe.yaml" <<YAML
model:
  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained
  pretrained_model_name_or_path: $tmp/model
training: {train_iters: $steps, global_batch_size: 4, micro_batch_size: 4, max_grad_norm: 1.0, seed: 1}
checkpoint: {save_ckpt: false}
dataset:
  _target_: hyper_parallel.data.build_indexed_text_dataset
  data_path: $tmp/ts
  data_config: {seq_length: 256, is_dataset_from_mr: true}
optimizer:
  _target_: hyper_parallel.components.optim.AdamW
  adamw_config: {adamw_lr: 1.0e-3, adamw_weight_decay: 0.1, adamw_betas: [0.9, 0.95]}
  no_decay_params: [norm, bias]
YAML

printf '\n%s\n' "Qwen3-MoE (hidden 256, 4 layers, 16 experts top-4, moe_intermediate 128), batch 4 x seq 256, $steps steps"
printf '%-8s %12s %12s %8s  %s\n' threads "hp tok/s" "torch tok/s" ratio "first loss hp / torch"
for t in ${HP_BENCH_THREADS:-1 2}; do
	OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t "$build/bin/hp-train" -q "$tmp/moe.yaml" \
		--metrics "$tmp/m$t.jsonl" || exit 1
	hp=$(python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
print(sum(r["tokens"] for r in rows) / sum(r["step_time_s"] for r in rows))' "$tmp/m$t.jsonl")
	hpl=$(head -n 1 "$tmp/m$t.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
	th=$(OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t "$py" "$src/bench/moe_torch.py" train "$tmp/model" "$tmp/ts" \
		"$t" "$steps" 4 256) || exit 1
	printf '%s\n' "$th" | python3 -c '
import json, sys
th = json.loads(sys.stdin.read()); hp = float(sys.argv[2])
print("%-8s %12.0f %12.0f %7.2fx  %.6f / %.6f" % (sys.argv[1], hp, th["tokens_per_s"], hp / th["tokens_per_s"],
      float(sys.argv[3]), th["first_loss"]))' "$t" "$hp" "$hpl"
done
echo "target: >= 1.5x"
