#!/bin/sh
# t/t0936's pipeline layouts on the CUDA backend: training.device: cuda,
# its kernels emulated on the host in exact mode, its point-to-point and
# collectives host-staged (as where ranks share a GPU).  No GPU needed.
DEVICE_ARGS=--training.device=cuda
HP_CUDA_EMULATE=exact
export HP_CUDA_EMULATE
. "$(dirname "$0")/t0936-train-pipeline.sh"
