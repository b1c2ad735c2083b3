#!/bin/sh
test_description='hp-train as a hostile or careless user runs it: outputs that are devices or
pipes, sizes that overflow, runs that go NaN, edited checkpoint state, two runs on one
checkpoint_dir, hyperparameters torch refuses, outputs that fail late, and leftovers'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

if [ "$(id -u)" = 0 ]; then test_set_prereq ROOT; fi

# no_tmp DIR...: nothing named *.tmp.* is left under the folders
no_tmp () {
	left=$(find "$@" -name '*.tmp.*' 2>/dev/null)
	test -z "$left" || { echo "left behind: $left" >&2; return 1; }
}

# refused CODE PATTERN ARGS...: hp-train exits CODE with one stderr line
# matching PATTERN, before any step, leaving no temporary
refused () {
	code=$1 pat=$2; shift 2
	test_must_fail_with "$code" hp-train "$@" >out 2>err &&
	cat err && test_one_line err && grep -q -e "$pat" err &&
	! grep -q "^step " out && no_tmp .
}

# nan_into FILE: the first float of FILE's data section becomes a NaN
nan_into () {
	n=$(od -An -t u8 -N8 "$1" | tr -d " ") &&
	printf '\000\000\300\177' | dd of="$1" bs=1 seek=$((8 + n)) conv=notrunc 2>/dev/null
}

NOCK=--checkpoint.save_ckpt=false

test_expect_success 'setup: TinyStories rows and a config' '
	make_tinystories ts 64 &&
	write_config c.yaml "$MODEL" ts 64 2 4 20 </dev/null &&
	hp-train -q c.yaml $NOCK --max-steps 2 --metrics ref.jsonl --dump-grads refg.safetensors
'

# --- 1. outputs that are not regular files are written in place -------------

test_expect_success 'a FIFO takes the metrics and the gradients in place and stays a FIFO' '
	mkfifo m.fifo g.fifo &&
	{ timeout 60 cat m.fifo >m.got & timeout 60 cat g.fifo >g.got & } &&
	timeout 60 hp-train -q c.yaml $NOCK --max-steps 2 --metrics m.fifo --dump-grads g.fifo &&
	wait &&
	test -p m.fifo && test -p g.fifo &&
	test "$(jq -c .step m.got | tr "\n" " ")" = "1 2 " &&
	hp-test-tool cmpst --max-abs 0 refg.safetensors g.got >cmp && ! grep -q FAIL cmp &&
	no_tmp .
'

# The tests name standard output /dev/fd/1 and /proc/self/fd/1, which take
# the path /dev/stdout takes in hp (lib/base/fileio.c, own_fd): a regression
# cannot then replace the machine's /dev/stdout (a folder of /proc takes
# no temporary file).

test_expect_success '--metrics /dev/fd/1 streams one JSON line per step into a pipeline' '
	hp-train -q c.yaml $NOCK --max-steps 3 --metrics /dev/fd/1 | jq -c .step >steps &&
	test "$(tr "\n" " " <steps)" = "1 2 3 " &&
	test -L /dev/stdout && test -c /dev/null
'

test_expect_success 'standard output on a regular file is written through the descriptor, after the table' '
	hp-train c.yaml $NOCK --max-steps 2 --metrics /proc/self/fd/1 >both &&
	grep -q "^# resolved parameters" both && grep -q "^step 2/2" both &&
	test $(grep -c "^{\"step\"" both) = 2
'

test_expect_success ROOT 'a character device is written in place, never replaced' '
	mknod null.dev c 1 3 &&
	hp-train -q c.yaml $NOCK --max-steps 1 --metrics null.dev --dump-params null.dev &&
	test -c null.dev && no_tmp .
'

test_expect_success 'a symbolic link stays a link; the file it names gets the metrics' '
	mkdir real && ln -s real/m.jsonl link.jsonl &&
	hp-train -q c.yaml $NOCK --max-steps 2 --metrics link.jsonl &&
	test -L link.jsonl && test $(wc -l <real/m.jsonl) = 2
'

