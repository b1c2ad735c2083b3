#!/bin/sh
test_description='the EXAMPLES of hp-plan(1), hp-convert(1), hp-data(1) and hp-verify(1) run as written'
. "$(dirname "$0")/test-lib.sh"

# Each page's "$ " commands run in order with sh -c, in a directory set up
# as its EXAMPLES say (hp-train(1)'s train.yaml and data/, or the top of the
# source tree for hp-data(1)); a command the page says fails must exit with
# the status the page gives, every other with 0, and output the page shows
# under a command must be what it prints; then each test checks what the
# commands made.  hp-train(1)'s own EXAMPLES are run by t/t0400-man.sh.

MAN=$HP_SRC_DIR/man
if command -v mandoc >/dev/null 2>&1; then test_set_prereq MANDOC; fi
if test_have_prereq MANDOC && test_have_prereq MPI; then test_set_prereq MANDOC_MPI; fi

# man_examples PAGE: the EXAMPLES section as plain text, unindented
man_examples () {
	mandoc -Tascii -Owidth=300 "$1" | col -bx | sed -n '/^EXAMPLES/,/^SEE ALSO/p' | sed 's/^       //'
}

# The commands of an EXAMPLES section: each line that starts with "$ ",
# joined with the lines after it while it ends in "&&", "|" or "\" (the "\"
# dropped).  The lines after a command up to a blank line are the output the
# page shows for it; the paragraph of text before a command gives the exit
# status it must have, when it says "exit status is N" or "exits with status
# N", else it is 0.  With mode=cmd: the commands, one a line; with
# mode=shown or mode=status and want=N: command N's output or status.
examples_awk='
function status(p) {
	if (!match(p, /exit(s with)? status (is )?[0-9]+/)) return 0
	p = substr(p, RSTART, RLENGTH); sub(/.* /, "", p); return p
}
/^\$ / {
	n++; cmd = substr($0, 3)
	while (cmd ~ /(&&|\||\\)$/ && (getline l) > 0) {
		sub(/\\$/, "", cmd); sub(/^ +/, "", l); cmd = cmd " " l
	}
	if (mode == "cmd") print cmd
	if (mode == "status" && n == want) print status(text)
	out = 1; para = ""; next
}
/^$/ { if (para != "") text = para; para = ""; out = 0; next }
out { if (mode == "shown" && n == want) print; next }
{ para = para " " $0 }
'

# example_cmds PAGE: the commands of PAGE's EXAMPLES, one a line
example_cmds () {
	man_examples "$1" | awk -v mode=cmd "$examples_awk"
}

# example_shown PAGE N: the output PAGE shows for its N-th command
example_shown () {
	man_examples "$1" | awk -v mode=shown -v want="$2" "$examples_awk"
}

# example_status PAGE N: the exit status PAGE gives its N-th command
example_status () {
	man_examples "$1" | awk -v mode=status -v want="$2" "$examples_awk"
}

# run_examples PAGE: run the commands of man/PAGE's EXAMPLES in the current
# directory, listing them in cmds; command N's standard output and error go
# to ex-N.out and ex-N.err, and ex-N.status holds the status the page says
run_examples () {
	page=$MAN/$1
	example_cmds "$page" >cmds && test -s cmds || return 1
	n=0
	while read -r cmd; do
		n=$((n + 1))
		example_status "$page" $n >ex-$n.status && want=$(cat ex-$n.status) || return 1
		echo "+ $cmd"
		timeout 120 sh -c "$cmd" </dev/null >ex-$n.out 2>ex-$n.err
		got=$?
		if [ "$got" != "$want" ]; then
			cat ex-$n.out ex-$n.err
			echo "exit status $got, the page says $want"
			return 1
		fi
		test_no_sanitizer_report ex-$n.err || return 1
		example_shown "$page" $n >ex-$n.shown || return 1
		if [ -s ex-$n.shown ]; then
			diff -u ex-$n.shown ex-$n.out || { echo "not the output the page shows"; return 1; }
		fi
	done <cmds
}

# example_at GLOB: ex-N for the first command in cmds that matches GLOB
example_at () {
	i=0
	while read -r c; do
		i=$((i + 1))
		case "$c" in $1) echo "ex-$i"; return 0 ;; esac
	done <cmds
	echo "no example matches $1" >&2
	return 1
}

# in_scratch DIR: make DIR, with data/ and train.yaml as hp-train(1)'s
# EXAMPLES have them, and enter it
in_scratch () {
	mkdir "$1" && cd "$1" && ln -s ../data data && cp ../train.yaml train.yaml
}

