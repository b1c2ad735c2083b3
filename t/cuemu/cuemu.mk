# t/cuemu/cuemu.mk - kernels/cuda's kernels under the CPU emulation
# (t/cuemu/README): build/t/test-cuda-emu, test-cuda-attn-emu and
# test-cuda-gemm-emu (linear.cu over a host GEMM in place of cuBLASLt's,
# grouped.cu's wmma GEMMs over include/mma.h, cross-entropy, AdamW), run by
# t/t0960-cuda-emulated.sh.  Needs g++ and perl, not nvcc; included by
# the Makefile after its `all` rule.
CUEMU_CXX ?= g++
HAVE_CUEMU := $(if $(and $(shell command -v $(CUEMU_CXX) 2>/dev/null),$(shell command -v perl 2>/dev/null)),1,0)
CUEMU_CU := context elementwise linear moe grouped ce adamw attn attnsmall oss gdn
CUEMU_OBJ := $(CUEMU_CU:%=$(O)/t/cuemu/%.cu.o) $(O)/t/cuemu/cuemu.o $(O)/t/cuemu/stubs.o
CUEMU_TESTS := test-cuda test-cuda-attn test-cuda-gemm
CUEMU_BINS := $(if $(filter 1,$(HAVE_CUEMU)),$(CUEMU_TESTS:%=$(O)/t/%-emu))
CUEMU_CPPFLAGS := -It/cuemu/include -Ilib -Ikernels -It -DHP_HAVE_CUDA=1 -DHP_CUDA_EMULATED=1 -MMD -MP
CUEMU_CXXFLAGS := -std=c++17 $(OPT) -Wall -Wextra -Wno-unused-parameter $(if $(filter 1,$(DEVELOPER)),-Werror) \
	-ffp-contract=off -fno-strict-aliasing \
	$(if $(SANITIZE),-fsanitize=$(SANITIZE) -fno-sanitize-recover=all -fno-omit-frame-pointer)

all: $(CUEMU_BINS)
cuemu-tests: $(CUEMU_BINS)
.PHONY: cuemu-tests

# the .cu files with their launches and __shared__ rewritten (t/cuemu/xform)
$(O)/t/cuemu/%.cu.cpp: kernels/cuda/%.cu t/cuemu/xform
	@mkdir -p $(dir $@)
	$(quiet) XFORM $<
	$(Q)perl t/cuemu/xform $< $@

$(O)/t/cuemu/%.cu.o: $(O)/t/cuemu/%.cu.cpp $(O)/.flags
	$(quiet) CUEMU $*.cu
	$(Q)$(CUEMU_CXX) $(CUEMU_CPPFLAGS) $(CUEMU_CXXFLAGS) -c -o $@ $<

$(O)/t/cuemu/%.o: t/cuemu/%.cpp $(O)/.flags
	@mkdir -p $(dir $@)
	$(quiet) CUEMU $<
	$(Q)$(CUEMU_CXX) $(CUEMU_CPPFLAGS) $(CUEMU_CXXFLAGS) -c -o $@ $<

# the op tests, compiled as in a CUDA build but against the stand-in headers
$(O)/t/cuemu/test-%.o: t/unit/test-%.c $(O)/.flags
	@mkdir -p $(dir $@)
	$(quiet) CC '$< (emulated)'
	$(Q)$(CC) $(CUEMU_CPPFLAGS) -include lib/base/compat.h $(CFLAGS) -c -o $@ $<

# the emulated objects come before libhp.a, which (in a CUDA build) holds the
# real kernels: every hp_cuda_* / hp_cu_* symbol is taken from them; no CUDA library
$(O)/t/%-emu: $(O)/t/cuemu/%.o $(CUEMU_OBJ) $(O)/t/unit/tap.o $(LIBHP)
	$(quiet) LINK $@
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(filter-out $(CUDA_LIBS),$(LDLIBS)) -lstdc++

.PRECIOUS: $(O)/t/cuemu/%.cu.cpp $(O)/t/cuemu/%.o
