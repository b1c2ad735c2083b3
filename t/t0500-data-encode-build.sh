#!/bin/sh
test_description='hp-data: encode equals HF, build reads back as encode in Megatron format, any rank count gives the same bytes, bad input fails cleanly'
. "$(dirname "$0")/test-lib.sh"

TOK=$DATA/tokenizers
VEC=$TOK/vectors
CORPUS=$DATA/corpus
MAN=$HP_SRC_DIR/man
READ_MMIDX="python3 $TEST_DIR/ref/read_mmidx.py"
if command -v python3 >/dev/null 2>&1; then test_set_prereq PYTHON; fi
if command -v mandoc >/dev/null 2>&1; then test_set_prereq MANDOC; fi

# tokenizer NAME: the tokenizer that made vectors/NAME_hf_tokenizers_0.23.2.jsonl
tokenizer () {
	case $1 in
	stories260K) echo "$DATA/stories260K/hf/tokenizer.json" ;;
	*) echo "$TOK/$1/tokenizer.json" ;;
	esac
}

vectors () {
	echo "$VEC/$1_hf_tokenizers_0.23.2.jsonl"
}

# ids_lines < JSONL: each object's "ids" as one line of space-separated ids
ids_lines () {
	jq -r '.ids | map(tostring) | join(" ")'
}

# seqs PREFIX: the sequences of a dataset, one line each, as hp reads them
seqs () {
	hp-test-tool dumpidx "$1" >dump && sed 1,5d dump
}

# pack N < ids, one per line: lines of N ids, the rest dropped (its count in ./dropped)
pack () {
	awk -v n="$1" '{ line = line (k ? " " : "") $0; if (++k == n) { print line; line = ""; k = 0 } }
		END { print k + 0 > "dropped" }'
}

# expect_fail CODE PATTERN ARGS...: hp-data ARGS exits CODE with one stderr line
# matching PATTERN and leaves no out.* file behind
expect_fail () {
	code=$1 pat=$2; shift 2
	rm -f out.*
	test_must_fail_with "$code" timeout 120 hp-data "$@" 2>err &&
	cat err &&
	test_one_line err &&
	grep -q -e "$pat" err &&
	test_no_sanitizer_report err &&
	test -z "$(ls | grep -e "^out\.")"
}

test_expect_success 'encode gives the ids of HF tokenizers 0.23.2 for every test vector' '
	for t in qwen3 llama3 mistral stories260K; do
		hp-data encode --tokenizer "$(tokenizer $t)" "$(vectors $t)" >enc.$t.jsonl &&
		test $(wc -l <enc.$t.jsonl) = 564 &&
		jq -c .ids "$(vectors $t)" >want &&
		jq -c .ids enc.$t.jsonl >got &&
		cmp want got || { echo "encode differs from HF for $t"; diff want got | head; return 1; }
	done
'

test_expect_success 'a tokenizer folder works like its tokenizer.json' '
	hp-data encode --tokenizer "$TOK/qwen3" "$(vectors qwen3)" >folder.jsonl &&
	cmp folder.jsonl enc.qwen3.jsonl
'

test_expect_success 'build reads back as encode, one sequence and one document per record' '
	for t in qwen3 llama3 mistral stories260K; do
		hp-data build --tokenizer "$(tokenizer $t)" -o b.$t "$(vectors $t)" 2>err &&
		test -f b.$t.bin && test -f b.$t.idx &&
		seqs b.$t >got &&
		ids_lines <enc.$t.jsonl >want &&
		cmp want got &&
		grep -q "^sequences 564$" dump && grep -q "^documents 564$" dump || return 1
	done
'

test_expect_success 'build prints its throughput: records, tokens, MB, seconds, MB/s' '
	hp-data build --tokenizer "$(tokenizer qwen3)" -o tp "$(vectors qwen3)" 2>err &&
	cat err && test_one_line err &&
	grep -q "^hp-data: 564 records, $(jq -s "map(.ids | length) | add" enc.qwen3.jsonl) tokens (int32), [0-9.]* MB, [0-9.]* s (.*), [0-9.]* MB/s tokenizing, 1 rank$" err
