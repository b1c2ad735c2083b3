#!/bin/sh
# bench/chat-bench.sh - conversations rendered with a chat template and
# tokenized per second: hp (hp-test-tool chatbench: jinja_*.c, chat.c and the
# tokenizer) against transformers' apply_chat_template (bench/chat_hf.py)
# on the same conversations, one thread, best of 3; part of `make bench`.
#
# transformers comes from the venv that t/ref/make-chat-goldens.sh makes
# (build/chat-venv5; HP_CHATBENCH_PYTHON overrides the python); without it
# the transformers columns are "-" and the reason is printed.  The token
# counts of both are printed: equal counts show both did the same work
# (data/chat/conversations.jsonl, whose ids t/unit/test-chat.c holds equal).
# Not a test: only a failed run makes the exit status non-zero.
#
# Smoke mode (HP_BENCH_SMOKE=1; t/t1300 runs it): the first 20
# conversations, one pass each: the same table, its numbers not worth
# reading.
set -u

src=$(cd "$(dirname "$0")/.." && pwd)
build=${HP_BUILD_DIR:-$src/build}
tool=$build/bin/hp-test-tool
py=${HP_CHATBENCH_PYTHON:-$build/chat-venv5/bin/python}
smoke=${HP_BENCH_SMOKE:-0}
[ -x "$tool" ] || { echo "chat-bench: $tool not built; run make" >&2; exit 1; }
command -v jq >/dev/null || { echo "chat-bench: jq not found" >&2; exit 1; }
convs=$src/data/chat/conversations.jsonl repeat=3
tmp=
if [ "$smoke" = 1 ]; then
	tmp=$(mktemp) || exit 1
	trap 'rm -f "$tmp"' EXIT
	head -n 20 "$convs" >"$tmp"
	convs=$tmp repeat=1
fi
hf=1 note=
if [ ! -x "$py" ] || ! "$py" -c 'import transformers' 2>/dev/null; then
	hf=0 note="transformers columns skipped: no transformers at '$py' (sh t/ref/make-chat-goldens.sh makes it)"
fi
export RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false

tv=-
[ "$hf" = 0 ] || tv=$("$py" -c 'import transformers; print(transformers.__version__)' 2>/dev/null)
printf '\n%s\n' "chat templates: conversations rendered and tokenized per second, one thread (best of $repeat; transformers $tv)"
[ "$smoke" = 1 ] && echo "smoke mode: 20 conversations, the numbers are not worth reading"
printf '%-8s %6s %12s %12s %7s %12s %12s  %s\n' template convs "hp conv/s" "hf conv/s" ratio \
	"hp tok/s" "hf tok/s" "tokens hp/hf"
status=0
for name in qwen3 llama3 mistral chatml; do
	case $name in
	qwen3) tok=qwen3 tpl=auto ;;
	llama3) tok=llama3 tpl=auto ;;
	mistral) tok=mistral tpl=$src/data/chat/templates/mistral-instruct.jinja ;;
	chatml) tok=qwen3 tpl=chatml ;;
	esac
	hp=$("$tool" chatbench "$src/data/tokenizers/$tok" "$tpl" "$convs" "$repeat") ||
		{ echo "chat-bench: hp-test-tool chatbench failed on $name" >&2; status=1; continue; }
	hfo='{"conversations_per_s": "-", "tokens_per_s": "-", "tokens": "-"}'
	if [ "$hf" = 1 ]; then
		hfo=$("$py" "$src/bench/chat_hf.py" "$name" "$convs" "$repeat" 2>/dev/null) ||
			{ echo "chat-bench: chat_hf.py failed on $name" >&2; status=1; continue; }
	fi
	printf '%s\n%s\n' "$hp" "$hfo" | jq -s -r '"\(.[0].conversations) \(.[0].conv_s) \(.[1].conversations_per_s) \(.[0].tokens_s) \(.[1].tokens_per_s) \(.[0].tokens) \(.[1].tokens)"' |
		awk -v t="$name" '
		function r(a, b) { return b == "-" ? "-" : sprintf("%.1fx", a / b) }
		function f(x) { return x == "-" ? "-" : sprintf("%.0f", x) }
		{ printf "%-8s %6d %12.0f %12s %7s %12.0f %12s  %s/%s\n", t, $1, $2, f($3), r($2, $3), $4, f($5), $6, $7 }'
done
[ -z "$note" ] || echo "$note"
exit $status
