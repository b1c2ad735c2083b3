#!/bin/sh
test_description='kernels/cuda under the CPU emulation (t/cuemu): the CUDA kernel tests pass without a GPU'
. "$(dirname "$0")/test-lib.sh"

# build/t/test-cuda-emu, test-cuda-attn-emu and test-cuda-gemm-emu are
# t/unit/test-cuda.c, test-cuda-attn.c and test-cuda-gemm.c linked with the
# real kernel sources (context, elementwise, linear, moe, grouped, ce, adamw,
# attn, attnsmall, oss, gdn) compiled by g++ against t/cuemu: every block's threads run as
# fibers; barrier deadlocks or divergence, shuffles with exited lanes, bad
# launch shapes, over 48 KiB of shared memory and overlapping copies abort.
# Small shapes only; head dims 64 and 128 (flashattn.cu, mma.sync) are
# skipped, and a host GEMM stands in for gemm.cu's cuBLASLt, so the linear
# tests check linear.cu's code around the GEMM, not cuBLASLt; grouped.cu's
# wmma runs over t/cuemu/include/mma.h (every lane the whole 16x16 tile).
emu="$HP_BUILD_DIR/t/test-cuda-emu"
attn="$HP_BUILD_DIR/t/test-cuda-attn-emu"
gemm="$HP_BUILD_DIR/t/test-cuda-gemm-emu"
if [ -x "$emu" ] && [ -x "$attn" ] && [ -x "$gemm" ]; then test_set_prereq CUEMU; fi

# $1 program, $2 output; every planned test passes
emu_run () {
	HP_CUDA_TEST_SMALL=1 HP_CUDA_EMULATED=1 "$1" >"$2" 2>"$2.err" || { cat "$2" "$2.err"; return 1; }
	cat "$2"
	plan=$(sed -n 's/^1\.\.\([0-9][0-9]*\)$/\1/p' "$2")
	test -n "$plan" && test "$plan" -gt 0 &&
	test "$(grep -c '^ok ' "$2")" = "$plan" &&
	! grep -q '^not ok' "$2"
}

# The kernel interface is one list in four places: kernels/cuda/ops.h
# declares it, kernels/cuda/*.cu define it, kernels/cuda/emu_names.h renames
# it for the host emulation and lib/backend/cuda_emu.c defines that.  A function in
# one and not another fails to link only in some builds; here, in every one.
ops="$HP_SRC_DIR/kernels/cuda/ops.h"
test_expect_success 'cuda/ops.h, kernels/cuda/*.cu, cuda/emu_names.h and lib/backend/cuda_emu.c name the same functions' '
	sed -n "s/^[a-z].*[ *]\(hp_cuda_[a-z0-9_]*\)(.*/\1/p" "$ops" | sort -u >declared &&
	test "$(wc -l <declared)" -gt 40 &&
	grep -ho "^extern \"C\" [^(]*hp_cuda_[a-z0-9_]*(" "$HP_SRC_DIR"/kernels/cuda/*.cu |
		sed "s/.*\(hp_cuda_[a-z0-9_]*\)(/\1/" | sort -u >defined &&
	sed -n "s/^#define \(hp_cuda_[a-z0-9_]*\) hp_emu_[a-z0-9_]*\$/\1/p" \
		"$HP_SRC_DIR/kernels/cuda/emu_names.h" | sort -u >renamed &&
	sed -n "s/^#define hp_cuda_\([a-z0-9_]*\) hp_emu_\([a-z0-9_]*\)\$/\1 \2/p" \
		"$HP_SRC_DIR/kernels/cuda/emu_names.h" | awk "\$1 != \$2" >misnamed &&
	sed -n "s/^[a-z].*[ *]hp_emu_\([a-z0-9_]*\)(.*/hp_cuda_\1/p" "$HP_SRC_DIR/lib/backend/cuda_emu.c" |
		sort -u >emulated &&
	diff -u declared defined &&
	diff -u declared renamed &&
	test ! -s misnamed &&
	comm -23 declared emulated >missing &&
	test ! -s missing
'

test_expect_success CUEMU 'element-wise, RMSNorm, RoPE, SwiGLU, embedding, MoE routing: the CPU kernels, emulated' '
	emu_run "$emu" out1
'

test_expect_success CUEMU 'attention at the small head dims (attnsmall.cu), padded rows included: emulated' '
	emu_run "$attn" out2
'

test_expect_success CUEMU 'linear layers (over a host GEMM), cross-entropy and AdamW: the CPU kernels, emulated' '
	emu_run "$gemm" out3
'

# each warp runs from barrier to barrier before the next starts, and each
# lane up to its next warp op before the next lane: in the reverse order
# (last block, warp and lane first) too, a missing __syncthreads or
# __syncwarp, or a dependence between blocks, shows as a different result
test_expect_success CUEMU 'the same in the reverse thread and block order: the same TAP lines' '
	CUEMU_REVERSE=1 emu_run "$emu" rev1 &&
	CUEMU_REVERSE=1 emu_run "$attn" rev2 &&
	CUEMU_REVERSE=1 emu_run "$gemm" rev3 &&
	cmp out1 rev1 &&
	cmp out2 rev2 &&
	cmp out3 rev3
'

test_done
