#!/bin/sh
test_description='lib/ in layers: no include goes up a layer, no circle of modules (scripts/layers.sh)'
. "$(dirname "$0")/test-lib.sh"

test_expect_success 'the tree holds its layers' '
	"$HP_SRC_DIR/scripts/layers.sh" "$HP_SRC_DIR" >out || { cat out; false; }
'

# a copy of the sources with one bad include each: the script must say so
copy () {
	rm -rf src && mkdir src && cp -r "$HP_SRC_DIR/lib" "$HP_SRC_DIR/kernels" "$HP_SRC_DIR/tools" src/
}

test_expect_success 'an include that goes up a layer is named' '
	copy &&
	echo "#include \"train/train.h\"" >>src/lib/comm/mesh.h &&
	test_must_fail_with 1 "$HP_SRC_DIR/scripts/layers.sh" src >out &&
	cat out &&
	grep -q "^lib/comm/mesh.h: #include \"train/train.h\" goes up from layer comm to train$" out
'

test_expect_success 'a circle inside one layer is named' '
	copy &&
	echo "#include \"dist/verify.h\"" >>src/lib/dist/fsdp.h &&
	test_must_fail_with 1 "$HP_SRC_DIR/scripts/layers.sh" src >out &&
	cat out &&
	grep -q "^a circle of modules: .*lib/dist/fsdp" out && ! grep -q "goes up" out
'

test_expect_success 'an include without its folder is named' '
	copy &&
	echo "#include \"err.h\"" >>src/lib/base/log.c &&
	test_must_fail_with 1 "$HP_SRC_DIR/scripts/layers.sh" src >out &&
	grep -q "^lib/base/log.c: #include \"err.h\" does not name its folder$" out
'

test_done