test_expect_success MANDOC 'setup: data/ and the train.yaml of hp-train(1), for 4 steps' '
	mkdir data && ln -s "$DATA/stories260K" data/stories260K && ln -s "$DATA/ref" data/ref &&
	hp-test-tool mkidx --vocab 512 --records-of 257 -o data/tinystories \
		"$DATA/tokenizers/vectors/stories260K_hf_tokenizers_0.23.2.jsonl" &&
	man_examples "$MAN/hp-train.1" | sed -n "/^model:/,/^checkpoint:/p" >train.yaml &&
	grep -q "^  pretrained_model_name_or_path: data/stories260K/hf$" train.yaml &&
	grep -q "^  train_iters: 200$" train.yaml &&
	sed -i "s/^  train_iters: 200$/  train_iters: 4/" train.yaml
'

test_expect_success MANDOC 'the EXAMPLES of hp-plan(1) run as written' '
	in_scratch plan &&
	run_examples hp-plan.1 &&
	test $(wc -l <cmds) = 5 &&
	jq -e ".world_size == 8 and .parallel.tp == 2 and .parallel.cp == 2 and .parallel.dp == 2 and
		.parallel.sequence_parallel and .parallel.dp_shard == 4 and
		.config.training.micro_batch_size == 4" plan.json &&
	e=$(example_at "hp-plan --explain plan.json") &&
	head -n 1 $e.out >first &&
	echo "plan $(jq -r .hash plan.json)  world 8" >expect &&
	diff -u expect first &&
	grep -q "^  tp  *{0,1} {2,3} {4,5} {6,7}$" $e.out &&
	e=$(example_at "hp-plan train.yaml --world 8") &&
	test $(cat $e.status) = 3 &&
	grep "global_batch_size" $e.err &&
	test ! -s $e.out &&
	e=$(example_at "hp-plan train.yaml --world 64 *") &&
	test -s $e.shown && test -s $(example_at "hp-plan train.yaml --world 4 *").shown
'

test_expect_success MANDOC_MPI 'the EXAMPLES of hp-convert(1) run as written' '
	in_scratch convert &&
	run_examples hp-convert.1 &&
	test $(wc -l <cmds) = 6 &&
	for d in shards shards8; do
		test $(ls $d | grep -c "^rank-0000[0-7]-of-00008\.safetensors$") = 8 || return 1
	done &&
	jq -e ".world_size == 8 and .parallel.tp == 2 and .parallel.cp == 2" shards/plan.json &&
	grep -x "hp-convert: .shards.: 8 shards match plan [0-9a-f]*\.\.\. and their checksums" \
		$(example_at "hp-convert --verify shards").err &&
	test $(ls shards16 | grep -c "^rank-000[01][0-9]-of-00016\.safetensors$") = 16 &&
	hp-convert --verify shards16 &&
	hp-convert --export -o f32 shards16 &&
	hp-test-tool stsame data/stories260K/hf f32 &&
	ls hf >files &&
	printf "%s\n" config.json generation_config.json model-00001-of-00003.safetensors \
		model-00002-of-00003.safetensors model-00003-of-00003.safetensors \
		model.safetensors.index.json special_tokens_map.json tokenizer.json \
		tokenizer_config.json >expect &&
	diff -u expect files &&
	jq -e ".torch_dtype == \"bfloat16\"" hf/config.json &&
	jq -S "del(.torch_dtype)" data/stories260K/hf/config.json >src.json &&
	jq -S "del(.torch_dtype)" hf/config.json >out.json &&
	cmp src.json out.json &&
	cmp data/stories260K/hf/generation_config.json hf/generation_config.json &&
	jq -e ".metadata.total_size == 520064" hf/model.safetensors.index.json &&
	for f in hf/model-*.safetensors; do
		test $(wc -c <$f) -le 200000 || { echo "$f is over 200KB"; return 1; }
	done &&
	hp-test-tool stsame data/stories260K/hf-bf16-sharded hf &&
	cmp data/stories260K/hf/tokenizer.json hf/tokenizer.json
'

