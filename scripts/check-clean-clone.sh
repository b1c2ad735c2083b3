#!/bin/sh
# check-clean-clone.sh - prove the README's set-up commands from a clean clone.
#
# Clones the repository's committed HEAD into a scratch directory (so
# nothing uncommitted or ignored can help), then runs there, as written, the
# two commands of README.md's "Set-up" section: the install+build+demo line
# (`sh scripts/install-deps.sh && make -j2 && make demo`) and `make check`.
# Prints each command's time and one verdict line.
#
# usage: scripts/check-clean-clone.sh [--as root|sudo-user] [--no-check] [--keep]
#
#   (no --as)       as the user who runs this, with its environment
#   --as root       as root with no sudo on PATH (PATH is a folder of links
#                   to every program on it except sudo), install-deps.sh
#                   made to run apt-get update and install itself
#                   (HP_DEPS_FORCE=1), and checked that it ran them as root
#   --as sudo-user  as a throwaway user with password-less sudo and a login
#                   environment, install-deps.sh made to run apt-get (as
#                   above), and checked that it ran it through sudo.  Needs
#                   root: creates the user and its /etc/sudoers.d file and
#                   removes both at the end; installs the sudo package when
#                   it is absent, and then removes it again
#   --no-check      the first command only, not `make check`
#   --keep          keep the scratch directory (its path is printed)
#
# Exit status: 0 PASS; 1 a command failed (the last lines of its log are
# printed); 2 usage, or a mode this user cannot run.
set -eu

as='' check=1 keep=0
usage() { echo "usage: scripts/check-clean-clone.sh [--as root|sudo-user] [--no-check] [--keep]" >&2; exit 2; }
while [ $# -gt 0 ]; do
	case $1 in
	--as) [ $# -ge 2 ] || usage; as=$2; shift ;;
	--as=*) as=${1#--as=} ;;
	--no-check) check=0 ;;
	--keep) keep=1 ;;
	*) usage ;;
	esac
	shift
done
case $as in
'') ;;
root|sudo-user)
	[ "$(id -u)" = 0 ] || { echo "check-clean-clone: --as $as needs root" >&2; exit 2; } ;;
*) usage ;;
esac

src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/hp-clone.XXXXXX")
user='' sudoers='' added_sudo=0
cleanup() {
	if [ -n "$sudoers" ]; then rm -f "$sudoers"; fi
	if [ -n "$user" ]; then userdel -r -f "$user" >/dev/null 2>&1 || true; fi
	if [ "$added_sudo" = 1 ]; then
		SUDO_FORCE_REMOVE=yes DEBIAN_FRONTEND=noninteractive apt-get -qq -y purge sudo \
			</dev/null >/dev/null 2>&1 || echo "check-clean-clone: could not remove sudo again" >&2
	fi
	if [ "$keep" = 1 ]; then echo "check-clean-clone: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
git clone -q "$src" "$work/hp"
cd "$work/hp"
rev=$(git rev-parse --short HEAD)

# The Set-up section's indented lines: the first command, then the second.
cmds=$(awk '/^## /{ s = /^## Set-up/ } s && /^    [^ ]/{ sub(/^    /, ""); print }' README.md)
first=$(printf '%s\n' "$cmds" | sed -n 1p)
second=$(printf '%s\n' "$cmds" | sed -n 2p)
case $first in
*scripts/install-deps.sh*) ;;
*) echo "check-clean-clone: README's Set-up section has no install-deps.sh command: '$first'" >&2; exit 1 ;;
esac
[ -n "$second" ] || { echo "check-clean-clone: README's Set-up section has no second command" >&2; exit 1; }
n=$(sh scripts/install-deps.sh --list | wc -l | tr -d ' ')

# run NAME CMD: CMD in the clone, as the mode says; its output to NAME.log
run() {
	t0=$(date +%s)
	echo "+ $2${as:+   (as $as)}"
	case $as in
	'') sh -c "$2" ;;
	root) PATH=$work/nosudo HP_DEPS_FORCE=1 sh -c "$2" ;;
	sudo-user) runuser -l "$user" -c "cd '$work/hp' && export HP_DEPS_FORCE=1 && $2" ;;
	esac >"$work/$1.log" 2>&1 </dev/null || {
		tail -n 30 "$work/$1.log"
		echo "check-clean-clone: FAIL ($1 command, after $(($(date +%s) - t0)) s${as:+, as $as})"
		exit 1
	}
	echo "  ($(($(date +%s) - t0)) s)"
}

case $as in
root)
	# every program on PATH, the first of each name, except sudo; where
	# apt's _apt user can reach it too (apt-get update runs gpgv as _apt)
	chmod 755 "$work"
	mkdir "$work/nosudo"
	old_ifs=$IFS; IFS=:
	for d in $PATH; do
		[ -d "$d" ] || continue
		for f in "$d"/*; do
			b=${f##*/}
			case $b in sudo|sudoedit|sudoreplay) continue ;; esac
			[ -e "$work/nosudo/$b" ] || [ -L "$work/nosudo/$b" ] && continue
			[ -f "$f" ] && [ -x "$f" ] && ln -s "$f" "$work/nosudo/$b"
		done
	done
	IFS=$old_ifs
	if PATH=$work/nosudo command -v sudo >/dev/null 2>&1; then
		echo "check-clean-clone: sudo still on the PATH made without it" >&2; exit 1
	fi
	;;
sudo-user)
	if ! command -v sudo >/dev/null 2>&1; then
		echo "check-clean-clone: installing the sudo package for this check (removed at the end)"
		DEBIAN_FRONTEND=noninteractive apt-get -qq -y install sudo </dev/null >"$work/sudo.log" 2>&1 ||
			{ tail -n 20 "$work/sudo.log"; echo "check-clean-clone: cannot install sudo" >&2; exit 2; }
		added_sudo=1
	fi
	user=hpclone$$
	useradd -m -s /bin/sh "$user"
	sudoers=/etc/sudoers.d/hp-check-clean-clone-$user
	mkdir -p /etc/sudoers.d
	printf '%s ALL=(ALL) NOPASSWD: ALL\n' "$user" >"$sudoers.tmp"
	chmod 0440 "$sudoers.tmp"
	visudo -cqf "$sudoers.tmp" >/dev/null
	mv "$sudoers.tmp" "$sudoers"
	chmod 755 "$work"
	chown -R "$user:" "$work/hp"
	if [ "$(runuser -l "$user" -c 'id -u')" = 0 ] || ! runuser -l "$user" -c 'sudo -n true'; then
		echo "check-clean-clone: the throwaway user $user has no working sudo" >&2; exit 1
	fi
	;;
esac

run first "$first"
tail -n 6 "$work/first.log"
# the mode's proof: install-deps.sh ran apt-get itself (root) or through sudo
case $as in
root) pat="^install-deps.sh: installing $n packages: " ;;
sudo-user) pat="^install-deps.sh: installing $n packages with sudo: " ;;
*) pat="^install-deps.sh: " ;;
esac
if ! grep -q "$pat" "$work/first.log" || ! grep -q "^install-deps.sh: all $n packages installed" "$work/first.log"; then
	echo "check-clean-clone: FAIL (install-deps.sh did not say '$pat' and 'all $n packages installed')"; exit 1
fi
if [ "$check" = 1 ]; then
	run check "$second"
	tail -n 3 "$work/check.log"
fi
echo "check-clean-clone: PASS ($rev${as:+, as $as}$([ "$check" = 1 ] || echo ", first command only"))"
