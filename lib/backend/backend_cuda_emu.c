/*
 * backend_cuda_emu.c - the CUDA backend compiled against the host
 * emulation of its kernels (lib/backend/cuda_emu.c): lib/backend/backend_cuda.c again,
 * with HP_CUDA_EMU, in every build.  And the two ways in: HP_CUDA_EMULATE
 * from the environment, and hp_backend_cuda_open, which picks the GPU's
 * backend or this one.
 */
#define HP_CUDA_EMU 1
#include "backend/backend_cuda.c"

int hp_emulate_from_env(enum hp_emulate *emu, struct hp_err *e)
{
	const char *s = getenv("HP_CUDA_EMULATE");

	*emu = HP_EMULATE_OFF;
	if (!s || !*s)
		return 0;
	if (!strcmp(s, "exact"))
		*emu = HP_EMULATE_EXACT;
	else if (!strcmp(s, "bf16"))
		*emu = HP_EMULATE_BF16;
	else
		return hp_err_set(e, HP_ECONFIG, "HP_CUDA_EMULATE=%s: expected exact or bf16 (or unset)", s);
	return 0;
}

int hp_backend_cuda_open(struct hp_backend **bp, int dev, int shared, enum hp_emulate emu, struct hp_err *e)
{
	*bp = NULL;
	if (emu != HP_EMULATE_OFF) {
		int rc = hp_backend_cuda_emu_new(bp, emu == HP_EMULATE_BF16, e);

		if (!rc)
			snprintf(cu_of(*bp)->name, sizeof(cu_of(*bp)->name), "cuda (emulated on the host, %s)",
				 emu == HP_EMULATE_BF16 ? "bf16" : "exact");
		return rc;
	}
#ifdef HP_HAVE_CUDA
	return hp_backend_cuda_gpu_new(bp, dev, shared, e);
#else
	(void)dev;
	(void)shared;
	return hp_err_set(e, HP_EUNSUP, "cuda: this hp was built without CUDA (no nvcc at build time); rebuild "
			  "with the CUDA toolkit, or set HP_CUDA_EMULATE=exact to run the CUDA backend's host "
			  "emulation");
#endif
}

const char *hp_kfam_name(int f)
{
	static const char *const names[HP_KF_N] = {
		[HP_KF_GEMM] = "gemm", [HP_KF_EXPERTS] = "experts", [HP_KF_ATTENTION] = "attention",
		[HP_KF_ROUTING] = "routing", [HP_KF_LOSS] = "loss", [HP_KF_OPTIMIZER] = "optimizer",
		[HP_KF_CAST] = "bf16 casts", [HP_KF_MEMORY] = "copies", [HP_KF_ELEMENTWISE] = "element-wise",
	};

	return f >= 0 && f < HP_KF_N ? names[f] : "?";
}

int hp_kfam_of(const char *fn)
{
	static const struct { const char *part; int f; } by[] = {
		{ "sigmoid_gate", HP_KF_ELEMENTWISE }, { "gdr_", HP_KF_ATTENTION }, { "swiglu", HP_KF_ELEMENTWISE }, { "grouped", HP_KF_EXPERTS }, { "linear", HP_KF_GEMM }, { "flash", HP_KF_ATTENTION },
		{ "fill_inf", HP_KF_ATTENTION }, { "sinks", HP_KF_ATTENTION }, { "moe_", HP_KF_ROUTING }, { "router", HP_KF_ROUTING },
		{ "combine", HP_KF_ROUTING }, { "_rows", HP_KF_ROUTING }, { "ce_", HP_KF_LOSS },
		{ "adamw", HP_KF_OPTIMIZER }, { "clip", HP_KF_OPTIMIZER }, { "sumsq", HP_KF_OPTIMIZER },
		{ "f32_to_bf16", HP_KF_CAST }, { "bf16_to_f32", HP_KF_CAST }, { "copy", HP_KF_MEMORY },
		{ "zero", HP_KF_MEMORY }, { "load", HP_KF_MEMORY },
	};

	for (size_t i = 0; i < sizeof(by) / sizeof(by[0]); i++)
		if (strstr(fn, by[i].part))
			return by[i].f;
	return HP_KF_ELEMENTWISE;
}
