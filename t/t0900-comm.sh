#!/bin/sh
test_description='lib/comm: the communicators of every mesh dim, their collectives and byte counters, under mpiexec'
. "$(dirname "$0")/test-lib.sh"

# test-comm prints TAP from rank 0 with every process's verdict; under
# prove it runs as one process, here as 4 and 8 (oversubscribed: 2 cores).
for n in 4 8; do
	test_expect_success MPI "$n processes: every dim's collectives give the group's values and count their bytes" '
		mpiexec -n '$n' "$HP_BUILD_DIR/t/test-comm" >out'$n' 2>err'$n' &&
		cat out'$n' &&
		grep -q "^1\.\.[1-9]" out'$n' &&
		! grep -q "^not ok" out'$n' &&
		test $(grep -c "^ok" out'$n') -ge 50
	'
done

test_done
