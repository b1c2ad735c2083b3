#!/bin/sh
# t/t0940 on the CUDA backend (training.device: cuda, HP_CUDA_EMULATE=exact):
# hp-verify holds every layout to the one-process model on the same
# backend, and names each injected fault where it happens, as on the CPU.
DEVICE_ARGS=--training.device=cuda
HP_CUDA_EMULATE=exact
export HP_CUDA_EMULATE
. "$(dirname "$0")/t0940-verify.sh"
