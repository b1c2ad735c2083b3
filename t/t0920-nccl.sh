#!/bin/sh
test_description='lib/comm/comm_nccl: the NCCL collectives on device buffers equal the MPI backend, under mpiexec'
. "$(dirname "$0")/test-lib.sh"

test_have_prereq MPI || test_skip_all 'no mpiexec'

# test-nccl prints TAP from rank 0 with every process's verdict; under
# prove it runs as one process (a group of one), here as 2, which needs two
# GPUs on the host: with fewer it skips itself, saying why, and so passes.
test_expect_success GPU '2 processes: every collective on the device equals the MPI backend, counted alike' '
	mpiexec -n 2 "$HP_BUILD_DIR/t/test-nccl" >out 2>err &&
	cat out &&
	if grep -q "^1\.\.0 # skip" out; then
		true
	else
		grep -q "^1\.\.[1-9]" out &&
		! grep -q "^not ok" out &&
		test $(grep -c "^ok" out) -ge 8
	fi
'

test_done