test_expect_success 'hp-plan -o and hp-data -o write into a pipe in place' '
	hp-plan c.yaml --world 1 -o /dev/fd/1 | jq -r .format >fmt &&
	test "$(cat fmt)" = hp-plan/1 &&
	hp-data build --tokenizer "$DATA/tokenizers/qwen3" --format text -o d \
		"$DATA/corpus/tinystories_val_excerpt.txt" 2>/dev/null &&
	mkfifo e.bin && { timeout 60 cat e.bin >e.got & } &&
	timeout 60 hp-data build --tokenizer "$DATA/tokenizers/qwen3" --format text -o e \
		"$DATA/corpus/tinystories_val_excerpt.txt" 2>/dev/null &&
	wait && test -p e.bin && cmp d.bin e.got && cmp d.idx e.idx
'

# --- 2. sizes that overflow are refused by the key -------------------------------

test_expect_success 'a global batch of 2^55 rows is refused by hp-plan and hp-train alike' '
	test_must_fail_with 3 hp-plan c.yaml --world 1 --training.global_batch_size=36028797018963968 \
		>/dev/null 2>err && test_one_line err &&
	grep -q "training.global_batch_size: 36028797018963968 rows of 64 tokens.*overflow" err &&
	refused 3 "training.global_batch_size: 36028797018963968 rows" c.yaml \
		--training.global_batch_size=36028797018963968
'

test_expect_success 'a micro-batch of 2^55 rows is refused, not truncated to an int' '
	refused 3 "training.micro_batch_size: 36028797018963968 rows of 64 tokens is more than the 16777216" \
		c.yaml --training.micro_batch_size=36028797018963968 \
		--training.global_batch_size=36028797018963968
'

test_expect_success 'a model whose sizes overflow is refused by hp-plan, not printed as negative bytes' '
	mkdir -p huge && jq ".num_hidden_layers = 1024 | .hidden_size = 16777216 |
		.intermediate_size = 16777216 | .vocab_size = 16777216 | .num_attention_heads = 16384 |
		.num_key_value_heads = 16384 | .head_dim = 1024" "$MODEL/config.json" >huge/config.json &&
	sed "s|$MODEL|$PWD/huge|" c.yaml >h.yaml &&
	sed -i "s|from_pretrained|from_config|" h.yaml &&
	test_must_fail_with 3 hp-plan h.yaml --world 1 >/dev/null 2>err && test_one_line err &&
	grep -q "huge/config.json.: the parameters overflow 64 bits" err &&
	jq ".hidden_size = 16777217" huge/config.json >huge/c2 && mv huge/c2 huge/config.json &&
	test_must_fail_with 4 hp-plan h.yaml --world 1 >/dev/null 2>err && test_one_line err &&
	grep -q "hidden_size 16777217 is more than hp can size" err
'

# --- 3. a NaN run stops, by default ------------------------------------------------

BLOWUP="--lr_scheduler=null --optimizer.adamw_config.adamw_lr=1e30 --training.max_grad_norm=0"

test_expect_success 'a NaN loss stops the run (by default) before its update; no checkpoint is written or deleted for it' '
	sed "/^debug:/d" c.yaml >nodebug.yaml &&
	test_must_fail_with 1 hp-train -q nodebug.yaml $BLOWUP --max-steps 6 --checkpoint.checkpoint_dir=nan \
		--checkpoint.save_steps=1 --checkpoint.keep_last=1 --metrics m.jsonl 2>err &&
	cat err && test_one_line err &&
	grep -q "^hp-train: step 2: the loss is nan and the gradient norm nan: stopped before its update" err &&
	test "$(cat nan/latest_checkpoint_iteration.txt)" = 1 &&
	test -e nan/global_step_1/checkpoint.json && ! test -e nan/global_step_2 &&
	! test -e m.jsonl && no_tmp .
'

test_expect_success 'NaN weights in the model stop the run at step 1' '
	mkdir -p nanw && cp "$MODEL/config.json" "$MODEL/model.safetensors" nanw/ &&
	nan_into nanw/model.safetensors &&
	sed "s|$MODEL|$PWD/nanw|" c.yaml >nw.yaml &&
	test_must_fail_with 1 hp-train -q nw.yaml $NOCK --max-steps 2 2>err &&
	test_one_line err && grep -q "step 1: the loss is nan" err
'

test_expect_success 'debug.check_nan_inf: false trains on, and the metrics stay JSON (null)' '
	hp-train -q c.yaml $BLOWUP $NOCK --max-steps 3 --debug.check_nan_inf=false --metrics m.jsonl &&
	jq -s -e "(.[0].loss > 0) and .[2].loss == null and .[2].grad_norm == null" m.jsonl
