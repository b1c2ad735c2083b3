#!/bin/sh
test_description='manual pages: lint-clean, complete, and in step with --help'
. "$(dirname "$0")/test-lib.sh"

MAN=$HP_SRC_DIR/man
if command -v mandoc >/dev/null 2>&1; then test_set_prereq MANDOC; fi

test_expect_success MANDOC 'every page is clean under mandoc -Tlint' '
	for m in "$MAN"/*.[1-9]; do
		mandoc -Tlint -W warning "$m" || return 1
	done
'

test_expect_success 'every tool has a page, and the pages hp-train needs exist' '
	for t in "$HP_BUILD_DIR"/bin/hp-*; do
		name=$(basename "$t")
		test "$name" = hp-test-tool && continue
		test -f "$MAN/$name.1" || { echo "no man page for $name"; return 1; }
	done &&
	test -f "$MAN/hp-config.5"
'

test_expect_success MANDOC 'each page has the sections users look for' '
	for m in "$MAN"/hp-*.1; do
		for s in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" ENVIRONMENT FILES EXAMPLES "SEE ALSO"; do
			mandoc -Tascii "$m" | col -b | grep -q "^$s" || { echo "$m lacks $s"; return 1; }
		done
	done &&
	mandoc -Tascii "$MAN/hp-config.5" | col -b | grep -q "^EXIT STATUS\|^EXAMPLES"
'

# The usage lines of --help run from "usage:" to the first blank line; a
# line that does not start with "or:" continues the one before it.
for tool in hp-train hp-data hp-plan hp-convert hp-verify; do
	test_expect_success MANDOC "$tool --help shows the SYNOPSIS of $tool(1)" '
		"$tool" --help | sed -n "/^ *usage: /,/^ *\$/{s/^ *usage: //; s/^ *or: //; /^ *\$/d; p;}" |
			tr -s " " >help &&
		test -s help &&
		mandoc -Tascii "$MAN/$tool.1" | col -b |
			sed -n "/^SYNOPSIS/,/^DESCRIPTION/p" | grep -v "^[A-Z]" | tr -s " \n" "  " |
			sed "s/^ //; s/ $//" >syn &&
		cat help syn &&
		for w in $(cat help); do grep -q -F -- "$w" syn || { echo "--help word $w not in SYNOPSIS"; return 1; }; done
	'
done

# list_kernels: the rows of hp-train --list-kernels as op|backend|kernel|status,
# cut at the header's column starts (an op may hold a space: "other ops")
list_kernels () {
	hp-train --list-kernels | awk '
		NR == 1 { b = index($0, "backend"); k = index($0, "kernel"); s = index($0, "status")
			  w = index($0, "selected by")
			  if (!(1 < b && b < k && k < s && s < w)) { print "bad header: " $0 >"/dev/stderr"; exit 1 }
			  next }
		function f(x) { sub(/^ +/, "", x); sub(/ +$/, "", x); return x }
		{ print f(substr($0, 1, b - 1)) "|" f(substr($0, b, k - b)) "|" f(substr($0, k, s - k)) "|" \
			f(substr($0, s, w - s)) }'
}

# The kernel registry (lib/backend/kernels.c) is what --list-kernels prints:
# hp-kernels(7) has one KERNELS entry per row, in the registry's order, and
# no other.
test_expect_success MANDOC 'hp-kernels(7) is clean and has an entry for every kernel hp-train --list-kernels prints' '
	mandoc -Tlint -W warning "$MAN/hp-kernels.7" &&
	list_kernels >rows &&
	test $(wc -l <rows) -ge 10 &&
	mandoc -Tascii -Owidth=300 "$MAN/hp-kernels.7" | col -bx >page &&
	for s in NAME DESCRIPTION KERNELS EXAMPLES "SEE ALSO"; do
		grep -q "^$s" page || { echo "hp-kernels(7) lacks $s"; return 1; }
	done &&
	sed -n "/^KERNELS/,/^[A-Z]/p" page >kernels &&
	while IFS="|" read -r op be k st; do
		test "$k" = - || grep -q -w -F -- "$k" page || { echo "kernel $k not in hp-kernels(7)"; return 1; }
		grep -q -x -F -- "       $op / $be / $k ($st)" kernels ||
			{ echo "KERNELS has no entry \"$op / $be / $k ($st)\""; return 1; }
	done <rows &&
	sed "s/^\([^|]*\)|\([^|]*\)|\([^|]*\)|\([^|]*\)\$/\1 \/ \2 \/ \3 (\4)/" rows >want &&
	grep -E "^       [^ ].* / [a-z]+ / [^ ]+ \([a-z]+\)\$" kernels | sed "s/^       //" >entries &&
	diff -u want entries
'

test_expect_success 'the exit statuses of hp-train(1) are those of lib/base/err.h' '
	for code in 0 1 2 3 4 5 70; do
		grep -q "^\.It $code\$\|^\.IP $code\|^\.TP\$" "$MAN/hp-train.1" || return 1
	done &&
	grep -q "HP_EXIT_CONFIG = 3" "$HP_SRC_DIR/lib/base/err.h" &&
	grep -q "HP_EXIT_DATA = 4" "$HP_SRC_DIR/lib/base/err.h" &&
	grep -q "HP_EXIT_IO = 5" "$HP_SRC_DIR/lib/base/err.h"
'

# man_examples PAGE: the EXAMPLES section as plain text, unindented
man_examples () {
	mandoc -Tascii -Owidth=300 "$1" | col -bx | sed -n '/^EXAMPLES/,/^SEE ALSO/p' | sed 's/^       //'
}

test_expect_success MANDOC 'the EXAMPLES of hp-train(1) run as written' '
	mkdir -p data && ln -s "$DATA/stories260K" data/stories260K &&
	hp-test-tool mkidx --vocab 512 --records-of 257 -o data/tinystories \
		"$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" &&
	man_examples "$MAN/hp-train.1" >ex.txt &&
	sed -n "/^model:/,/^checkpoint:/p" ex.txt >train.yaml &&
	grep -q "^  train_iters: 200$" train.yaml &&
	sed -i "s/^  train_iters: 200$/  train_iters: 12/" train.yaml &&
	awk "/^\\$ / { cmd = substr(\$0, 3); while (cmd ~ /&&\$/) { getline l; sub(/^ +/, \"\", l); cmd = cmd \" \" l }
		print cmd }" ex.txt | sed "s/train_iters=50/train_iters=3/" >cmds &&
	test $(wc -l <cmds) -ge 4 &&
	while read -r cmd; do
		echo "+ $cmd" && sh -c "$cmd" </dev/null >out 2>&1 || { cat out; return 1; }
	done <cmds &&
	test -s run.jsonl && test -s grads.safetensors
'

# hp-config(5)'s EXAMPLES are loaded and checked by t/unit/test-config.c.

test_done