'

test_expect_success PYTHON 'an independent reader of Megatron'\''s format reads what build wrote' '
	for t in qwen3 llama3 mistral stories260K; do
		$READ_MMIDX b.$t >got &&
		ids_lines <enc.$t.jsonl >want &&
		cmp want got &&
		$READ_MMIDX --info b.$t >info &&
		grep -q "^sequences 564$" info && grep -q "^documents 564$" info || return 1
	done &&
	$READ_MMIDX --info b.qwen3 | grep -q "^dtype int32$" &&
	$READ_MMIDX --info b.llama3 | grep -q "^dtype int32$" &&
	$READ_MMIDX --info b.mistral | grep -q "^dtype uint16$" &&
	$READ_MMIDX --info b.stories260K | grep -q "^dtype uint16$" &&
	seq 0 564 | paste -sd" " | sed "s/^/doc_idx /" >want &&
	grep "^doc_idx" info >got && cmp want got
'

test_expect_success PYTHON 'the reader refuses a damaged dataset' '
	cp b.mistral.bin d.bin && cp b.mistral.idx d.idx &&
	$READ_MMIDX d >/dev/null &&
	printf "X" | dd of=d.idx bs=1 seek=0 conv=notrunc 2>/dev/null &&
	test_must_fail_with 1 $READ_MMIDX d 2>err && grep -q "bad magic" err &&
	cp b.mistral.idx d.idx && head -c -2 b.mistral.bin >d.bin &&
	test_must_fail_with 1 $READ_MMIDX d 2>err && grep -q "d.bin" err
'

test_expect_success 'text files: one record per line, blank lines are empty records' '
	printf "Hello world\n\n  two  spaces\nno newline at the end" >t.txt &&
	hp-data encode --tokenizer "$(tokenizer qwen3)" t.txt >t.jsonl &&
	test $(wc -l <t.jsonl) = 4 &&
	test "$(sed -n 2p t.jsonl)" = "{\"ids\":[]}" &&
	jq -R -c "{text: .}" t.txt >t-as.jsonl &&
	hp-data encode --tokenizer "$(tokenizer qwen3)" t-as.jsonl >t2.jsonl &&
	cmp t.jsonl t2.jsonl &&
	hp-data build --tokenizer "$(tokenizer qwen3)" -o t t.txt &&
	seqs t >got && ids_lines <t.jsonl >want && cmp want got
'

test_expect_success 'each corpus line is one record, whole files included' '
	for f in pride_and_prejudice tinystories_val_excerpt; do
		hp-data encode --tokenizer "$(tokenizer llama3)" "$CORPUS/$f.txt" >c.jsonl &&
		test $(wc -l <c.jsonl) = $(wc -l <"$CORPUS/$f.txt") || return 1
	done
'

test_expect_success '--format, --text-key and standard input' '
	jq -c "{body: .text, n: 1}" "$(vectors mistral)" >body.jsonl &&
	hp-data encode --tokenizer "$(tokenizer mistral)" --text-key body body.jsonl >got &&
	cmp enc.mistral.jsonl got &&
	hp-data encode --tokenizer "$(tokenizer mistral)" --text-key body - <body.jsonl >got &&
	cmp enc.mistral.jsonl got &&
	cp t.txt t.jsonl.txt && cp t.txt tt.jsonl &&
	hp-data encode --tokenizer "$(tokenizer qwen3)" --format text tt.jsonl >got &&
	cmp t.jsonl got &&
	hp-data encode --tokenizer "$(tokenizer qwen3)" --format text - <t.txt >got &&
	cmp t.jsonl got &&
	cp body.jsonl body.data &&
	hp-data encode --tokenizer "$(tokenizer mistral)" --format jsonl --text-key body body.data >got &&
	cmp enc.mistral.jsonl got &&
	hp-data build --tokenizer "$(tokenizer mistral)" --text-key body -o stdin - <body.jsonl &&
	cmp stdin.bin b.mistral.bin && cmp stdin.idx b.mistral.idx
