#!/bin/sh
# make-hf-goldens.sh - regenerate data/hf/ from transformers itself.
#
#     t/ref/make-hf-goldens.sh [OUTDIR]          (default: data/hf)
#
# Installs, once, into build/ref-venv torch 2.15.0 (CPU, from PyPI: about
# 5 GB with its CUDA wheels), transformers 5.24.0 and safetensors; and into
# build/ref-tf4 transformers 4.57.6 (the last 4.x), which shadows 5.24.0 on
# PYTHONPATH for the 4.x run.  Then runs t/ref/make-hf-goldens.py once per
# release line.  Needs the network the first time (PyPI only); make check
# never runs it.
set -eu
cd "$(dirname "$0")/../.."
OUT=${1:-data/hf}
VENV=build/ref-venv
TF4=build/ref-tf4
if ! "$VENV/bin/python" -c 'import torch, transformers, safetensors' 2>/dev/null; then
	python3 -m venv "$VENV"
	"$VENV/bin/pip" install -q 'torch==2.15.0' 'transformers==5.24.0' 'safetensors==0.8.0' numpy
fi
if ! PYTHONPATH=$TF4 "$VENV/bin/python" -c 'import transformers; assert transformers.__version__ == "4.57.6"' 2>/dev/null; then
	rm -rf "$TF4"
	"$VENV/bin/pip" install -q --target "$TF4" 'transformers==4.57.6'
fi
mkdir -p "$OUT"
OMP_NUM_THREADS=1 PYTHONHASHSEED=0 PYTHONPATH=$TF4 "$VENV/bin/python" t/ref/make-hf-goldens.py "$OUT" 4
OMP_NUM_THREADS=1 PYTHONHASHSEED=0 "$VENV/bin/python" t/ref/make-hf-goldens.py "$OUT" 5
