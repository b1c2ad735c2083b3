#!/bin/sh
test_description='make bench in smoke mode: every benchmark still runs and prints its table'
. "$(dirname "$0")/test-lib.sh"

# Each benchmark under HP_BENCH_SMOKE=1 (gemm-bench: --smoke) runs at tiny
# sizes for one or two steps and prints its usual table; nothing it times
# is judged, here or there.  What is checked: it exits 0, and its header
# and rows are there.  A PyTorch, HF tokenizers or the torch 2.x venv that
# is missing is a column of "-" with a printed reason, not a failure, so
# this passes on a machine without them (CI's); mpiexec missing makes the
# MPI benchmarks skip here as they skip themselves.  Benchmarks
# oversubscribe 2 cores as the other tests do: one thread each.  Every run
# has a timeout (a hung mpiexec must not hang the suite), far above the few
# seconds each takes.
BENCH=$HP_SRC_DIR/bench
HP_BENCH_SMOKE=1
export HP_BENCH_SMOKE
unset HP_BENCH_THREADS HP_BENCH_STEPS HP_BENCH_ROUNDS HP_BENCH_MODELS HP_BENCH_TORCH_ONLY HP_BENCH_TORCH2 \
	HP_BENCH_PYTHON HP_BENCH_QUICK HP_REF_VENV HP_TOKBENCH_VENV HP_CHATBENCH_PYTHON

bench () {
	timeout 300 "$@"
}

# has FILE EXTENDED-REGEX...: every pattern matches a line of FILE
has () {
	f=$1; shift
	for re in "$@"; do
		grep -q -E "$re" "$f" || { echo "no line matching '$re' in $f:" >&2; cat "$f" >&2; return 1; }
	done
}

test_expect_success 'run.sh: hp-train against torch 1.13 and 2.x, every column or its reason' '
	bench sh "$BENCH/run.sh" >run.out 2>run.err &&
	has run.out "^model +params +threads +hp tok/s +[0-9.x]+ tok/s +[0-9.x]+ tok/s +hp/" \
		"^stories260K +260K +1 +[0-9]+ " "^first-step loss" "^  stories260K +threads 1: hp [0-9.]+, " \
		"^smoke mode: " "^  stories260K +threads 1: 1\.7 MFLOP/token; hp [0-9.]+, torch " &&
	if test_have_prereq TORCH; then
		has run.out "^stories260K +260K +1 +[0-9]+ +[0-9]+ " "^wide +[0-9.]+K +1 +[0-9]+ +[0-9]+ " \
			"torch 1.13 [0-9.]+, torch"
	else
		has run.out "^torch 1.13 column skipped: "
	fi &&
	if sh "$HP_SRC_DIR/scripts/ref-venv.sh" --check >/dev/null; then
		has run.out "^stories260K +260K +1 +[0-9]+ +[0-9-]+ +[0-9]+ " "torch 2\.[0-9]+ [0-9.]+"
	else
		has run.out "^torch 2.x column skipped: no venv"
	fi
'

test_expect_success 'run.sh: HP_BENCH_ROUNDS=2 shows medians and the ratios of each round' '
	HP_BENCH_ROUNDS=2 HP_BENCH_MODELS=stories260K bench sh "$BENCH/run.sh" >rounds.out 2>rounds.err &&
	has rounds.out "; 2 rounds: medians, ratios taken within a round" "^stories260K +260K +1 +[0-9]+ " \
		"^the ratios of each round" "^  stories260K +threads 1: ([0-9.]+x|-)/([0-9.]+x|-), ([0-9.]+x|-)/([0-9.]+x|-)\$" &&
	has rounds.err "round 1 of 2" "round 2 of 2"
'

