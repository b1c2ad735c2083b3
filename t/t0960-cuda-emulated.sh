#!/bin/sh
test_description='kernels/cuda under the CPU emulation (t/cuemu): the CUDA op tests pass without a GPU'
. "$(dirname "$0")/test-lib.sh"

# build/t/test-cuda-emu, test-cuda-attn-emu and test-cuda-gemm-emu are
# t/unit/test-cuda.c, test-cuda-attn.c and test-cuda-gemm.c (its
# cross-entropy and AdamW; the GEMMs are cuBLASLt's) linked
# with the real kernel sources (context, elementwise, moe, ce, adamw,
# attnsmall) compiled by g++ against t/cuemu: every block's threads run as
# fibers; barrier deadlocks or divergence, shuffles with exited lanes, bad
# launch shapes and over 48 KiB of shared memory abort.  Small shapes only;
# head dims 64 and 128 (flashattn.cu, mma.sync) are skipped.
emu="$HP_BUILD_DIR/t/test-cuda-emu"
attn="$HP_BUILD_DIR/t/test-cuda-attn-emu"
gemm="$HP_BUILD_DIR/t/test-cuda-gemm-emu"
[ -x "$emu" ] && [ -x "$attn" ] && [ -x "$gemm" ] ||
	test_skip_all 'emulated CUDA tests not built (t/cuemu needs g++ and perl)'

# $1 program, $2 output; every planned test passes
emu_run () {
	HP_CUDA_TEST_SMALL=1 HP_CUDA_EMULATED=1 "$1" >"$2" 2>"$2.err" || { cat "$2" "$2.err"; return 1; }
	cat "$2"
	plan=$(sed -n 's/^1\.\.\([0-9][0-9]*\)$/\1/p' "$2")
	test -n "$plan" && test "$plan" -gt 0 &&
	test "$(grep -c '^ok ' "$2")" = "$plan" &&
	! grep -q '^not ok' "$2"
}

test_expect_success 'element-wise, RMSNorm, RoPE, SwiGLU, embedding, MoE routing: the CPU reference, emulated' '
	emu_run "$emu" out1
'

test_expect_success 'attention at the small head dims (attnsmall.cu): the CPU reference, emulated' '
	emu_run "$attn" out2
'

test_expect_success 'cross-entropy (ce.cu) and AdamW (adamw.cu): the CPU reference, emulated' '
	emu_run "$gemm" out3
'

# each warp runs from barrier to barrier before the next starts, and each
# lane up to its next warp op before the next lane: in the reverse order
# (last block, warp and lane first) too, a missing __syncthreads or
# __syncwarp, or a dependence between blocks, shows as a different result
test_expect_success 'the same in the reverse thread and block order: the same TAP lines' '
	CUEMU_REVERSE=1 emu_run "$emu" rev1 &&
	CUEMU_REVERSE=1 emu_run "$attn" rev2 &&
	cmp out1 rev1 &&
	CUEMU_REVERSE=1 emu_run "$gemm" rev3 &&
	cmp out2 rev2 &&
	cmp out3 rev3
'

test_done
