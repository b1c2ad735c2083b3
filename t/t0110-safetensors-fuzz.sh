#!/bin/sh
#
# t0110-safetensors-fuzz.sh - run the safetensors header fuzzer for a few
# seconds over a copy of its committed corpus.
#
# This builds nothing: `make fuzz` (clang, libFuzzer, ASan+UBSan) puts the
# target in $HP_BUILD_DIR/fuzz/; without it the test is skipped.  The copy
# keeps new inputs found during the run out of the source tree.  It is not
# a substitute for a long fuzzing campaign, only a guard that the corpus
# still runs clean.  HP_FUZZ_SECONDS sets the time (default 10).

test_description='safetensors header parser survives its fuzzer'
. "$(dirname "$0")/test-lib.sh"

FUZZER=$HP_BUILD_DIR/fuzz/fuzz-safetensors
CORPUS=$HP_SRC_DIR/fuzz/corpus/safetensors
HP_FUZZ_SECONDS=${HP_FUZZ_SECONDS:-10}

if [ -x "$FUZZER" ]; then
	test_set_prereq FUZZ_SAFETENSORS
else
	say "no $FUZZER: run 'make fuzz' to build it"
fi

test_expect_success 'the seed corpus is committed' '
	test -d "$CORPUS" &&
	test "$(ls "$CORPUS" | wc -l)" -ge 8
'

test_expect_success FUZZ_SAFETENSORS 'every seed runs clean' '
	"$FUZZER" "$CORPUS"/* >seeds.log 2>&1 &&
	test_no_sanitizer_report seeds.log
'

test_expect_success FUZZ_SAFETENSORS "fuzz for $HP_FUZZ_SECONDS seconds without a finding" '
	rm -rf corpus artifacts &&
	mkdir artifacts &&
	cp -R "$CORPUS" corpus &&
	"$FUZZER" -max_total_time=$HP_FUZZ_SECONDS -print_final_stats=1 \
		-artifact_prefix=artifacts/ corpus >fuzz.log 2>&1 &&
	test_no_sanitizer_report fuzz.log &&
	test -z "$(ls artifacts)" &&
	grep "^Done [0-9]* runs" fuzz.log >&2
'

test_done