# Outside smoke mode, with an hp-train and a torch 1.13 that report fixed
# speeds: hp at 1600 tok/s in odd rounds and 1000 in even ones, torch at
# 1000.  The table must show the medians (1300 tok/s, 1.30x) and judge each
# round: 1.6x meets 1.5x, 1.0x does not.
test_expect_success 'run.sh: with rounds a target is judged round by round' '
	mkdir -p fake/bin &&
	cat >fake/bin/hp-train <<-\EOF &&
	#!/bin/sh
	c=$(($(cat "$FAKE_COUNT" 2>/dev/null || echo 0) + 1))
	echo $c >"$FAKE_COUNT"
	if [ $((c % 2)) = 1 ]; then t=1.28; else t=2.048; fi
	for s in 1 2 3 4 5 6 7 8 9 10; do
		echo "{\"step\": $s, \"loss\": 5.9, \"tokens\": 2048, \"step_time_s\": $t}"
	done >"$3"
	echo "run.parameters  260000"
	EOF
	cat >fake/torch <<-\EOF &&
	#!/bin/sh
	[ "$1" = -c ] && exit 0
	for a; do
		[ "$a" = --model ] || continue
		echo "{\"tokens_per_s\": 1000, \"first_loss\": 5.9, \"params\": 260000, \"torch_version\": \"1.13.0\", \"attention\": \"eager\"}"
	done
	EOF
	chmod +x fake/bin/hp-train fake/torch &&
	ln -s "$HP_BUILD_DIR/bin/hp-test-tool" fake/bin/hp-test-tool &&
	env -u HP_BENCH_SMOKE HP_BUILD_DIR="$PWD/fake" FAKE_COUNT="$PWD/fake/count" HP_BENCH_ROUNDS=2 \
		HP_BENCH_THREADS=1 HP_BENCH_MODELS=stories260K HP_BENCH_PYTHON="$PWD/fake/torch" HP_BENCH_TORCH2=0 \
		timeout 300 sh "$BENCH/run.sh" >fake.out 2>fake.err &&
	has fake.out "^stories260K +260K +1 +1300 +1000 +- +1\.30x +- +met in 1 of 2 rounds / -\$" \
		"^  stories260K +threads 1: 1\.60x/-, 1\.00x/-\$" \
		"^  stories260K +threads 1: 2\.0 MFLOP/token; hp 2\.7, torch 1\.13 2\.0, torch 2\.x -\$"
'

test_expect_success 'run.sh: HP_BENCH_ROUNDS must be a positive integer' '
	! HP_BENCH_ROUNDS=0 sh "$BENCH/run.sh" >bad.out 2>bad.err &&
	has bad.err "HP_BENCH_ROUNDS=.0.: expected an integer of 1 or more" &&
	test ! -s bad.out
'

test_expect_success 'run.sh: a failed run is a non-zero exit, the table still printed' '
	mkdir -p broken/bin &&
	printf "#!/bin/sh\necho hp-train: broken on purpose >&2\nexit 1\n" >broken/bin/hp-train &&
	chmod +x broken/bin/hp-train &&
	ln -s "$HP_BUILD_DIR/bin/hp-test-tool" broken/bin/hp-test-tool &&
	! env HP_BUILD_DIR="$PWD/broken" HP_BENCH_MODELS=stories260K HP_BENCH_PYTHON=/bin/false HP_BENCH_TORCH2=0 \
		timeout 300 sh "$BENCH/run.sh" >broken.out 2>broken.err &&
	has broken.out "^stories260K +- +1 +failed " &&
	has broken.err "hp-train failed on stories260K" "some runs failed"
'

test_expect_success 'moe-bench.sh: hp-train against the Qwen3-MoE port' '
	bench sh "$BENCH/moe-bench.sh" >moe.out 2>moe.err &&
	has moe.out "^Qwen3-MoE \(hidden 64, " "^threads +hp tok/s +torch tok/s +ratio" "^1 +[0-9]+ " "^target: " &&
	if test_have_prereq TORCH; then has moe.out "^1 +[0-9]+ +[0-9]+ +[0-9.]+x "
	else has moe.out "^torch column skipped: "; fi
'

