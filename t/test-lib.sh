# test-lib.sh - git-style TAP harness for hp's shell tests.
#
# A test script:
#   #!/bin/sh
#   test_description='what this script checks'
#   . "$(dirname "$0")/test-lib.sh"
#   test_expect_success 'title' '
#           cmd1 &&
#           cmd2
#   '
#   test_done
#
# Each script runs in its own scratch directory ($TRASH, removed on success
# unless HP_TEST_KEEP=1).  The build's bin/ comes first on PATH.
# Environment: HP_BUILD_DIR (default: ../build from this file), HP_SRC_DIR
# (the source tree), HP_TEST_VERBOSE=1 (show command output on stderr).
# Prerequisites: test_set_prereq NAME, and
#   test_expect_success PREREQ 'title' '...'  skips unless PREREQ is set.

HP_SRC_DIR=${HP_SRC_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
HP_BUILD_DIR=${HP_BUILD_DIR:-$HP_SRC_DIR/build}
TEST_DIR=$HP_SRC_DIR/t
DATA=$HP_SRC_DIR/data
PATH=$HP_BUILD_DIR/bin:$PATH
export HP_SRC_DIR HP_BUILD_DIR PATH DATA TEST_DIR
# One BLAS thread per process: tests oversubscribe 2 cores.
OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OPENBLAS_NUM_THREADS OMP_NUM_THREADS
unset HP_FAIL_ALLOC HP_LOG HP_KERNELS
# For SANITIZE=address builds: MPI start-up's own leaks are suppressed
# (see t/lsan.supp); harmless for other builds.
ASAN_OPTIONS=${ASAN_OPTIONS:-fast_unwind_on_malloc=0:detect_leaks=1}
LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$HP_SRC_DIR/t/lsan.supp:print_suppressions=0}
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS

test_name=$(basename "$0" .sh)
TRASH=${TMPDIR:-/tmp}/hp-test.$test_name.$$
rm -rf "$TRASH" && mkdir -p "$TRASH" || exit 1
cd "$TRASH" || exit 1

test_count=0
test_failed=0
test_prereqs=" "

test_set_prereq () {
	test_prereqs="$test_prereqs$1 "
}

test_have_prereq () {
	case "$test_prereqs" in *" $1 "*) return 0 ;; esac
	return 1
}

if command -v mpiexec >/dev/null 2>&1; then test_set_prereq MPI; fi
if /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then test_set_prereq TORCH; fi
if [ "${HP_HAVE_CUDA:-0}" = 1 ] && command -v nvidia-smi >/dev/null 2>&1 &&
	nvidia-smi -L >/dev/null 2>&1; then test_set_prereq GPU; else test_set_prereq NOGPU; fi

say () {
	echo "# $*"
}

test_run_ () {
	# stdin is /dev/null: a test never waits on the terminal or a pipe
	if [ -n "$HP_TEST_VERBOSE" ]; then
		(eval "$1") </dev/null
	else
		(eval "$1") </dev/null >"$TRASH/.out" 2>&1
	fi
}

test_expect_success () {
	prereq=
	if [ $# = 3 ]; then prereq=$1; shift; fi
	test_count=$((test_count + 1))
	if [ -n "$prereq" ] && ! test_have_prereq "$prereq"; then
		echo "ok $test_count # skip $1 (missing $prereq)"
		return
	fi
	if test_run_ "$2"; then
		echo "ok $test_count - $1"
	else
		test_failed=$((test_failed + 1))
		echo "not ok $test_count - $1"
		if [ -z "$HP_TEST_VERBOSE" ] && [ -f "$TRASH/.out" ]; then
			sed -e 's/^/#   /' "$TRASH/.out" | tail -n 40
		fi
	fi
}

test_expect_failure () {
	test_expect_success "$@"
}

test_skip_all () {
	echo "1..0 # SKIP $1"
	cd / && rm -rf "$TRASH"
	exit 0
}

test_done () {
	echo "1..$test_count"
	cd /
	if [ "$test_failed" = 0 ]; then
		[ -n "$HP_TEST_KEEP" ] || rm -rf "$TRASH"
		exit 0
	fi
	echo "# failed $test_failed of $test_count (scratch kept in $TRASH)"
	exit 1
}

# --- helpers ------------------------------------------------------------

# test_must_fail_with CODE cmd... : the command exits with exactly CODE
test_must_fail_with () {
	want=$1; shift
	"$@"
	got=$?
	if [ "$got" != "$want" ]; then
		echo "expected exit $want, got $got: $*" >&2
		return 1
	fi
	return 0
}

# test_one_line FILE : FILE holds exactly one non-empty line
test_one_line () {
	n=$(grep -c . "$1")
	if [ "$n" != 1 ]; then
		echo "expected one line in $1, got $n:" >&2
		cat "$1" >&2
		return 1
	fi
}

# test_no_sanitizer_report FILE : no ASan/UBSan report in FILE
test_no_sanitizer_report () {
	if grep -q -E 'ERROR: AddressSanitizer|runtime error:|LeakSanitizer' "$1"; then
		cat "$1" >&2
		return 1
	fi
}