'

test_expect_success 'a weight that overflows is never saved, and hp-convert --export refuses one' '
	test_must_fail_with 1 hp-train -q c.yaml --lr_scheduler=null --optimizer.adamw_config.adamw_lr=1e39 \
		--max-steps 3 --checkpoint.checkpoint_dir=inf --checkpoint.save_steps=1 2>err &&
	cat err && test_one_line err && grep -q "holds -*inf at row .*not saved" err &&
	! test -e inf/latest_checkpoint_iteration.txt && ! ls -d inf/global_step_* 2>/dev/null &&
	hp-train -q c.yaml --lr_scheduler=null --optimizer.adamw_config.adamw_lr=1e39 --max-steps 1 \
		--debug.check_nan_inf=false --checkpoint.checkpoint_dir=inf2 &&
	test_must_fail_with 4 hp-convert --export inf2/global_step_1/model -o inf2-hf 2>err &&
	cat err && test_one_line err && grep -q "holds -*inf at row .*not load" err &&
	! test -e inf2-hf && no_tmp .
'

# --- 4. the checkpoint state is checked -------------------------------------------

test_expect_success 'setup: a checkpoint of step 2' '
	hp-train -q c.yaml --max-steps 2 --checkpoint.checkpoint_dir=st &&
	test "$(cat st/latest_checkpoint_iteration.txt)" = 2 &&
	jq -e ".files | map(.path) | index(\"train_state.json\")" st/global_step_2/checkpoint.json
'

RESUME="--checkpoint.restore_from=LATEST --max-steps 4"

test_expect_success 'an edited step in train_state.json is refused, not resumed from' '
	rm -rf st2 && cp -r st st2 &&
	sed -i "s/\"step\": 2/\"step\": 5/" st2/global_step_2/train_state.json &&
	refused 4 "st2/global_step_2/train_state.json.: its size or CRC-32C is not the one checkpoint.json records" \
		-q c.yaml $RESUME --checkpoint.checkpoint_dir=st2
'

test_expect_success 'a checkpoint.json that does not list train_state.json is refused' '
	rm -rf st2 && cp -r st st2 &&
	jq ".files |= map(select(.path != \"train_state.json\"))" st/global_step_2/checkpoint.json \
		>st2/global_step_2/checkpoint.json &&
	refused 4 "does not list train_state.json" -q c.yaml $RESUME --checkpoint.checkpoint_dir=st2
'

test_expect_success 'a checkpoint in a folder named for another step is refused' '
	rm -rf st2 && cp -r st st2 && mv st2/global_step_2 st2/global_step_3 &&
	echo 3 >st2/latest_checkpoint_iteration.txt &&
	refused 4 "step 2 in a folder named for step 3" -q c.yaml $RESUME --checkpoint.checkpoint_dir=st2
'

test_expect_success 'a data cursor past the data is refused by name, not a BUG' '
	make_tinystories big 16 &&
	write_config b.yaml "$MODEL" big 16 2 4 230 </dev/null &&
	hp-train -q b.yaml --checkpoint.checkpoint_dir=cur --checkpoint.save_steps=230 &&
	refused 4 "cur/global_step_230/train_state.json.: .*cursor position 920 past the [0-9]* rows" \
		-q c.yaml --checkpoint.restore_from=LATEST --training.train_iters=300 --checkpoint.checkpoint_dir=cur
'

test_expect_success 'a LATEST of 10^20 is refused, not clamped' '
	rm -rf st2 && cp -r st st2 && echo 100000000000000000000 >st2/latest_checkpoint_iteration.txt &&
	refused 4 "step 100000000000000000000 is out of range" -q c.yaml $RESUME --checkpoint.checkpoint_dir=st2
'

# --- 5. one run per checkpoint_dir ---------------------------------------------------

