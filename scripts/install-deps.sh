#!/bin/sh
# shellcheck disable=SC2086,SC2116  # the package lists are split on purpose (set -f)
# install-deps.sh - install the Debian 12 packages that hp's build,
# `make check` and `make demo` need, as root or through sudo.  This is the
# one list of hp's system packages: README.md's set-up command and .ci/run
# both run this script.
#
# usage: sh scripts/install-deps.sh [--bench] [--list]
#
#   --bench  also what `make bench` needs: python3-torch (bench/run.sh and
#            bench/moe-bench.sh time PyTorch 1.13 beside hp-train) and
#            python3-venv (bench/tok-bench.sh puts HF tokenizers from PyPI
#            in a venv).  Not in the default list: nothing in make check or
#            make demo uses them, and torch is big (libtorch alone installs
#            180 MB, with many more dependencies).
#   --list   print the packages, one a line, and install nothing
#
# It asks dpkg first, and when every package is installed it does nothing
# more: no apt-get, no network, no root needed, well under a second.
# Otherwise it runs `apt-get update` and `apt-get install` of the missing
# packages, directly when run as root, else through sudo (which may ask
# for a password, on the terminal only).  Noninteractive: apt and dpkg
# read no standard input and ask nothing (DEBIAN_FRONTEND=noninteractive,
# old config files kept).  Quiet: apt's output goes to a log, of which
# only its W:/E: lines are shown, or its last lines when a step fails.
#
# Environment: HP_DEPS_FORCE=1 runs apt-get update and install (of the
# whole list, upgrading nothing) even when every package is installed;
# scripts/check-clean-clone.sh uses it to prove the apt-get path.
#
# Exit status: 0 every package is installed; 1 apt-get failed; 2 usage;
# 3 not root, and sudo is missing or refused; 4 no dpkg-query or apt-get
# (not a Debian system).
set -eu
set -f    # the lists below are split on spaces, never globbed

me="install-deps.sh"
die() { code=$1; shift; echo "$me: $*" >&2; exit "$code"; }

# build: mpicc (mpich), gcc/make (build-essential), the libraries' headers;
# make check: prove (perl, via build-essential), jq, mandoc (man-page tests),
# clang + libclang-rt-14-dev (the libFuzzer targets), slurm-wlm (a real local
# Slurm for scripts/hp-slurm.sbatch); make demo: gnuplot-nox (loss.png).
pkgs="build-essential mpich libmpich-dev libyaml-dev libjansson-dev libzstd-dev
libpcre2-dev libutf8proc-dev libopenblas-dev jq mandoc gnuplot-nox clang
libclang-rt-14-dev slurm-wlm"
bench_pkgs="python3-torch python3-venv"

list=0
for a in "$@"; do
	case $a in
	--bench) pkgs="$pkgs $bench_pkgs" ;;
	--list) list=1 ;;
	*) die 2 "usage: sh scripts/install-deps.sh [--bench] [--list]" ;;
	esac
done
pkgs=$(echo $pkgs)    # one line, single spaces
if [ "$list" = 1 ]; then
	printf '%s\n' $pkgs
	exit 0
fi

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
	die 4 "needs dpkg-query and apt-get (Debian 12); install by hand: $pkgs"
fi

# not_installed PKG...: those of the packages dpkg does not report installed
not_installed() {
	have=" $(dpkg-query -W -f='${db:Status-Status} ${Package}\n' "$@" 2>/dev/null |
		awk '$1 == "installed" { printf "%s ", $2 }')" || true
	out=
	for p in "$@"; do
		case $have in *" $p "*) ;; *) out="$out $p" ;; esac
	done
	echo ${out# }
}
count() { echo $#; }

n=$(count $pkgs)
missing=$(not_installed $pkgs)
if [ -z "$missing" ]; then
	if [ "${HP_DEPS_FORCE:-0}" != 1 ]; then
		echo "$me: all $n packages installed"
		exit 0
	fi
	install=$pkgs
else
	install=$missing
fi

# Root directly, else sudo: without a prompt if it can, with one only on a
# terminal; every apt-get below then runs as `sudo -n`, which never waits.
if [ "$(id -u)" = 0 ]; then
	sudo=
elif ! command -v sudo >/dev/null 2>&1; then
	die 3 "not root and no sudo: run it as root, or install sudo; to install: $install"
elif sudo -n true 2>/dev/null; then
	sudo="sudo -n"
elif (: </dev/tty) 2>/dev/null && sudo -v; then
	sudo="sudo -n"
else
	die 3 "not root, and sudo refused (or had no terminal to ask for a password on): run it as root, or as a user with sudo; to install: $install"
fi

log=$(mktemp "${TMPDIR:-/tmp}/hp-install-deps.XXXXXX")
trap 'rm -f "$log"' EXIT
# apt_get ARGS...: apt-get as root, noninteractive, its output to the log
apt_get() {
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get -q -y \
		-o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0 \
		-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
		"$@" </dev/null >>"$log" 2>&1
}
fail() {
	tail -n 25 "$log" >&2
	die 1 "$* failed (its last lines above)"
}

echo "$me: installing $(count $install) packages${sudo:+ with sudo}: $install"
apt_get update || fail "apt-get update"
apt_get install --no-upgrade $install || fail "apt-get install"
grep -E '^(W|E): ' "$log" >&2 || true

# Believe dpkg, not only apt's exit code.
left=$(not_installed $install)
[ -z "$left" ] || fail "apt-get install (still not installed: $left)"
echo "$me: all $n packages installed"