test_expect_success MANDOC_MPI 'the EXAMPLES of hp-data(1) run as written, from the top of the source tree' '
	mkdir top && cd top &&
	ln -s "$HP_SRC_DIR/examples" examples && ln -s "$DATA" data &&
	run_examples hp-data.1 &&
	test $(wc -l <cmds) = 9 &&
	e=$(example_at "hp-data encode --tokenizer data/stories260K/hf *") &&
	test $(wc -l <$e.out) = $(wc -l <examples/data/stories.jsonl) &&
	jq -e "(keys == [\"ids\"]) and (.ids | length > 0)" $e.out >/dev/null &&
	e=$(example_at "hp-data encode --tokenizer data/tokenizers/qwen3 --chat-template auto *") &&
	test $(wc -l <$e.out) = 2 &&
	jq -e "(keys == [\"ids\", \"labels\"]) and (.ids | length) == (.labels | length) and
		(.labels | map(select(. != -100)) | length > 0)" $e.out >/dev/null &&
	test -s chat.mask.bin && hp-test-tool dumpidx chat.mask | grep -x "sequences 2" &&
	e=$(example_at "* --role-key from *") &&
	test $(wc -l <$e.out) = 2 && jq -e ".labels[-2] == 151645" $e.out >/dev/null &&
	e=$(example_at "hp-data encode --tokenizer data/tokenizers/qwen3 examples/data/notes.txt *") &&
	test $(wc -l <$e.out) = $(wc -l <examples/data/notes.txt) &&
	! grep -v -x "[0-9][0-9]*" $e.out &&
	e=$(example_at "* --text-key title *") &&
	test $(wc -l <$e.out) = $(wc -l <examples/data/stories.jsonl) &&
	hp-test-tool dumpidx stories >stories.txt &&
	grep -x "sequences 8" stories.txt &&
	sed 1,5d stories.txt | awk "\$NF != 2 { exit 1 }" &&
	hp-test-tool dumpidx packed >packed.txt &&
	sed 1,5d packed.txt | awk "NF != 33 { exit 1 }" &&
	ids=$(sed -n "s/^tokens //p" stories.txt) &&
	grep -x "sequences $((ids / 33))" packed.txt &&
	hp-data build --tokenizer data/tokenizers/mistral -o one examples/data/notes.txt \
		examples/data/stories.jsonl 2>/dev/null &&
	cmp one.bin both.bin && cmp one.idx both.idx
'

test_expect_success MANDOC_MPI 'the EXAMPLES of hp-verify(1) run as written, after the 8-rank example of hp-train(1)' '
	in_scratch verify &&
	example_cmds "$MAN/hp-train.1" | grep -F -e "-o plan.json" >train8 &&
	test_one_line train8 &&
	{ sh -c "$(cat train8)" </dev/null >train8.out 2>&1 || { cat train8.out; return 1; }; } &&
	test -f plan.json && test -f shards/rank-00007-of-00008.safetensors &&
	run_examples hp-verify.1 &&
	test $(wc -l <cmds) = 7 &&
	e=$(example_at "OPENBLAS_NUM_THREADS=1 mpiexec -n 2 hp-verify train.yaml *") &&
	grep -x "verdict: all [0-9]* checks of 2 steps match (.*)" $e.out &&
	grep -x "  pretrained_model_name_or_path: data/ref/qwen3-moe-b" moe.yaml &&
	grep -x "  micro_batch_size: 4" moe.yaml &&
	e=$(example_at "mpiexec -n 8 hp-verify moe.yaml *") &&
	grep "^output  *model\.layers\.1\.mlp  *.* ok$" $e.out &&
	grep -x "verdict: all [0-9]* checks of 2 steps match (.*)" $e.out &&
	e=$(example_at "mpiexec -n 8 hp-verify plan.json --shards shards --steps 3") &&
	grep -x "verdict: all [0-9]* checks of 3 steps match (.*)" $e.out &&
	e=$(example_at "mpiexec -n 8 hp-verify plan.json --shards shards --json *") &&
	test ! -s $e.out &&
	mpiexec -n 8 hp-verify plan.json --shards shards --json >v.json &&
	jq -e ".ok and .first_divergence == null and .steps == 2 and ([.rows[] | select(.ok)] | length) > 0" v.json &&
	e=$(example_at "*--debug.inject_fault=cp_wrong_offset*") &&
	test $(cat $e.status) = 1 &&
	what="step 1, the output of model.layers.0.self_attn (dp shard(batch), cp shard(seq), tp shard(seq)): " &&
	grep -F "first divergence: $what" $e.out &&
	grep -F "hp-verify: the parallel run differs from one process: $what" $e.err &&
	e=$(example_at "mpiexec -n 8 hp-train train.yaml *--model.validate_placement=true") &&
	! grep "validation:" $e.err &&
	grep "^comm: every rank.s bytes per collective and mesh dim equal the plan.s estimate" $e.out
'

test_done
