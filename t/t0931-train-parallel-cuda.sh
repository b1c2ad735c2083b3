#!/bin/sh
# t/t0930's layouts, each against the same one-process CPU run, on the
# CUDA backend: training.device: cuda, its kernels emulated on the host in
# exact mode (HP_CUDA_EMULATE=exact: bf16 values keep their fp32 bits), its
# collectives host-staged; then the device-only checks of t0930 (bf16
# rounding, mix_precision).  No GPU needed: the CUDA backend's own code
# runs; the CUDA kernels are the emulation's (t/t0960 holds those to the
# CPU's).
DEVICE_ARGS=--training.device=cuda
HP_CUDA_EMULATE=exact
export HP_CUDA_EMULATE
. "$(dirname "$0")/t0930-train-parallel.sh"
