# hp - one non-recursive Makefile.
#
# Targets:
#   make            build libhp, the tools (O/bin/hp-*), unit tests and helpers
#   make check      run the whole test suite under prove (TAP)
#   make bench      benchmarks: hp-train vs PyTorch (Debian's 1.13 and PyPI's
#                   2.x, the latter in build/ref-venv, made on first use),
#                   printing ratios; HP_BENCH_SMOKE=1: tiny sizes, seconds
#   make demo       the main demo (fine-tune stories260K, export, plot)
#   make man        lint and render the man pages (mandoc)
#   make fuzz       build the libFuzzer targets (clang) into O/fuzz/
#   make clean
#
# Knobs (make VAR=value):
#   O=DIR           out-of-tree build directory (default: build)
#   V=1             show full command lines
#   SANITIZE=list   e.g. SANITIZE=address,undefined (adds -fsanitize=...)
#   DEVELOPER=0     drop -Werror (on by default: the tree builds warning-free)
#   CUDA=0          skip the CUDA backend even when nvcc exists
#   NVCC=path       nvcc to use (default: /usr/local/cuda/bin/nvcc, then PATH)
#   OPT=flags       optimisation flags (default: -O2 -march=x86-64-v2 -g)
#   PROVE_JOBS=N    parallel test scripts (default 2)
#
# Flags that change (CFLAGS, SANITIZE, CUDA) rebuild everything: the full
# flag line is kept in O/.flags and every object depends on it.

O ?= build
V ?= 0
DEVELOPER ?= 1
PROVE_JOBS ?= 2
OPT ?= -O2 -g

CC := mpicc
comma := ,
CLANG ?= clang

ifeq ($(V),1)
Q :=
quiet = @true
else
Q := @
quiet = @printf '  %-7s %s\n'
endif

WARN := -Wall -Wextra -Wshadow -Wno-unused-parameter -Wno-format-truncation -Wstrict-prototypes -Wmissing-prototypes
ifeq ($(DEVELOPER),1)
WARN += -Werror
endif

CPPFLAGS += -Ilib -Ikernels -It -include lib/base/compat.h -MMD -MP
CFLAGS += -std=gnu11 $(OPT) $(WARN) -Wno-psabi -fno-strict-aliasing -ffp-contract=off
LDLIBS += -ljansson -lyaml -lzstd -lpcre2-8 -lutf8proc -lopenblas -lm -lpthread

ifneq ($(SANITIZE),)
CFLAGS += -fsanitize=$(SANITIZE) -fno-sanitize-recover=all -fno-omit-frame-pointer
LDFLAGS += -fsanitize=$(SANITIZE)
endif

# --- optional CUDA backend -------------------------------------------------
NVCC ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
ifeq ($(CUDA),0)
NVCC :=
endif
ifneq ($(NVCC),)
HAVE_CUDA := 1
NCCL_INC := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/local/include/nccl.h /usr/include/nccl.h))
NCCL_LIBDIR := $(firstword $(dir $(wildcard $(CUDA_HOME)/lib64/libnccl.so $(CUDA_HOME)/lib/libnccl.so /usr/local/lib/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so)))
CPPFLAGS += -DHP_HAVE_CUDA=1 -I$(CUDA_HOME)/include
# lib/comm/comm_nccl.c is built for real only with both nccl.h and libnccl (the
# header's places are all on the include path already)
ifneq ($(and $(NCCL_INC),$(NCCL_LIBDIR)),)
CPPFLAGS += -DHP_HAVE_NCCL=1
endif
NVCCFLAGS := -std=c++17 -O2 -Ilib -Ikernels -DHP_HAVE_CUDA=1 -DHP_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"' \
	-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a \
	-gencode=arch=compute_90,code=compute_90 \
	-Xcompiler -Wall,-Wextra,-Wno-unused-parameter$(if $(filter 1,$(DEVELOPER)),$(comma)-Werror) \
	-Werror all-warnings
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
	$(if $(NCCL_LIBDIR),-L$(NCCL_LIBDIR) -Wl$(comma)-rpath$(comma)$(NCCL_LIBDIR) -lnccl) \
	-lcudart -lstdc++ -ldl
LDLIBS += $(CUDA_LIBS)
else
HAVE_CUDA := 0
endif

