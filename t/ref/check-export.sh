#!/bin/sh
# check-export.sh - transformers 4.57.6 and 5.24.0 load hp's exports of
# data/hf/ and give the source folders' logits bit for bit.
#
#     t/ref/check-export.sh          (after make, and t/ref/make-hf-goldens.sh once for the venvs)
#     HP_EXPORT_ONLY='qwen3_next-*' t/ref/check-export.sh   (the folders that glob names)
#
# Each golden folder goes through hp-plan, hp-convert (to one rank's shard)
# and hp-convert --export, then t/ref/check-export.py compares, in each
# release line's own environment.  Not part of make check (it needs torch).
set -eu
cd "$(dirname "$0")/../.."
B=${HP_BUILD_DIR:-$PWD/build}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for line in tf4 tf5; do
	for d in data/hf/$line/${HP_EXPORT_ONLY:-*}/; do
		[ -d "$d" ] || continue
		n=$(basename "$d")
		cat >"$W/c.yaml" <<-YAML
		model:
		  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained
		  pretrained_model_name_or_path: $PWD/$d
		training: {train_iters: 1, global_batch_size: 1, micro_batch_size: 1}
		dataset:
		  _target_: hyper_parallel.data.build_indexed_text_dataset
		  data_path: $W/none
		  data_config: {seq_length: 32, is_dataset_from_mr: true}
		YAML
		"$B/bin/hp-plan" "$W/c.yaml" --world 1 -o "$W/plan.json"
		rm -rf "$W/shards"
		"$B/bin/hp-convert" -q --plan "$W/plan.json" -o "$W/shards" "$d"
		mkdir -p "$W/out/$line" "$W/fb/$line"
		"$B/bin/hp-convert" -q --export "$W/shards" -o "$W/out/$line/$n"
		# the source folder gone: config.json from the plan's spec (not for
		# a multimodal folder, whose vision tower only its source holds)
		grep -q '"text_config"' "$d/config.json" && continue
		cp -r "$d" "$W/src" && sed -i "s|$PWD/$d|$W/src|" "$W/c.yaml" &&
		"$B/bin/hp-plan" "$W/c.yaml" --world 1 -o "$W/plan.json" && rm -rf "$W/shards" &&
		"$B/bin/hp-convert" -q --plan "$W/plan.json" -o "$W/shards" "$W/src" && rm -rf "$W/src" &&
		"$B/bin/hp-convert" -q --export "$W/shards" -o "$W/fb/$line/$n"
	done
done
PYTHONPATH=build/ref-tf4 build/ref-venv/bin/python t/ref/check-export.py "$W/out" 4
PYTHONPATH=build/ref-accel build/ref-venv/bin/python t/ref/check-export.py "$W/out" 5
PYTHONPATH=build/ref-tf4 build/ref-venv/bin/python t/ref/check-export.py --logits-only "$W/fb" 4
PYTHONPATH=build/ref-accel build/ref-venv/bin/python t/ref/check-export.py --logits-only "$W/fb" 5
