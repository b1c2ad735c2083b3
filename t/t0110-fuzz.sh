#!/bin/sh
#
# t0110-fuzz.sh - run every libFuzzer target for a few seconds over a copy
# of its committed corpus: fuzz/fuzz-NAME.c with fuzz/corpus/NAME/.
#
# This builds nothing: `make fuzz` (clang, libFuzzer, ASan+UBSan) puts the
# targets in $HP_BUILD_DIR/fuzz/ (make check does so when clang exists);
# without them the fuzzing tests are skipped.  The copy keeps new inputs
# found during the run out of the source tree.  It is not a substitute for
# a long fuzzing campaign, only a guard that the corpora still run clean.
# HP_FUZZ_SECONDS sets the time per target (default 10).

test_description='untrusted-input parsers survive their fuzzers'
. "$(dirname "$0")/test-lib.sh"

HP_FUZZ_SECONDS=${HP_FUZZ_SECONDS:-10}
# MPICH's UCX catches SIGSEGV before libFuzzer could save the crashing input
UCX_HANDLE_ERRORS=none
export UCX_HANDLE_ERRORS

for src in "$HP_SRC_DIR"/fuzz/fuzz-*.c; do
	name=$(basename "$src" .c)
	name=${name#fuzz-}
	fuzzer=$HP_BUILD_DIR/fuzz/fuzz-$name
	corpus=$HP_SRC_DIR/fuzz/corpus/$name
	prereq=FUZZ_$name
	if [ -x "$fuzzer" ]; then
		test_set_prereq "$prereq"
	else
		say "no $fuzzer: run 'make fuzz' to build it"
	fi

	test_expect_success "$name: a seed corpus is committed" '
		test -d "$corpus" &&
		test "$(ls "$corpus" | wc -l)" -ge 8
	'

	test_expect_success "$prereq" "$name: every seed runs clean" '
		"$fuzzer" "$corpus"/* >seeds.log 2>&1 &&
		test_no_sanitizer_report seeds.log
	'

	test_expect_success "$prereq" "$name: fuzz for $HP_FUZZ_SECONDS seconds without a finding" '
		rm -rf corpus-$name artifacts-$name &&
		mkdir artifacts-$name &&
		cp -R "$corpus" corpus-$name &&
		"$fuzzer" -max_total_time=$HP_FUZZ_SECONDS -print_final_stats=1 \
			-artifact_prefix=artifacts-$name/ corpus-$name >fuzz-$name.log 2>&1 &&
		test_no_sanitizer_report fuzz-$name.log &&
		test -z "$(ls artifacts-$name)" &&
		grep "^Done [0-9]* runs" fuzz-$name.log >&2
	'
done

test_done
