#!/bin/sh
# make-chat-goldens.sh - regenerate data/chat/: chat templates rendered,
# tokenized and masked by transformers itself, for hp's supervised
# fine-tuning on chat data.
#
#     t/ref/make-chat-goldens.sh [--check] [OUTDIR]     (default: data/chat)
#
# Makes, once each, two venvs with python3 -m venv and pip from PyPI (about
# 300 MB each installed, numpy and hub clients included; no torch, which
# tokenizers and templates do not need):
#   build/chat-venv4   transformers 4.57.6, jinja2 3.1.6, tokenizers 0.22.2
#   build/chat-venv5   transformers 5.24.0, jinja2 3.1.6, tokenizers 0.23.3
# A venv counts as made when pip's metadata in it has the three packages at
# those versions (checked after an install by importing them too); one left
# half-made by an interrupted install does not, and is installed into again.
# Then runs t/ref/make-chat-goldens.py under each (the conversations, the
# templates, golden-{qwen3,llama3,mistral,chatml}.jsonl and the README; see
# data/chat/README.md) into a temporary folder, and keeps the files only
# when both release lines wrote byte-identical ones: otherwise it names the
# first file that differs and prints the first differing line of each, and
# OUTDIR is left as it was.  OUTDIR is replaced as a whole.
#
# About 10 s once the venvs exist (two runs of the generator, about 5 s
# each, one thread); a first run also installs the venvs (a minute or two;
# needs PyPI once, nothing after: the tokenizers are local folders).  Two
# runs write identical bytes.  make check never runs it.
#
# --check   write nothing: regenerate into a temporary folder and exit 0
#           when OUTDIR holds exactly those files, 3 when it does not
#
# Exit 0 done, 1 when a venv cannot be made, the generator fails (it checks
# itself) or 4.x and 5.x differ, 2 on a bad command line, 3 (--check) when
# OUTDIR is out of date.  Progress goes to stderr.
#
# Environment:
#   HP_REF_PYTHON   the python that makes the venvs (default: python3)
set -u

check=0
case ${1:-} in
--check) check=1; shift ;;
-h|--help) sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'; exit 0 ;;
-*) echo "make-chat-goldens: unknown option '$1'" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "usage: t/ref/make-chat-goldens.sh [--check] [OUTDIR]" >&2; exit 2; }
src=$(cd "$(dirname "$0")/../.." && pwd) || exit 1
out=${1:-$src/data/chat}
case $out in /*) ;; *) out=$PWD/$out ;; esac
py=${HP_REF_PYTHON:-python3}

# ready DIR TRANSFORMERS JINJA2 TOKENIZERS: the venv has the pinned versions,
# by pip's metadata (importing transformers to ask takes seconds)
ready() {
	[ -x "$1/bin/python" ] && "$1/bin/python" - "$2" "$3" "$4" <<-'EOF' 2>/dev/null
	import sys
	from importlib.metadata import version
	have = [version(p).split("+")[0] for p in ("transformers", "jinja2", "tokenizers")]
	sys.exit(0 if have == sys.argv[1:] else 1)
	EOF
}

# venv DIR TRANSFORMERS JINJA2 TOKENIZERS: make DIR unless it is ready
venv() {
	ready "$@" && return 0
	echo "make-chat-goldens: installing transformers $2, jinja2 $3, tokenizers $4 into '$1' (PyPI, once)" >&2
	mkdir -p "$(dirname "$1")" &&
	"$py" -m venv "$1" &&
	"$1/bin/pip" install -q --disable-pip-version-check "transformers==$2" "jinja2==$3" \
		"tokenizers==$4" >&2 ||
		{ echo "make-chat-goldens: cannot make '$1' (see pip's message above)" >&2; return 1; }
	ready "$@" && "$1/bin/python" -c 'import jinja2, tokenizers, transformers' 2>/dev/null ||
		{ echo "make-chat-goldens: '$1' was installed but does not import the pinned versions" >&2; return 1; }
}

# first_diff A B: name the first file that differs between folders A and B
# and print its first differing line from each (cut to 600 bytes)
first_diff() {
	for f in $( (cd "$1" && find . -type f; cd "$2" && find . -type f) | sort -u); do
		if [ ! -f "$1/$f" ] || [ ! -f "$2/$f" ]; then
			echo "  $f: only in one of them" >&2
			return
		fi
		cmp -s "$1/$f" "$2/$f" && continue
		line=$(cmp "$1/$f" "$2/$f" 2>/dev/null | sed -n 's/.* line \([0-9]*\).*/\1/p')
		echo "  $f differs first at line ${line:-?}:" >&2
		[ -n "$line" ] || return
		printf '  %s: ' "$3" >&2; sed -n "${line}p" "$1/$f" | cut -c1-600 >&2
		printf '  %s: ' "$4" >&2; sed -n "${line}p" "$2/$f" | cut -c1-600 >&2
		return
	done
}

start=$(date +%s)
v4=$src/build/chat-venv4
v5=$src/build/chat-venv5
venv "$v4" 4.57.6 3.1.6 0.22.2 || exit 1
venv "$v5" 5.24.0 3.1.6 0.23.3 || exit 1

tmp=$(mktemp -d "${TMPDIR:-/tmp}/chat-goldens.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM
for v in 4 5; do
	echo "make-chat-goldens: transformers $v.x" >&2
	# offline: every tokenizer is a local folder; one thread; quiet about torch
	HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false \
	RAYON_NUM_THREADS=1 PYTHONHASHSEED=0 \
		"$src/build/chat-venv$v/bin/python" "$src/t/ref/make-chat-goldens.py" "$tmp/$v" ||
		{ echo "make-chat-goldens: the generator failed under transformers $v.x" >&2; exit 1; }
done
if ! diff -r "$tmp/4" "$tmp/5" >/dev/null 2>&1; then
	echo "make-chat-goldens: FAILED: transformers 4.57.6 and 5.24.0 give different files" >&2
	first_diff "$tmp/4" "$tmp/5" 4.57.6 5.24.0
	exit 1
fi
if [ "$check" = 1 ]; then
	if diff -r "$tmp/5" "$out" >/dev/null 2>&1; then
		echo "make-chat-goldens: '$out' is up to date ($(($(date +%s) - start)) s)" >&2
		exit 0
	fi
	echo "make-chat-goldens: '$out' differs from what the generator writes:" >&2
	first_diff "$tmp/5" "$out" generated "$out"
	exit 3
fi
mkdir -p "$(dirname "$out")" && rm -rf "$out" && cp -R "$tmp/5" "$out" ||
	{ echo "make-chat-goldens: cannot write '$out'" >&2; exit 1; }
echo "make-chat-goldens: wrote '$out' ($(du -sk "$out" | cut -f1) KB) in $(($(date +%s) - start)) s; 4.x and 5.x agree" >&2
