#!/bin/sh
# make-hf-goldens.sh - regenerate data/hf/ from transformers itself.
#
#     t/ref/make-hf-goldens.sh [OUTDIR]          (default: data/hf)
#
# Makes, once, build/ref-venv with scripts/ref-venv.sh (torch 2.15.0 from
# PyPI: about 5.6 GB with its CUDA wheels, only the CPU used; transformers
# 5.24.0, safetensors 0.8.0, numpy: the venv `make bench` times torch 2.x
# in); and installs into build/ref-tf4 transformers 4.57.6 (the last 4.x),
# which shadows 5.24.0 on PYTHONPATH for the 4.x run, and accelerate
# 1.12.0 into build/ref-accel (transformers' MXFP4 loader imports it).  Then
# runs t/ref/make-hf-goldens.py once per release line and
# t/ref/make-mxfp4-golden.py.  Needs the network the
# first time (PyPI only); make check never runs it.
set -eu
cd "$(dirname "$0")/../.."
OUT=${1:-data/hf}
VENV=build/ref-venv
TF4=build/ref-tf4
sh scripts/ref-venv.sh "$VENV" >/dev/null
if ! PYTHONPATH=$TF4 "$VENV/bin/python" -c 'import transformers; assert transformers.__version__ == "4.57.6"' 2>/dev/null; then
	rm -rf "$TF4"
	"$VENV/bin/pip" install -q --target "$TF4" 'transformers==4.57.6'
fi
mkdir -p "$OUT"
OMP_NUM_THREADS=1 PYTHONHASHSEED=0 PYTHONPATH=$TF4 "$VENV/bin/python" t/ref/make-hf-goldens.py "$OUT" 4
OMP_NUM_THREADS=1 PYTHONHASHSEED=0 "$VENV/bin/python" t/ref/make-hf-goldens.py "$OUT" 5
# gpt_oss-mxfp4: transformers' mxfp4 quantizer imports accelerate
ACCEL=build/ref-accel
if ! PYTHONPATH=$ACCEL "$VENV/bin/python" -c 'import accelerate; assert accelerate.__version__ == "1.12.0"' 2>/dev/null; then
	rm -rf "$ACCEL"
	"$VENV/bin/pip" install -q --no-deps --target "$ACCEL" 'accelerate==1.12.0'
fi
OMP_NUM_THREADS=1 PYTHONHASHSEED=0 PYTHONPATH=$ACCEL "$VENV/bin/python" t/ref/make-mxfp4-golden.py "$OUT"
# qwen3_5_moe-vl: Qwen3.5-MoE's multimodal folder, from qwen3_5_moe-default
OMP_NUM_THREADS=1 PYTHONHASHSEED=0 "$VENV/bin/python" t/ref/make-vl-golden.py "$OUT"