test_expect_success 'a second run on a checkpoint_dir in use is refused, naming the holder' '
	HP_CKPT_PAUSE=3 hp-train -q c.yaml --max-steps 1 --checkpoint.checkpoint_dir=busy &
	first=$! &&
	i=0 && while ! grep -q " $first" busy/hp.lock 2>/dev/null && [ $i -lt 100 ]; do
		sleep 0.1; i=$((i + 1)); done &&
	test_must_fail_with 3 hp-train -q c.yaml --max-steps 1 --checkpoint.checkpoint_dir=busy 2>err &&
	{ wait $first; st=$?; } && cat err && test_one_line err &&
	grep -q "busy.: checkpoint_dir is in use by another run (host and pid $(hostname) $first)" err &&
	test $st = 0 && test "$(cat busy/latest_checkpoint_iteration.txt)" = 1 &&
	! test -s busy/hp.lock && no_tmp busy
'

test_expect_success 'the lock of a run that was killed is taken over, and said so' '
	HP_CKPT_PAUSE=30 hp-train -q c.yaml --max-steps 1 --checkpoint.checkpoint_dir=dead &
	first=$! &&
	i=0 && while ! ls -d dead/global_step_1.tmp.* >/dev/null 2>&1 && [ $i -lt 100 ]; do
		sleep 0.1; i=$((i + 1)); done &&
	kill -9 $first && { wait $first; true; } &&
	hp-train -q c.yaml --max-steps 1 --checkpoint.checkpoint_dir=dead 2>err &&
	grep -q "took over the lock left by a run that is gone (host and pid $(hostname) $first)" err &&
	test "$(cat dead/latest_checkpoint_iteration.txt)" = 1 && no_tmp dead
'

# --- 6. hyperparameters as torch checks them ----------------------------------------

test_expect_success 'lr, min_lr, weight decay, betas and eps outside what torch takes are refused' '
	refused 3 "adamw_lr: must be at least 0, got -1" c.yaml --optimizer.adamw_config.adamw_lr=-1 &&
	refused 3 "lr_config.lr: must be at least 0, got -2e-3" c.yaml --lr_scheduler.lr_config.lr=-2e-3 &&
	refused 3 "min_lr: must be at least 0, got -1e-4" c.yaml --lr_scheduler.lr_config.min_lr=-1e-4 &&
	refused 3 "adamw_weight_decay: must be at least 0, got -1" c.yaml \
		--optimizer.adamw_config.adamw_weight_decay=-1 &&
	refused 3 "adamw_betas\[0\]: must be in \[0, 1), got 1.0" c.yaml "--optimizer.adamw_config.adamw_betas=[1.0, 0.9]" &&
	refused 3 "adamw_eps: must be at least 0, got -1e-8" c.yaml --optimizer.adamw_config.adamw_eps=-1e-8 &&
	refused 3 "max_grad_norm: must be at least 0" c.yaml --training.max_grad_norm=-1
'

test_expect_success 'NaN and infinity in the config are refused by key, not reported as memory' '
	refused 3 "training.max_grad_norm: .nan is not a finite number" c.yaml --training.max_grad_norm=.nan &&
	refused 3 "lr_config.lr: .inf is not a finite number" c.yaml --lr_scheduler.lr_config.lr=.inf
'

test_expect_success 'hp-config(5)s example: --optimizer.adamw_config.adamw_lr=3e-4 sets the rate' '
	hp-train c.yaml $NOCK --max-steps 1 --optimizer.adamw_config.adamw_lr=3e-4 >out &&
	grep -q "^optimizer.lr  *0.0003$" out && grep -q "^lr_scheduler.lr  *0.0003$" out &&
	sed "s/lr: 1.0e-3, lr_warmup/lr: 2.0e-3, lr_warmup/" c.yaml >two.yaml &&
	refused 3 "adamw_lr: 1.0e-3, but lr_scheduler.lr_config.lr is 2.0e-3: both name the learning rate" \
		two.yaml
'

# --- 7. outputs fail before the first step, not after the training ---------------

test_expect_success 'a checkpoint_dir that cannot be made fails before the first step' '
	: >afile &&
	refused 5 "afile/ck.: cannot create" c.yaml --max-steps 2 --checkpoint.checkpoint_dir=afile/ck
'

test_expect_success 'a metrics path that is a directory, or in a missing folder, fails before the first step' '
	mkdir -p adir &&
	refused 5 "adir.: is a directory" c.yaml $NOCK --max-steps 2 --metrics adir &&
	refused 5 "nodir/m.jsonl.: cannot create" c.yaml $NOCK --max-steps 2 --metrics nodir/m.jsonl &&
	refused 5 "nodir/p.safetensors.: cannot create" c.yaml $NOCK --max-steps 2 \
		--dump-params nodir/p.safetensors
