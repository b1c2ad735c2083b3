#!/bin/sh
# check-clean-clone.sh - prove the README's set-up commands from a clean clone.
#
# Clones the repository's committed HEAD into a scratch directory (so
# nothing uncommitted or ignored can help), then runs the README's two
# commands there: the install+build+demo line (its apt-get part only when
# run as root or with --install) and `make check`.  Prints one verdict line.
#
# usage: scripts/check-clean-clone.sh [--install] [--keep]
set -eu

install=0 keep=0
for a in "$@"; do
	case $a in
	--install) install=1 ;;
	--keep) keep=1 ;;
	*) echo "usage: scripts/check-clean-clone.sh [--install] [--keep]" >&2; exit 2 ;;
	esac
done

src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/hp-clone.XXXXXX")
[ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT
git clone -q "$src" "$work/hp"
cd "$work/hp"

# The README's first command, as written (one line starting with "sudo apt-get").
first=$(grep -m1 '^    sudo apt-get' README.md | sed 's/^    //')
[ -n "$first" ] || { echo "check-clean-clone: README has no 'sudo apt-get' line" >&2; exit 1; }
if [ "$install" = 1 ] || [ "$(id -u)" = 0 ]; then
	cmd=$first
else
	cmd=${first#*&& make}      # skip the install, keep "make -j2 && make demo"
	cmd="make$cmd"
fi
[ "$(id -u)" = 0 ] && cmd=$(printf '%s' "$cmd" | sed 's/sudo //g')
echo "+ $cmd"
sh -c "$cmd" >"$work/first.log" 2>&1 || { tail -n 30 "$work/first.log"; echo "check-clean-clone: FAIL (first command)"; exit 1; }
tail -n 6 "$work/first.log"

second=$(grep -m1 '^    make check' README.md | sed 's/^    //')
echo "+ $second"
sh -c "$second" >"$work/check.log" 2>&1 || { tail -n 30 "$work/check.log"; echo "check-clean-clone: FAIL (make check)"; exit 1; }
tail -n 3 "$work/check.log"
echo "check-clean-clone: PASS ($(git rev-parse --short HEAD))"
