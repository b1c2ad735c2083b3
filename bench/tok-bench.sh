#!/bin/sh
# bench/tok-bench.sh - encoding throughput of hp's tokenizer against HF
# tokenizers (the Rust library, through its Python binding) on the same
# text in the same run, one thread, best of 3; part of `make bench`.
#
# HF tokenizers comes from PyPI into a virtual environment under the build
# directory (created once; HP_TOKBENCH_VENV overrides).  The token counts
# of both are printed: equal counts show both did the same work.  Not a
# test: the ratios are printed against the 1.0x target, and only a failed
# run makes the exit status non-zero (no PyPI to install from: skipped).
#
# Smoke mode (HP_BENCH_SMOKE=1; t/t1300 runs it): both tokenizers on
# data/corpus/tinystories_sample.txt (4 KB), one run each: the same table
# in about a second, its numbers not worth reading.  It installs nothing:
# without the venv the HF columns are "-" and the reason is printed.
set -u

src=$(cd "$(dirname "$0")/.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
tool=$build/bin/hp-test-tool
venv=${HP_TOKBENCH_VENV:-$build/tokbench-venv}
smoke=${HP_BENCH_SMOKE:-0}
[ -x "$tool" ] || { echo "tok-bench: $tool not built; run make" >&2; exit 1; }
command -v jq >/dev/null || { echo "tok-bench: jq not found" >&2; exit 1; }
if [ "$smoke" = 1 ]; then
	texts=tinystories_sample.txt repeat=1
else
	texts="pride_and_prejudice.txt tinystories_val_excerpt.txt" repeat=3
fi

hf=1 note=
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
	if [ "$smoke" = 1 ]; then
		hf=0 note="HF columns skipped: no HF tokenizers in '$venv' (smoke mode installs nothing; make bench does)"
	else
		echo "tok-bench: installing HF tokenizers 0.23.2 into $venv" >&2
		python3 -m venv "$venv" >/dev/null 2>&1 &&
		"$venv/bin/pip" install -q tokenizers==0.23.2 >/dev/null 2>&1 ||
			{ echo "tok-bench: cannot install HF tokenizers from PyPI; skipped" >&2; exit 0; }
	fi
fi
export RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1

hfv=-
[ "$hf" = 0 ] || hfv=$("$venv/bin/python" -c 'import tokenizers; print(tokenizers.__version__)')
printf '\n%s\n' "tokenizer encoding, one thread, MB/s (best of $repeat; HF tokenizers $hfv)"
[ "$smoke" = 1 ] && echo "smoke mode: a 4 KB text, the numbers are not worth reading"
printf '%-12s %-26s %10s %10s %7s %10s %10s %7s  %s\n' tokenizer text "hp whole" "hf whole" ratio \
	"hp lines" "hf lines" ratio "tokens hp/hf"
status=0
for tk in qwen3 llama3; do
	for text in $texts; do
		tj=$src/data/tokenizers/$tk/tokenizer.json
		f=$src/data/corpus/$text
		hp=$("$tool" tokbench "$tj" "$f" "$repeat") ||
			{ echo "tok-bench: hp-test-tool tokbench failed on $tk, $text" >&2; status=1; continue; }
		hfo='{"whole_mb_s": "-", "lines_mb_s": "-", "tokens": "-"}'
		if [ "$hf" = 1 ]; then
			hfo=$("$venv/bin/python" "$src/bench/tok_hf.py" "$tj" "$f" "$repeat") ||
				{ echo "tok-bench: tok_hf.py failed on $tk, $text" >&2; status=1; continue; }
		fi
		row=$(printf '%s\n%s\n' "$hp" "$hfo" | jq -s -r '"\(.[0].whole_mb_s) \(.[1].whole_mb_s) \(.[0].lines_mb_s) \(.[1].lines_mb_s) \(.[0].tokens) \(.[1].tokens)"') &&
			[ -n "$row" ] ||
			{ echo "tok-bench: cannot read the results of $tk, $text" >&2; status=1; continue; }
		echo "$row" | awk -v tk="$tk" -v text="$text" '
			function r(a, b) { return b == "-" ? "-" : sprintf("%.1fx", a / b) }
			function f(x) { return x == "-" ? "-" : sprintf("%.1f", x) }
			{ printf "%-12s %-26s %10.1f %10s %7s %10.1f %10s %7s  %s/%s\n", tk, text,
				$1, f($2), r($1, $2), $3, f($4), r($3, $4), $5, $6 }'
	done
done
echo "target: >= 1.0x"
[ -z "$note" ] || echo "$note"
exit $status