'

# --- 9. leftovers ----------------------------------------------------------------------

test_expect_success 'SIGTERM during a save removes the temporaries and says so' '
	HP_CKPT_PAUSE=30 hp-train -q c.yaml --max-steps 1 --checkpoint.checkpoint_dir=term \
		--metrics t.jsonl 2>err &
	pid=$! &&
	i=0 && while ! ls -d term/global_step_1.tmp.* >/dev/null 2>&1 && [ $i -lt 100 ]; do
		sleep 0.1; i=$((i + 1)); done &&
	kill -TERM $pid && { wait $pid; test $? = 143; } &&
	cat err && grep -q "^hp-train: stopped by SIGTERM; 2 temporary files removed$" err &&
	no_tmp . && ! test -e t.jsonl && ! test -s term/hp.lock
'

# Hydra's own clean-up SIGKILLs the survivors when it sees a rank die, which
# nothing can observe; without it, the survivors must see the death
# themselves (lib/comm/comm.c), and end the job without leaving temporaries.
# MPICH's launcher may end rank 0 within a millisecond of rank 1's death,
# -disable-auto-cleanup or not, before it looks (it looks every half
# millisecond while it waits): rank 1 dies faster the less memory it has
# to give back.  What must hold: the job fails, a rank that names the dead
# names rank 1 and no other, and what a killed rank 0 leaves (it can
# remove nothing) is its metrics temporary, documented, and a checkpoint
# temporary that the next save removes.
test_expect_success MPI 'a rank that dies: a survivor that looks names it; the next save removes what is left' '
	HP_CKPT_PAUSE=30@1 timeout 60 mpiexec -disable-auto-cleanup -n 2 hp-train -q c.yaml --max-steps 1 \
		--checkpoint.checkpoint_dir=die --fsdp_config.dp_shard_size=2 --metrics d.jsonl 2>err &
	job=$! &&
	# rank 1 pauses after its model shard; rank 0 writes all of its own
	# (model, exp_avg, exp_avg_sq), then waits for rank 1
	i=0 && while ! { ls die/global_step_1.tmp.*/model/rank-00001-of-00002.safetensors &&
		ls die/global_step_1.tmp.*/exp_avg_sq/rank-00000-of-00002.safetensors; } >/dev/null 2>&1 &&
		[ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done &&
	sleep 0.5 &&
	for p in $(pgrep -f "hp-train -q c.yaml --max-steps 1 --checkpoint.checkpoint_dir=die"); do
		r=$(tr "\0" "\n" </proc/$p/environ 2>/dev/null | sed -n "s/^PMI_RANK=//p") &&
		case $r in 0) surv=$p;; 1) victim=$p;; esac
	done &&
	test -n "$victim" && test -n "$surv" && kill -9 $victim &&
	{ wait $job; test $? != 0; } && cat err &&
	! test -e d.jsonl &&
	if grep -q " is gone" err; then
		test "$(grep -c " is gone" err)" = 1 && grep -q "rank 1 (pid $victim) is gone" err
	else
		echo "# the launcher ended rank 0 before it looked"
	fi &&
	{ no_tmp . || {
		echo "# left behind: $(find . -name "*.tmp.*" | tr "\n" " ")" &&
		rm -f "d.jsonl.tmp.$surv" &&
		hp-train -q c.yaml --max-steps 1 --checkpoint.checkpoint_dir=die &&
		no_tmp . && test -d die/global_step_1; }; }
'

test_expect_success 'hp-data stopped by SIGTERM removes its parts and says why it stopped' '
	for i in 1 2 3 4 5 6 7 8; do cat "$DATA/corpus/pride_and_prejudice.txt"; done >big.txt &&
	hp-data build --tokenizer "$DATA/tokenizers/qwen3" --format text -o out big.txt 2>err &
	pid=$! &&
	i=0 && while ! ls out.bin.tmp.* >/dev/null 2>&1 && [ $i -lt 200 ]; do
		sleep 0.05; i=$((i + 1)); done &&
	kill -TERM $pid && { wait $pid; test $? = 143; } &&
	grep -q "^hp-data: stopped by SIGTERM; 1 temporary file removed$" err &&
	test -z "$(ls | grep "^out\.")"
'

test_done
