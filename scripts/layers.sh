#!/bin/sh
# layers.sh [ROOT]: check that hp's sources include only their own layer or
# the layers below it, and that no module includes itself around a circle.
#
# The layers, lowest first; lib/FOLDER is the layer FOLDER, kernels/cpu and
# kernels/cuda are "kernels", tools/ sits on top.  This list is the one
# place the order is written (ARCHITECTURE.md explains it).
LAYERS='base kernels format text config comm data backend model plan dist train tools'
#
# A module is a file's path less its extension (lib/comm/comm.c and .h are
# one module).  Every include of a project header names its folder
# ("comm/mesh.h", "cpu/ops.h"); system headers (<...>) are not looked at.
# Prints one line per violation and exits 1 when there is any.
set -eu
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"
find lib kernels tools -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) |
	sort | while read -r f; do
		sed -n 's/^[ \t]*#[ \t]*include[ \t]*"\([^"]*\)".*/\1/p' "$f" | sed "s|^|$f |"
	done | awk -v layers="$LAYERS" '
	function layer(path,   a) {
		split(path, a, "/")
		if (a[1] == "lib") return a[2]
		if (a[1] == "kernels" || a[1] == "cpu" || a[1] == "cuda") return "kernels"
		if (a[1] == "tools") return "tools"
		return a[1]
	}
	function module(path) { sub(/\.(c|h|cu|cuh)$/, "", path); return path }
	BEGIN { n = split(layers, L, " "); for (i = 1; i <= n; i++) rank[L[i]] = i }
	{
		src = $1; inc = $2
		# where the included file lives: lib/X/..., kernels/X/..., or beside src
		if (inc ~ /^(cpu|cuda)\//) tgt = "kernels/" inc
		else if (inc ~ /\//) tgt = "lib/" inc
		else {
			d = src; sub(/\/[^\/]*$/, "", d)
			if (d != "tools") { printf "%s: #include \"%s\" does not name its folder\n", src, inc; bad = 1 }
			tgt = d "/" inc
		}
		if (!(layer(tgt) in rank)) { printf "%s: #include \"%s\": no layer \"%s\"\n", src, inc, layer(tgt); bad = 1; next }
		if (rank[layer(tgt)] > rank[layer(src)]) {
			printf "%s: #include \"%s\" goes up from layer %s to %s\n", src, inc, layer(src), layer(tgt)
			bad = 1
		}
		if (module(src) != module(tgt)) print module(src), module(tgt) > "/dev/stderr"
	}
	END { exit bad }' 2>"${TMPDIR:-/tmp}/layers.$$" || bad=1
# a circle of modules: tsort names it
if ! tsort "${TMPDIR:-/tmp}/layers.$$" >/dev/null 2>"${TMPDIR:-/tmp}/layers.$$.cyc"; then
	# the first circle tsort found, on one line
	awk '/input contains a loop/ { if (n++) exit; next } n { sub(/^[^ ]*: /, ""); c = c $0 " -> " }
		END { print "a circle of modules: " c "(back to the first)" }' "${TMPDIR:-/tmp}/layers.$$.cyc"
	bad=1
fi
rm -f "${TMPDIR:-/tmp}/layers.$$" "${TMPDIR:-/tmp}/layers.$$.cyc"
exit ${bad:-0}