test_expect_success 'family-bench.sh: hp-train against transformers'\'' GPT-OSS, DeepSeek-V3 and Qwen3-Next' '
	bench sh "$BENCH/family-bench.sh" >oss.out 2>oss.err &&
	has oss.out "^GPT-OSS \(hidden 64, " "^DeepSeek-V3 \(hidden 64, " "^Qwen3-Next \(hidden 64, " "^threads +hp tok/s +hf tok/s +ratio" "^1 +[0-9]+ " "^target: " &&
	if sh "$BENCH/../scripts/ref-venv.sh" --check "${HP_REF_VENV:-$BENCH/../build/ref-venv}" >/dev/null 2>&1; then has oss.out "^1 +[0-9]+ +[0-9]+ +[0-9.]+x "
	else has oss.out "^transformers column skipped: "; fi
'

test_expect_success 'tok-bench.sh: hp tokenizer against HF tokenizers' '
	bench sh "$BENCH/tok-bench.sh" >tok.out 2>tok.err &&
	has tok.out "^tokenizer +text +hp whole +hf whole" "^qwen3 +tinystories_sample.txt +[0-9.]+ " \
		"^llama3 +tinystories_sample.txt +[0-9.]+ " "^target: "
'

test_expect_success 'convert-bench.sh: hp-convert against cp' '
	bench sh "$BENCH/convert-bench.sh" >conv.out 2>conv.err &&
	has conv.out "^model +GB +files +cp GB/s" "^2 layers +[0-9.]+ +1 " "^1 layer +[0-9.]+ +1 " \
		"^target GB/s >= 0.5x cp, 1 process: +- \(smoke\)" "^target peak RSS"
'

test_expect_success 'kernels-bench.sh: kernel-bench and the whole step, with and without the overrides' '
	bench sh "$BENCH/kernels-bench.sh" >kern.out 2>kern.err &&
	has kern.out "^kernel +ref ms +fast ms +speedup" "^attention T=128 H=16/4 D=64 +[0-9.]+ " \
		"^moe E=8 k=2 \(model, T=64\) +[0-9.]+ " "^ce V=4096 chunk 32 \(model, T=64\) +[0-9.]+ " \
		"^  step time s \(median 2-2\) +[0-9.]+ +[0-9.]+ " "^  activation MiB" \
		"^smoke \(not judged\): step time"
'

test_expect_success 'kernel-bench: HP_BENCH_SMOKE=1 alone shrinks it too' '
	bench "$HP_BUILD_DIR/bench/kernel-bench" --what moe >kb.out &&
	has kb.out "\(smoke: tiny sizes" "^moe E=8 k=2 \(model, T=64\)"
'

test_expect_success 'chat-bench.sh: hp chat templates against transformers' '
	bench sh "$BENCH/chat-bench.sh" >chat.out 2>chat.err &&
	has chat.out "^chat templates: conversations rendered" "^smoke mode: 20 conversations" \
		"^qwen3 +20 +[0-9]+ " "^llama3 +20 +[0-9]+ " "^mistral +20 +[0-9]+ " "^chatml +20 +[0-9]+ "
'

test_expect_success 'gemm-bench --smoke: every shape at every CPU level' '
	bench "$HP_BUILD_DIR/bench/gemm-bench" --smoke >gemm.out 2>gemm.err &&
	has gemm.out "^shape +tA +tB +M +N +K +beta +openblas" "^fwd q/o/lm_head " "^geometric-mean" \
		"^multiply-add peak of one core" "^  baseline +peak +[0-9.]+ GFLOP/s, big shapes +[0-9.]+ GFLOP/s = +[0-9]+%"
'

test_expect_success MPI 'parallel-bench.sh: every layout against one process, hp-verify' '
	bench sh "$BENCH/parallel-bench.sh" >par.out 2>par.err &&
	has par.out "^layout +ranks +step s +tok/s" "^one process +1 +[0-9.]+ " \
		"^TP2 x CP2 x EP2, FSDP 2 \(seed\) +8 +[0-9.]+ " "^validation mode: " "^verdict: " \
		"^hp-verify, 2 steps: "
'