'

test_expect_success 'blank JSONL lines are skipped; several inputs are read in order' '
	{ head -n 3 "$(vectors qwen3)"; echo; printf " \t\n"; sed -n "4,6p" "$(vectors qwen3)"; } >blank.jsonl &&
	hp-data encode --tokenizer "$(tokenizer qwen3)" blank.jsonl >got &&
	head -n 6 enc.qwen3.jsonl >want && cmp want got &&
	hp-data encode --tokenizer "$(tokenizer qwen3)" t.txt blank.jsonl t.txt >got &&
	cat t.jsonl want t.jsonl >want3 && cmp want3 got &&
	hp-data build --tokenizer "$(tokenizer qwen3)" -o multi t.txt blank.jsonl t.txt &&
	seqs multi >got && ids_lines <want3 >want && cmp want got
'

test_expect_success '--append-eod ends every record with the tokenizer'\''s EOD id' '
	for te in stories260K:2 mistral:2 qwen3:151645 llama3:128001; do
		t=${te%%:*} eod=${te#*:} &&
		hp-data build --tokenizer "$(tokenizer $t)" --append-eod -o eod.$t "$(vectors $t)" &&
		seqs eod.$t >got &&
		jq -c --argjson e $eod "{ids: (.ids + [\$e])}" enc.$t.jsonl | ids_lines >want &&
		cmp want got || return 1
	done
'

test_expect_success '--pack-to-seq-len N: records of N+1 ids cut from the joined stream' '
	jq -r ".ids[], 2" enc.stories260K.jsonl | pack 33 >want &&
	hp-data build --tokenizer "$(tokenizer stories260K)" --append-eod --pack-to-seq-len 32 \
		-o packed "$(vectors stories260K)" 2>err &&
	cat err &&
	seqs packed >got && cmp want got &&
	n=$(wc -l <want) &&
	grep -q "^sequences $n$" dump && grep -q "^documents $n$" dump &&
	grep -q "^hp-data: $n sequences of 33 tokens; dropped the last $(cat dropped) tokens$" err &&
	jq -r ".ids[]" enc.qwen3.jsonl | pack 1001 >want &&
	hp-data build --tokenizer "$(tokenizer qwen3)" --pack-to-seq-len 1000 -o p2 "$(vectors qwen3)" &&
	seqs p2 >got && cmp want got
'

test_expect_success PYTHON 'packed records read back with the independent reader' '
	$READ_MMIDX packed >got && seqs packed >want && cmp want got
'

test_expect_success 'a packed dataset trains: hp-train reads it' '
	cat >train.yaml <<-EOF &&
	model:
	  _target_: hyper_parallel.models.HyperAutoModelForCausalLM.from_pretrained
	  pretrained_model_name_or_path: $DATA/stories260K/hf
	  torch_dtype: float32
	training: {train_iters: 2, global_batch_size: 2, micro_batch_size: 2, seed: 1}
	dataset:
	  _target_: hyper_parallel.data.build_indexed_text_dataset
	  data_path: packed
	  data_config: {seq_length: 32, is_dataset_from_mr: true}
	optimizer:
	  _target_: hyper_parallel.components.optim.AdamW
	  adamw_config: {adamw_lr: 1.0e-3}
	lr_scheduler:
	  _target_: hyper_parallel.components.optim.MultiLRScheduler
	  lr_decay_style: constant
	  lr_config: {lr: 1.0e-3}
	checkpoint: {save_ckpt: false}
	EOF
	hp-train -q train.yaml --metrics m.jsonl &&
	test $(wc -l <m.jsonl) = 2
'

# The MPI inputs: JSONL and text, an empty file and one without a final
# newline, big enough that every rank gets lines of several files.
test_expect_success MPI 'setup MPI inputs' '
	: >empty.txt &&
	cp "$CORPUS/tinystories_sample.txt" nonl.txt && printf "the end, no newline" >>nonl.txt &&
	set -- "$(vectors qwen3)" empty.txt "$CORPUS/pride_and_prejudice.txt" nonl.txt t.txt &&
	echo "$@" >inputs
'

# mpi_same P... -- ARGS: build ARGS under mpiexec -n P for each P; every
# result equals the one without mpiexec, byte for byte
mpi_same () {
	ps=
	while [ "$1" != -- ]; do ps="$ps $1"; shift; done
	shift
	rm -f ref.* mp.* &&
	timeout 300 hp-data build "$@" -o ref $(cat inputs) 2>/dev/null || return 1
	for p in $ps; do
		timeout 300 mpiexec -n $p hp-data build "$@" -o mp $(cat inputs) 2>err.$p &&
		cmp ref.bin mp.bin && cmp ref.idx mp.idx &&
		grep -q ", $p rank" err.$p &&
		test -z "$(ls | grep -e "\.tmp\.")" || { echo "P=$p differs"; cat err.$p; return 1; }
	done
}

test_expect_success MPI 'P = 1, 2, 3 give byte-identical datasets' '
	mpi_same 1 2 3 -- --tokenizer "$(tokenizer qwen3)" &&
	seqs ref >got &&
	hp-data encode --tokenizer "$(tokenizer qwen3)" $(cat inputs) | ids_lines >want &&
	cmp want got
'

test_expect_success MPI 'P = 1, 2, 3 give byte-identical packed datasets with EOD' '
	mpi_same 1 2 3 -- --tokenizer "$(tokenizer stories260K)" --append-eod --pack-to-seq-len 100 &&
	hp-data encode --tokenizer "$(tokenizer stories260K)" $(cat inputs) | jq -r ".ids[], 2" | pack 101 >want &&
	seqs ref >got && cmp want got
'

test_expect_success MPI 'more ranks than lines: empty ranges are fine' '
	printf "one\ntwo\n" >two.txt && echo two.txt >inputs &&
	mpi_same 3 -- --tokenizer "$(tokenizer mistral)" &&
	seqs mp >got && test $(wc -l <got) = 2
'

# Lines of megabytes: longer than the 1 MiB read buffer, and longer than a
# rank's share, so that some ranks' ranges hold no line start at all.
test_expect_success MPI 'lines longer than the read buffer and than a rank'\''s share' '
	{ echo short; yes "lorem ipsum dolor" | head -n 150000 | tr "\n" " "; echo;
	  echo mid; yes "sit amet" | head -n 200000 | tr "\n" " "; } >long.txt &&
	echo long.txt >inputs &&
	mpi_same 2 3 -- --tokenizer "$(tokenizer llama3)" &&
	seqs ref >got && test $(wc -l <got) = 4 &&
	hp-data encode --tokenizer "$(tokenizer llama3)" long.txt | ids_lines >want &&
	cmp want got
'

test_expect_success MPI 'an error is reported once, by file and line, whatever P' '
	for i in $(seq 1 3000); do echo "{\"text\": \"line $i of a long file\"}"; done >big.jsonl &&
	sed -i "1500s/.*/{\"text\": oops}/; 2900s/.*/{\"nokey\": 1}/" big.jsonl &&
	for p in 1 2 3; do
		rm -f out.* &&
		test_must_fail_with 4 timeout 120 mpiexec -n $p hp-data build --tokenizer "$(tokenizer mistral)" \
			-o out big.jsonl 2>err &&
		cat err && test_one_line err &&
		grep -q "^hp-data: .big.jsonl. line 1500: invalid JSON" err &&
		test -z "$(ls | grep -e "^out\.")" || return 1
	done &&
	sed -i "1500s/.*/{\"text\": \"fixed\"}/" big.jsonl &&
	test_must_fail_with 4 timeout 120 mpiexec -n 3 hp-data build --tokenizer "$(tokenizer mistral)" \
		-o out big.jsonl 2>err &&
	test_one_line err && grep -q "^hp-data: .big.jsonl. line 2900: no key \"text\"" err &&
	test -z "$(ls | grep -e "^out\.")"
'

test_expect_success MPI 'standard input cannot be split over ranks' '
	test_must_fail_with 2 timeout 60 mpiexec -n 2 hp-data build --tokenizer "$(tokenizer mistral)" \
		-o out - <t.txt 2>err &&
	grep -q "standard input" err && test ! -e out.bin
'

test_expect_success 'an invalid JSON line: exit 4, file and line named' '
	{ head -n 2 "$(vectors qwen3)"; echo "{\"text\": \"unterminated}"; } >bad.jsonl &&
	expect_fail 4 "^hp-data: .bad.jsonl. line 3: invalid JSON: " build --tokenizer "$(tokenizer qwen3)" -o out bad.jsonl &&
	expect_fail 4 "^hp-data: .bad.jsonl. line 3: invalid JSON: " encode --tokenizer "$(tokenizer qwen3)" bad.jsonl
'

test_expect_success 'invalid UTF-8: exit 4, in JSONL and in text' '
	{ echo "{\"text\": \"fine\"}"; printf "{\"text\": \"caf\\351\"}\n"; } >latin1.jsonl &&
	expect_fail 4 "^hp-data: .latin1.jsonl. line 2: invalid UTF-8 at column 14$" build --tokenizer "$(tokenizer qwen3)" -o out latin1.jsonl &&
	printf "ok\nok\n\\355\\240\\200 a surrogate\n" >sur.txt &&
	expect_fail 4 "^hp-data: .sur.txt. line 3: invalid UTF-8 at column 1$" build --tokenizer "$(tokenizer llama3)" -o out sur.txt
'

test_expect_success 'a missing or non-string text key, a line that is no object: exit 4' '
	echo "{\"content\": \"hello\"}" >nokey.jsonl &&
	expect_fail 4 "^hp-data: .nokey.jsonl. line 1: no key \"text\"" build --tokenizer "$(tokenizer qwen3)" -o out nokey.jsonl &&
	expect_fail 4 "line 1: no key \"body\"" build --tokenizer "$(tokenizer qwen3)" --text-key body -o out nokey.jsonl &&
	printf "{\"text\": \"a\"}\n{\"text\": [1]}\n" >arr.jsonl &&
	expect_fail 4 "^hp-data: .arr.jsonl. line 2: \"text\" is an array, not a string$" build --tokenizer "$(tokenizer qwen3)" -o out arr.jsonl &&
	echo "[\"text\"]" >notobj.jsonl &&
	expect_fail 4 "line 1: expected a JSON object" build --tokenizer "$(tokenizer qwen3)" -o out notobj.jsonl
'

test_expect_success 'a missing tokenizer or input: exit 5' '
	expect_fail 5 "nowhere" build --tokenizer nowhere/tokenizer.json -o out t.txt &&
	expect_fail 5 "nowhere" encode --tokenizer nowhere t.txt &&
	expect_fail 5 "^hp-data: .absent.txt.: cannot open: No such file" build --tokenizer "$(tokenizer qwen3)" -o out t.txt absent.txt &&
	expect_fail 5 "absent.txt" encode --tokenizer "$(tokenizer qwen3)" absent.txt
'

test_expect_success 'a tokenizer.json that does not load: exit 4; one with no EOD for --append-eod: exit 3' '
	mkdir -p badtok noeod &&
	echo "{\"model\": " >badtok/tokenizer.json &&
	expect_fail 4 "badtok/tokenizer.json" build --tokenizer badtok -o out t.txt &&
	jq "(.added_tokens[] | select(.content == \"</s>\") | .content) = \"<eos>\" |
	    .model.vocab |= with_entries(if .key == \"</s>\" then .key = \"<eos>\" else . end)" \
		"$(tokenizer stories260K)" >noeod/tokenizer.json &&
	hp-data build --tokenizer noeod -o out t.txt 2>/dev/null && rm -f out.* &&
	expect_fail 3 "no end-of-document token" build --tokenizer noeod --append-eod -o out t.txt
'

test_expect_success 'an unwritable output: exit 5, nothing left behind' '
	expect_fail 5 "nodir/out.bin" build --tokenizer "$(tokenizer qwen3)" -o nodir/out t.txt &&
	test ! -e nodir &&
	echo file >afile &&
	expect_fail 5 "afile/out" build --tokenizer "$(tokenizer qwen3)" -o afile/out t.txt
'

test_expect_success 'a failed build leaves an existing dataset as it was' '
	cp b.qwen3.bin keep.bin && cp b.qwen3.idx keep.idx &&
	test_must_fail_with 4 hp-data build --tokenizer "$(tokenizer qwen3)" -o keep bad.jsonl 2>err &&
	cmp keep.bin b.qwen3.bin && cmp keep.idx b.qwen3.idx &&
	test -z "$(ls | grep -e "^keep\..*tmp")"
'

test_expect_success 'usage errors exit 2 with the usage' '
	test_must_fail_with 2 hp-data 2>err && grep -q "^usage: hp-data encode" err &&
	test_must_fail_with 2 hp-data frobnicate 2>err && grep -q "unknown command" err &&
	test_must_fail_with 2 hp-data encode t.txt 2>err && grep -q "missing --tokenizer" err &&
	test_must_fail_with 2 hp-data encode --tokenizer x 2>err && grep -q "missing input" err &&
	test_must_fail_with 2 hp-data build --tokenizer x t.txt 2>err && grep -q "missing -o" err &&
	test_must_fail_with 2 hp-data encode --tokenizer x --append-eod t.txt 2>err && grep -q "option of build" err &&
	test_must_fail_with 2 hp-data build --tokenizer x --pack-to-seq-len 0 -o o t.txt 2>err &&
	test_must_fail_with 2 hp-data build --tokenizer x --pack-to-seq-len 12x -o o t.txt 2>err &&
	test_must_fail_with 2 hp-data encode --tokenizer x --format csv t.txt 2>err && grep -q "jsonl or text" err &&
	test_must_fail_with 2 hp-data encode --tokenizer x --bogus t.txt 2>err && grep -q "unknown option .--bogus." err &&
	test_must_fail_with 2 hp-data encode t.txt --tokenizer 2>err && grep -q "needs a value" err &&
	test ! -e o.bin
'

test_expect_success '-h and --version' '
	hp-data -h >help && grep -q "^usage: hp-data encode --tokenizer" help &&
	grep -q "^   or: hp-data build --tokenizer" help &&
	hp-data build --help >help2 && cmp help help2 &&
	hp-data --version | grep -q "^hp-data [0-9]"
'

# Every allocation up to the first record goes through hp_malloc: fail each
# of them in turn (the tokenizer's load, then hp-data's own), then some of
# those made while tokenizing.
test_expect_success 'a failed allocation is reported, not a crash, and leaves nothing' '
	for n in $(seq 1 150) 200 500 1000 2000; do
		rm -f out.*
		HP_FAIL_ALLOC=$n hp-data build --tokenizer "$(tokenizer stories260K)" --append-eod \
			--pack-to-seq-len 16 -o out t.txt "$(vectors stories260K)" 2>err
		rc=$?
		test $rc = 5 -o $rc = 0 || { echo "HP_FAIL_ALLOC=$n exit $rc"; cat err; return 1; }
		test_no_sanitizer_report err || return 1
		test $rc = 0 || { test_one_line err && test -z "$(ls | grep -e "^out\.")"; } ||
			{ echo "HP_FAIL_ALLOC=$n"; cat err; return 1; }
	done
'

test_expect_success MPI 'a failed allocation on one rank fails all of them cleanly' '
	for n in $(seq 30 4 110); do
		rm -f out.*
		HP_FAIL_ALLOC=$n timeout 60 mpiexec -n 2 hp-data build --tokenizer "$(tokenizer stories260K)" \
			-o out t.txt "$(vectors stories260K)" 2>err
		rc=$?
		test $rc = 5 -o $rc = 0 || { echo "HP_FAIL_ALLOC=$n exit $rc"; cat err; return 1; }
		test $rc = 0 || { test_one_line err && test -z "$(ls | grep -e "^out\.")"; } ||
			{ echo "HP_FAIL_ALLOC=$n"; cat err; return 1; }
	done
'

test_expect_success MANDOC 'hp-data(1) is lint-clean and has the sections users look for' '
	mandoc -Tlint -W warning "$MAN/hp-data.1" &&
	for s in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" ENVIRONMENT FILES EXAMPLES "SEE ALSO"; do
		mandoc -Tascii "$MAN/hp-data.1" | col -b | grep -q "^$s" || { echo "lacks $s"; return 1; }
	done &&
	for code in 0 1 2 3 4 5 70; do
		grep -A1 "^\.TP\$" "$MAN/hp-data.1" | grep -q -x "$code" || { echo "no exit status $code"; return 1; }
	done
'

test_expect_success MANDOC 'hp-data --help shows the SYNOPSIS of hp-data(1)' '
	hp-data --help | sed -n "s/^usage: //p; s/^   or: //p" | tr -s " " >help &&
	test $(wc -l <help) = 2 &&
	mandoc -Tascii -Owidth=300 "$MAN/hp-data.1" | col -b |
		sed -n "/^SYNOPSIS/,/^DESCRIPTION/p" | grep -v "^[A-Z]" | tr -s " \n" "  " >syn &&
	cat help syn &&
	for w in $(cat help); do grep -q -F -- "$w" syn || { echo "--help word $w not in SYNOPSIS"; return 1; }; done &&
	while read -r line; do grep -q -F -- "$line" syn || { echo "not in SYNOPSIS: $line"; return 1; }; done <help
'

# man_examples PAGE: the EXAMPLES section as plain text, unindented
man_examples () {
	mandoc -Tascii -Owidth=300 "$1" | col -bx | sed -n '/^EXAMPLES/,/^SEE ALSO/p' | sed 's/^       //'
}

test_expect_success MANDOC 'the EXAMPLES of hp-data(1) run as written' '
	mkdir -p ex && cd ex &&
	ln -s "$HP_SRC_DIR/examples" examples && ln -s "$DATA" data &&
	man_examples "$MAN/hp-data.1" >ex.txt &&
	sed -n "s/^\\$ //p" ex.txt >cmds &&
	test $(wc -l <cmds) -ge 6 &&
	if ! test_have_prereq MPI; then sed -i "/^mpiexec/d" cmds; fi &&
	while read -r cmd; do
		echo "+ $cmd" && timeout 120 sh -c "$cmd" </dev/null >out 2>err || { cat out err; return 1; }
		test_no_sanitizer_report err || return 1
	done <cmds &&
	test -s stories.bin && test -s stories.idx && test -s packed.bin &&
	hp-test-tool dumpidx packed | sed 1,5d | awk "NF != 33 { exit 1 }" &&
	hp-test-tool dumpidx stories | grep -q "^sequences 8$" &&
	if test_have_prereq MPI; then
		hp-data build --tokenizer data/tokenizers/mistral -o one examples/data/notes.txt examples/data/stories.jsonl &&
		cmp one.bin both.bin && cmp one.idx both.idx
	fi
'

test_done
