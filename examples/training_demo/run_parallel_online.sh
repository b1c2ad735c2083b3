#!/bin/sh
# run_parallel_online.sh - the seed's 8-rank training demo, online data:
# TinyStories as JSONL, tokenized while training and packed into rows of
# 256 tokens (block-diagonal masks), otherwise as run_parallel_offline.sh.
#
# usage: run_parallel_online.sh [MODEL_DIR | CONFIG.yaml] [--a.b=c ...]
# Everything lands in $HP_DEMO_DIR (default build/training_demo/online).
HP_DEMO_MODE=online exec sh "$(dirname "$0")/run_parallel_offline.sh" "$@"
