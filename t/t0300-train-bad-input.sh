#!/bin/sh
test_description='hp-train: bad input gets a one-line error, the documented exit code, no output'
. "$(dirname "$0")/test-lib.sh"
. "$TEST_DIR/lib-train.sh"

# model_with NAME: a copy of the model folder whose weights file is $NAME.safetensors
model_with () {
	mkdir -p "m-$1" && cp "$MODEL/config.json" "m-$1/" && cp "$1.safetensors" "m-$1/model.safetensors"
}

test_expect_success 'setup' '
	make_refbatch ref &&
	write_config good.yaml "$MODEL" ref 128 2 2 1 &&
	hp-train -q good.yaml
'

test_expect_success 'a truncated safetensors file' '
	head -c 500000 "$MODEL/model.safetensors" >trunc.safetensors &&
	model_with trunc &&
	write_config c.yaml "$PWD/m-trunc" ref 128 2 2 1 &&
	expect_fail 4 "m-trunc/model.safetensors.*past" hp-train c.yaml
'

test_expect_success 'a header whose offsets overlap' '
	mkst overlap.safetensors "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}" 24 &&
	model_with overlap &&
	write_config c.yaml "$PWD/m-overlap" ref 128 2 2 1 &&
	expect_fail 4 "m-overlap/model.safetensors.*overlap" hp-train c.yaml
'

test_expect_success 'a header whose offsets run past the file' '
	mkst past.safetensors "{\"a\":{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[0,256]}}" 100 &&
	model_with past &&
	write_config c.yaml "$PWD/m-past" ref 128 2 2 1 &&
	expect_fail 4 "m-past/model.safetensors" hp-train c.yaml
'

test_expect_success 'a header length past the end of the file' '
	{ u64le 999999; printf "{}"; } >hlen.safetensors &&
	model_with hlen &&
	write_config c.yaml "$PWD/m-hlen" ref 128 2 2 1 &&
	expect_fail 4 "m-hlen/model.safetensors" hp-train c.yaml
'

test_expect_success 'an unknown dtype' '
	mkst dtype.safetensors "{\"a\":{\"dtype\":\"F8_E9M9\",\"shape\":[4],\"data_offsets\":[0,4]}}" 4 &&
	model_with dtype &&
	write_config c.yaml "$PWD/m-dtype" ref 128 2 2 1 &&
	expect_fail 4 "F8_E9M9" hp-train c.yaml
'

test_expect_success 'a config.json missing a key' '
	mkdir -p m-nokey && cp "$MODEL/model.safetensors" m-nokey/ &&
	jq "del(.hidden_size)" "$MODEL/config.json" >m-nokey/config.json &&
	write_config c.yaml "$PWD/m-nokey" ref 128 2 2 1 &&
	expect_fail 3 "m-nokey/config.json.*hidden_size" hp-train c.yaml
'

test_expect_success 'a config.json whose shapes disagree with the weights' '
	mkdir -p m-shape && cp "$MODEL/model.safetensors" m-shape/ &&
	jq ".intermediate_size = 128" "$MODEL/config.json" >m-shape/config.json &&
	write_config c.yaml "$PWD/m-shape" ref 128 2 2 1 &&
	expect_fail 4 "mlp.gate_proj.weight.*shape" hp-train c.yaml
'

test_expect_success 'a YAML with an unknown key' '
	sed "s/train_iters:/train_iter:/" good.yaml >c.yaml &&
	expect_fail 3 "c.yaml.*training.train_iter.*unknown key.*train_iters" hp-train c.yaml
'

test_expect_success 'a YAML with a wrong type' '
	sed "s/train_iters: 1/train_iters: many/" good.yaml >c.yaml &&
	expect_fail 3 "c.yaml.*training.train_iters.*expected int" hp-train c.yaml
'

test_expect_success 'an override of a wrong type or path' '
	expect_fail 3 "train_iters" hp-train good.yaml --training.train_iters=lots &&
	expect_fail 3 "unknown key" hp-train good.yaml --training.nonsense=1
'

test_expect_success 'a missing data file' '
	write_config c.yaml "$MODEL" nodata 128 2 2 1 &&
	expect_fail 5 "nodata.*No such file" hp-train c.yaml
'

test_expect_success 'a missing model folder' '
	write_config c.yaml "$PWD/nowhere" ref 128 2 2 1 &&
	expect_fail 5 "nowhere/config.json" hp-train c.yaml
'

test_expect_success 'a data record of the wrong length' '
	write_config c.yaml "$MODEL" ref 64 2 2 1 &&
	expect_fail 4 "ref" hp-train c.yaml
'

test_expect_success 'a missing config file' '
	expect_fail 5 "absent.yaml" hp-train absent.yaml
'

test_expect_success 'usage errors exit 2' '
	test_must_fail_with 2 hp-train 2>err && grep -q "^usage: hp-train" err &&
	test_must_fail_with 2 hp-train --bogus good.yaml 2>err && grep -q "unknown option" err &&
	hp-train --help >help && grep -q "^usage: hp-train CONFIG.yaml" help
'

test_expect_success 'an unwritable metrics path fails before training' '
	test_must_fail_with 5 hp-train -q good.yaml --metrics nodir/m.jsonl 2>err &&
	test_one_line err
'

test_expect_success 'a failed allocation is reported, not a crash' '
	failed=0 &&
	for n in 1 7 50 200; do
		HP_FAIL_ALLOC=$n hp-train -q good.yaml 2>err
		rc=$?
		# a late N may land in an allocation with a fallback (the hp_sgemm
		# pack buffer goes to OpenBLAS), so 0 is allowed; anything else is 5
		test $rc = 5 -o $rc = 0 || { echo "HP_FAIL_ALLOC=$n exit $rc"; cat err; return 1; }
		test $rc = 0 || { test_one_line err && failed=$((failed + 1)); } || return 1
		test_no_sanitizer_report err || return 1
	done &&
	echo "$failed of 4 injected failures reported" &&
	test $failed -ge 3
'

test_done
