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