# --- sources ---------------------------------------------------------------
LIB_SRC := $(sort $(wildcard lib/*/*.c) $(wildcard kernels/cpu/*.c))
CUDA_SRC := $(sort $(wildcard kernels/cuda/*.cu))
TOOL_MAIN := tools/common-main.c
TOOL_SRC := $(sort $(filter-out $(TOOL_MAIN),$(wildcard tools/hp-*.c)))
UNIT_SRC := $(sort $(wildcard t/unit/test-*.c))
HELPER_SRC := $(sort $(wildcard t/helper/*.c))
FUZZ_SRC := $(sort $(wildcard fuzz/fuzz-*.c))

LIB_OBJ := $(LIB_SRC:%.c=$(O)/%.o)
ifeq ($(HAVE_CUDA),1)
LIB_OBJ += $(CUDA_SRC:%.cu=$(O)/%.cu.o)
endif
LIBHP := $(O)/libhp.a
TOOLS := $(TOOL_SRC:tools/%.c=$(O)/bin/%)
UNITS := $(UNIT_SRC:t/unit/%.c=$(O)/t/%)
HELPER := $(O)/bin/hp-test-tool
FUZZERS := $(FUZZ_SRC:fuzz/%.c=$(O)/fuzz/%)

GPU_BENCH := $(if $(filter 1,$(HAVE_CUDA)),$(O)/bench/gpu-bench)
# the CPU benchmarks are built with everything else, so that they always
# compile, and t/t1300 runs each of them in smoke mode
BENCH_BINS := $(O)/bench/kernel-bench $(O)/bench/gemm-bench
all: $(TOOLS) $(UNITS) $(if $(HELPER_SRC),$(HELPER)) $(O)/t/libenospc.so $(BENCH_BINS) $(GPU_BENCH) config-report

config-report:
	@printf '  %-7s %s\n' "" "MPI: $$(command -v mpiexec >/dev/null && echo ✓ || echo ✗)  CUDA: $(if $(filter 1,$(HAVE_CUDA)),✓ ($(NVCC)),✗)  NCCL: $(if $(NCCL_LIBDIR),✓,✗)"

# the CUDA kernels run on the CPU under t/cuemu (after `all:`: it adds to it)
include t/cuemu/cuemu.mk

# Rebuild when the flag line changes.
FLAGS_LINE := $(CC) $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) | $(NVCC) $(NVCCFLAGS)
$(O)/.flags: FORCE
	@mkdir -p $(O)
	@echo '$(FLAGS_LINE)' | cmp -s - $@ || echo '$(FLAGS_LINE)' > $@

$(O)/%.o: %.c $(O)/.flags
	@mkdir -p $(dir $@)
	$(quiet) CC $<
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(O)/%.cu.o: %.cu $(O)/.flags
	@mkdir -p $(dir $@)
	$(quiet) NVCC $<
	$(Q)$(NVCC) $(NVCCFLAGS) -MMD -MP -c -o $@ $<

$(LIBHP): $(LIB_OBJ)
	$(quiet) AR $@
	$(Q)rm -f $@ && ar rcs $@ $^

$(O)/bin/%: $(O)/tools/%.o $(O)/tools/common-main.o $(LIBHP)
	@mkdir -p $(dir $@)
	$(quiet) LINK $@
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(O)/t/%: $(O)/t/unit/%.o $(O)/t/unit/tap.o $(LIBHP)
	@mkdir -p $(dir $@)
	$(quiet) LINK $@
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(O)/t/unit/tap.o: t/tap.c $(O)/.flags
	@mkdir -p $(dir $@)
	$(quiet) CC $<
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

# tap.o: cmpst judges tensors with the unit tests' floor (tap_floor)
$(HELPER): $(HELPER_SRC:%.c=$(O)/%.o) $(O)/t/unit/tap.o $(LIBHP)
	@mkdir -p $(dir $@)
	$(quiet) LINK $@
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The ENOSPC shim is preloaded into other programs, so it is built alone:
# no compat.h, no sanitizers, no libhp (see t/shim/enospc.c).
$(O)/t/libenospc.so: t/shim/enospc.c
	@mkdir -p $(dir $@)
	$(quiet) CC $@
	$(Q)$(CC) -shared -fPIC -O2 -Wall -Wextra -Werror -o $@ $< -ldl

# libFuzzer targets: clang, ASan+UBSan.  The library is compiled once for
# them (instrumented, without libFuzzer's main) and linked into each.
FUZZ_LIB_SRC := $(sort $(wildcard lib/*/*.c) $(wildcard kernels/cpu/*.c))
FUZZ_OBJ := $(FUZZ_LIB_SRC:%.c=$(O)/fuzz/obj/%.o)
FUZZ_CFLAGS = -g -O1 -Wno-psabi -fsanitize=address,undefined -Ilib -Ikernels \
	$(shell mpicc -show | tr ' ' '\n' | grep '^-I') -include lib/base/compat.h
$(O)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(quiet) FUZZCC $<
	$(Q)$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<
$(O)/fuzz/%: fuzz/%.c $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	$(quiet) FUZZ $@
	$(Q)$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJ) \
		$$(mpicc -show | tr ' ' '\n' | grep '^-[lL]') $(filter-out $(CUDA_LIBS),$(LDLIBS))
fuzz: $(FUZZERS)

# --- tests, bench, docs ------------------------------------------------------
TEST_SCRIPTS := $(sort $(wildcard t/t[0-9][0-9][0-9][0-9]-*.sh))

# The fuzzers join the suite when clang can build them (t0110 runs them briefly).
HAVE_CLANG := $(if $(shell command -v $(CLANG) 2>/dev/null),1,0)
check: all $(if $(filter 1,$(HAVE_CLANG)),fuzz)
	@HP_BUILD_DIR=$(abspath $(O)) HP_HAVE_CUDA=$(HAVE_CUDA) HP_SRC_DIR=$(CURDIR) \
		prove -j$(PROVE_JOBS) $(UNITS) $(TEST_SCRIPTS)

# the CUDA benchmark (scripts/gpu-check.sh runs it on a lent GPU); built
# with every CUDA build so that it always compiles
# (cuBLAS, its yardstick, linked: hp itself opens cuBLASLt at run time)
$(O)/bench/gpu-bench: $(O)/bench/gpu/gpu-bench.o $(LIBHP)
	@mkdir -p $(dir $@)
	$(quiet) LINK $@
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lcublas -lcublasLt

# bench C programs link against libhp as the unit tests do
$(O)/bench/%-bench: $(O)/bench/%-bench.o $(LIBHP)
	@mkdir -p $(dir $@)
	$(quiet) LINK $@
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# HP_BENCH_SMOKE=1 make bench: every benchmark at tiny sizes, one or two
# steps, its table printed and nothing worth reading timed (t/t1300 runs
# the same); a failed run still fails the target.
bench: all
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/run.sh
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/moe-bench.sh
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/family-bench.sh
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/tok-bench.sh
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/convert-bench.sh
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/kernels-bench.sh
	@$(O)/bench/gemm-bench $(if $(filter 1,$(HP_BENCH_SMOKE)),--smoke)
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/parallel-bench.sh
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/pp-bench.sh
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/ckpt-bench.sh
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/fsdp-bench.sh
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/mem-bench.sh
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/actckpt-bench.sh
	@HP_BUILD_DIR=$(abspath $(O)) sh bench/chat-bench.sh
	@if [ -x $(O)/bench/gpu-bench ] && nvidia-smi -L >/dev/null 2>&1; then \
		$(O)/bench/gpu-bench --seq 4096 --steps 3 bench/gpu/qwen3-30b-a3b.json && \
		$(O)/bench/gpu-bench --seq 4096 --steps 3 --model-only bench/gpu/llama-8b.json; \
	else echo "gpu-bench: no GPU here (or a build without nvcc): the device's times are not measured"; fi

demo: all
	@HP_BUILD_DIR=$(abspath $(O)) sh examples/training_demo/run_parallel_offline.sh
	@HP_BUILD_DIR=$(abspath $(O)) sh examples/stories260K/run.sh

MAN_PAGES := $(sort $(wildcard man/*.[1-9]))
man:
	$(Q)for m in $(MAN_PAGES); do mandoc -Tlint -W warning $$m || exit 1; done
	$(Q)mkdir -p $(O)/man && for m in $(MAN_PAGES); do mandoc -Tutf8 $$m > $(O)/man/$$(basename $$m).txt; done
	@echo "  MAN     $(words $(MAN_PAGES)) pages in $(O)/man"

clean:
	rm -rf $(O)

.PHONY: all check bench demo man fuzz clean config-report FORCE
.SECONDARY:

-include $(shell find $(O) -name '*.d' 2>/dev/null)
