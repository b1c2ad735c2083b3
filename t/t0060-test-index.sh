#!/bin/sh
test_description='t/README lists every test: a new test without an entry fails here'
. "$(dirname "$0")/test-lib.sh"

test_expect_success 'every test script and unit test is named in t/README' '
	missing= &&
	for f in "$TEST_DIR"/t[0-9]*.sh "$TEST_DIR"/unit/test-*.c; do
		n=$(basename "$f") &&
		grep -q -F "$n" "$TEST_DIR/README" || missing="$missing $n"
	done &&
	{ test -z "$missing" || { echo "not in t/README:$missing"; false; }; }
'

test_expect_success 'every test t/README names exists' '
	gone= &&
	for n in $(grep -o -E "\bt[0-9]{4}-[a-z0-9-]+\.sh|\btest-[a-z0-9-]+\.c" "$TEST_DIR/README" | sort -u); do
		case $n in t[0-9]*) f=$TEST_DIR/$n ;; *) f=$TEST_DIR/unit/$n ;; esac &&
		{ test -e "$f" || test -e "$TEST_DIR/helper/$n" || gone="$gone $n"; }
	done &&
	{ test -z "$gone" || { echo "t/README names what is gone:$gone"; false; }; }
'

test_done
