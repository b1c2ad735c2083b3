/*
 * test-convert.c - hp-test-tool stsame: two Hugging Face folders (single
 * file or index) hold the same tensors, bit for bit: the same names, dtypes,
 * shapes and bytes.  Prints the first difference.
 */
#include "format/safetensors.h"

int cmd_stsame(int argc, char **argv);

int cmd_stsame(int argc, char **argv)
{
	struct hp_st_model a, b;
	struct hp_err e;
	int rc = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: hp-test-tool stsame A B\n");
		return 2;
	}
	hp_err_clear(&e);
	if (hp_st_model_open(&a, argv[1], &e) || hp_st_model_open(&b, argv[2], &e)) {
		fprintf(stderr, "hp-test-tool: %s\n", e.msg);
		return 1;
	}
	if (a.ntensors != b.ntensors) {
		printf("%zu tensors in %s, %zu in %s\n", a.ntensors, argv[1], b.ntensors, argv[2]);
		rc = 1;
	}
	for (size_t i = 0; !rc && i < a.ntensors; i++) {
		const struct hp_st_tensor *x = a.tensors[i], *y = hp_st_model_find(&b, x->name);

		if (!y) {
			printf("%s: missing in %s\n", x->name, argv[2]);
			rc = 1;
		} else if (x->dtype != y->dtype || x->ndim != y->ndim ||
			   memcmp(x->shape, y->shape, sizeof(x->shape)) || x->nbytes != y->nbytes) {
			printf("%s: %s vs %s, or another shape\n", x->name, hp_dtype_name(x->dtype),
			       hp_dtype_name(y->dtype));
			rc = 1;
		} else if (memcmp(x->data, y->data, x->nbytes)) {
			printf("%s: different bytes\n", x->name);
			rc = 1;
		}
	}
	if (!rc)
		printf("%zu tensors identical\n", a.ntensors);
	hp_st_model_close(&a);
	hp_st_model_close(&b);
	return rc;
}
