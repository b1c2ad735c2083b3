#!/bin/sh
# gpu-deps.sh - fetch, on this (Debian 12) machine, the .deb files of what
# hp links against and a lent GPU machine's image lacks (MPICH, OpenBLAS,
# jansson, libyaml, zstd, PCRE2, utf8proc, jq), into .gpudeps/, which git
# ignores and the device tool carries (`carry: [".gpudeps"]`).
# scripts/gpu-check.sh unpacks them there when mpicc is missing.
set -eu
cd "$(dirname "$0")/.."
mkdir -p .gpudeps
cd .gpudeps
apt-get download \
	mpich libmpich12 libmpich-dev libhwloc15 libhwloc-dev libucx0 libfabric1 libpsm2-2 libpsm-infinipath1 \
	librdmacm1 libibverbs1 libnl-3-200 libnl-route-3-200 libevent-core-2.1-7 libevent-pthreads-2.1-7 \
	libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libopenblas0 libgfortran5 \
	libjansson4 libjansson-dev libyaml-0-2 libyaml-dev libzstd1 libzstd-dev libpcre2-dev libpcre2-8-0 \
	libutf8proc2 libutf8proc-dev jq libjq1 libonig5
ls -l
du -sh .