test_expect_success MPI 'pp-bench.sh: GPipe, 1F1B and interleaved 1F1B on 4 stages against one process, beside the plan'"'"'s bubble' '
	bench sh "$BENCH/pp-bench.sh" >pp.out 2>pp.err &&
	has pp.out "^schedule +ranks +step s +vs 1 +bubble +p2p wait" "^one process +1 +[0-9.]+ " \
		"^gpipe +4 +[0-9.]+ +[0-9.]+x +42\.9% +([0-9.]+% +){4}([0-9]+ ){3}[0-9]+$" \
		"^1f1b +4 +[0-9.]+ +[0-9.]+x +42\.9% +([0-9.]+% +){4}([0-9]+ ){3}[0-9]+$" \
		"^interleaved +4 +[0-9.]+ +[0-9.]+x +27\.3% +([0-9.]+% +){4}([0-9]+ ){3}[0-9]+$"
'

test_expect_success MPI 'fsdp-bench.sh: 1, 2, 4 and 8 ranks' '
	bench sh "$BENCH/fsdp-bench.sh" >fsdp.out 2>fsdp.err &&
	has fsdp.out "^ranks +step s +tok/s" "^1 +[0-9.]+ " "^2 +[0-9.]+ " "^4 +[0-9.]+ " "^8 +[0-9.]+ "
'

test_expect_success MPI 'mem-bench.sh: peak resident and device memory of 1 to 4 ranks against the plan' '
	bench sh "$BENCH/mem-bench.sh" >mem.out 2>mem.err &&
	has mem.out "^ranks +peak MiB +plan MiB +bound MiB +within +vs 1" "^1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +yes +1.000x" \
		"^2 +[0-9.]+ .* yes " "^4 +[0-9.]+ .* yes " \
		"^1 +[0-9.]+ +[0-9.]+ +2% +1.000x" "^4 +[0-9.]+ +[0-9.]+ +2% +[0-9.]+x" \
		"^experts +layers +launches/step +syncs/step +peak MiB +plan MiB +within" "^4 +1 +[0-9]+ +1 +[0-9.]+ +[0-9.]+ +2%" \
		"^8 +2 +[0-9]+ +1 +[0-9.]+ +[0-9.]+ +2%" "more experts: 1.000x the launches"
'

test_expect_success MPI 'ckpt-bench.sh: checkpoint write and read against dd' '
	bench sh "$BENCH/ckpt-bench.sh" >ckpt.out 2>ckpt.err &&
	has ckpt.out "^ranks +GB +held s +write GB/s" "^1 +[0-9.]+ +[0-9.]+ " "^4 +[0-9.]+ +[0-9.]+ "
'

test_expect_success 'actckpt-bench.sh: off, selective and full, the same final loss' '
	bench sh "$BENCH/actckpt-bench.sh" >ac.out 2>ac.err &&
	has ac.out "^mode +act bytes +plan@4 B +plan/off +RSS MB +step s" "^off +[0-9]+ +[0-9]+ +1.00x " \
		"^selective +[0-9]+ " "^full +[0-9]+ "
'

# gpu-bench's model part on the emulated device (HP_CUDA_EMULATE runs it
# alone; it is built where nvcc is): the counts of a step and the kernel
# profile, whose families' shares sum to 100% and include the GEMMs, the
# experts and attention of a MoE model.
if test -x "$HP_BUILD_DIR/bench/gpu-bench"; then test_set_prereq GPUBENCH; fi
test_expect_success GPUBENCH 'gpu-bench (emulated): syncs, launches, device peak and kernel-time shares' '
	for c in ref/qwen3-moe-a stories260K/hf; do
		HP_CUDA_EMULATE=exact bench "$HP_BUILD_DIR/bench/gpu-bench" --layers 2 --seq 64 --steps 1 \
			"$HP_SRC_DIR/data/$c/config.json" >>gb.out 2>gb.err || return 1
	done &&
	has gb.out "^model .*qwen3-moe-a.* 1 host syncs and [0-9]+ launches a step; device peak [0-9.]+ MiB counted" \
		"^model .*qwen3-moe-a.*: kernel time .*: gemm [0-9.]+% experts [0-9.]+% attention [0-9.]+% routing" \
		"^model .*stories260K.*: kernel time .*: gemm [0-9.]+% attention [0-9.]+%" &&
	grep "kernel time" gb.out | tr " " "\n" | grep "%$" | tr -d % |
		awk "{ s += \$1 } END { exit (s < 199 || s > 201) }"
'

test_done
