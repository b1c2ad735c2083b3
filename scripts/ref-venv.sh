#!/bin/sh
# ref-venv.sh - make, once, the virtual environment of the PyPI references:
# torch 2.15.0, transformers 5.24.0, safetensors 0.8.0 and numpy.
#
#     scripts/ref-venv.sh [--check] [DIR]      (default DIR: build/ref-venv)
#
# The one place these pins live: t/ref/make-hf-goldens.sh (the data/hf
# goldens, transformers itself) and bench/run.sh (`make bench`'s torch 2.x
# column, beside Debian's torch 1.13) both call it, so both use the same
# venv and the same torch.  torch comes from PyPI as pip resolves it on
# Linux x86-64, CUDA wheels included (about 5.6 GB installed; the CPU-only
# wheels live on another index, which this project does not reach).  Only
# the CPU is used.
#
# The venv counts as made when pip's metadata in it has all four packages,
# the three pinned ones at their versions (checked after an install by
# importing them too); a venv left half-made by an interrupted install does
# not, and the next call installs into it again (pip skips what is there).
# A venv cannot be moved once made (its scripts name their folder), so it
# is installed in place, not built elsewhere and renamed.
#
# --check   make nothing: exit 0 when DIR is made, 1 when not
#
# Prints DIR's python on stdout when it is ready; progress and pip's errors
# go to stderr.  Exit 0 ready, 1 when the venv is missing (--check) or pip
# failed, 2 on a bad command line.  Needs PyPI the first time; make check
# never calls it.
#
# Environment:
#   HP_REF_PYTHON   the python that makes the venv (default: python3)
set -u

TORCH=2.15.0
TRANSFORMERS=5.24.0
SAFETENSORS=0.8.0

check=0
case ${1:-} in
--check) check=1; shift ;;
-h|--help) sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'; exit 0 ;;
-*) echo "ref-venv: unknown option '$1'" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "usage: scripts/ref-venv.sh [--check] [DIR]" >&2; exit 2; }
src=$(cd "$(dirname "$0")/.." && pwd) || exit 1
venv=${1:-$src/build/ref-venv}
py=${HP_REF_PYTHON:-python3}

# ready: the venv's packages are installed at the pinned versions, by their
# metadata (pip writes it last; importing torch and transformers to ask
# would take seconds, and t/t1300 calls this)
ready() {
	[ -x "$venv/bin/python" ] && "$venv/bin/python" - "$TORCH" "$TRANSFORMERS" "$SAFETENSORS" <<-'EOF' 2>/dev/null
	import sys
	from importlib.metadata import version
	have = [version(p).split("+")[0] for p in ("torch", "transformers", "safetensors")]
	version("numpy")
	sys.exit(0 if have == sys.argv[1:] else 1)
	EOF
}

if ready; then
	echo "$venv/bin/python"
	exit 0
fi
[ "$check" = 0 ] || exit 1

echo "ref-venv: installing torch $TORCH, transformers $TRANSFORMERS, safetensors $SAFETENSORS and numpy into '$venv' (about 5.6 GB from PyPI, once)" >&2
start=$(date +%s)
mkdir -p "$(dirname "$venv")" &&
"$py" -m venv "$venv" &&
"$venv/bin/pip" install -q --disable-pip-version-check "torch==$TORCH" \
	"transformers==$TRANSFORMERS" "safetensors==$SAFETENSORS" numpy >&2 ||
	{ echo "ref-venv: cannot make '$venv' (see pip's message above)" >&2; exit 1; }
ready && "$venv/bin/python" -c 'import numpy, safetensors, torch, transformers' >&2 ||
	{ echo "ref-venv: '$venv' was installed but does not import the pinned versions" >&2; exit 1; }
echo "ref-venv: '$venv' ready in $(($(date +%s) - start)) s" >&2
echo "$venv/bin/python"
