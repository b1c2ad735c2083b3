#!/bin/sh
# bench/tok-bench.sh - encoding throughput of hp's tokenizer against HF
# tokenizers (the Rust library, through its Python binding) on the same
# text in the same run, one thread, best of 3; part of `make bench`.
#
# HF tokenizers comes from PyPI into a virtual environment under the build
# directory (created once; HP_TOKBENCH_VENV overrides).  The token counts
# of both are printed: equal counts show both did the same work.
set -u

src=$(cd "$(dirname "$0")/.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
tool=$build/bin/hp-test-tool
venv=${HP_TOKBENCH_VENV:-$build/tokbench-venv}
[ -x "$tool" ] || { echo "tok-bench: $tool not built; run make" >&2; exit 1; }

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
	echo "tok-bench: installing HF tokenizers 0.23.2 into $venv" >&2
	python3 -m venv "$venv" >/dev/null 2>&1 &&
	"$venv/bin/pip" install -q tokenizers==0.23.2 >/dev/null 2>&1 ||
		{ echo "tok-bench: cannot install HF tokenizers from PyPI; skipped" >&2; exit 0; }
fi
export RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1

printf '\n%s\n' "tokenizer encoding, one thread, MB/s (best of 3; HF tokenizers $("$venv/bin/python" -c 'import tokenizers; print(tokenizers.__version__)'))"
printf '%-12s %-26s %10s %10s %7s %10s %10s %7s  %s\n' tokenizer text "hp whole" "hf whole" ratio \
	"hp lines" "hf lines" ratio "tokens hp/hf"
status=0
for tk in qwen3 llama3; do
	for text in pride_and_prejudice.txt tinystories_val_excerpt.txt; do
		tj=$src/data/tokenizers/$tk/tokenizer.json
		f=$src/data/corpus/$text
		hp=$("$tool" tokbench "$tj" "$f" 3) || { status=1; continue; }
		hf=$("$venv/bin/python" "$src/bench/tok_hf.py" "$tj" "$f" 3) || { status=1; continue; }
		printf '%s\n%s\n' "$hp" "$hf" | python3 -c '
import json, sys
hp, hf = (json.loads(l) for l in sys.stdin)
print("%-12s %-26s %10.1f %10.1f %6.1fx %10.1f %10.1f %6.1fx  %d/%d" % (sys.argv[1], sys.argv[2],
      hp["whole_mb_s"], hf["whole_mb_s"], hp["whole_mb_s"] / hf["whole_mb_s"],
      hp["lines_mb_s"], hf["lines_mb_s"], hp["lines_mb_s"] / hf["lines_mb_s"], hp["tokens"], hf["tokens"]))
' "$tk" "$text"
	done
done
echo "target: >= 1.0x"
exit $status
