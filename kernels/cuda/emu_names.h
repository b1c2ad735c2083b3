/*
 * cuda/emu_names.h - with HP_CUDA_EMU, cuda/ops.h declares the host
 * emulation of the CUDA kernels (lib/backend/cuda_emu.c) under these names, so
 * that lib/backend/backend_cuda.c compiles once against the GPU's kernels and
 * once against their emulation (HP_CUDA_EMULATE) and both link into one
 * program.  One line per function of cuda/ops.h (t/t0960 checks the list
 * is whole).
 */
#ifndef HP_KERNELS_CUDA_EMU_NAMES_H
#define HP_KERNELS_CUDA_EMU_NAMES_H

#define hp_cuda_acc hp_emu_acc
#define hp_cuda_adamw hp_emu_adamw
#define hp_cuda_add hp_emu_add
#define hp_cuda_add_bf16 hp_emu_add_bf16
#define hp_cuda_add_bias hp_emu_add_bias
#define hp_cuda_add_f64 hp_emu_add_f64
#define hp_cuda_alloc hp_emu_alloc
#define hp_cuda_bf16_sum_ranks hp_emu_bf16_sum_ranks
#define hp_cuda_bf16_to_f32 hp_emu_bf16_to_f32
#define hp_cuda_bias_grouped_bwd hp_emu_bias_grouped_bwd
#define hp_cuda_bias_grouped_fwd hp_emu_bias_grouped_fwd
#define hp_cuda_ce_bwd hp_emu_ce_bwd
#define hp_cuda_ce_loss hp_emu_ce_loss
#define hp_cuda_check hp_emu_check
#define hp_cuda_clip_gate hp_emu_clip_gate
#define hp_cuda_colsum hp_emu_colsum
#define hp_cuda_combine hp_emu_combine
#define hp_cuda_combine_bwd hp_emu_combine_bwd
#define hp_cuda_conv1d_silu_bwd hp_emu_conv1d_silu_bwd
#define hp_cuda_conv1d_silu_fwd hp_emu_conv1d_silu_fwd
#define hp_cuda_copy hp_emu_copy
#define hp_cuda_copy2d hp_emu_copy2d
#define hp_cuda_device_count hp_emu_device_count
#define hp_cuda_device_name hp_emu_device_name
#define hp_cuda_download hp_emu_download
#define hp_cuda_embedding_bwd hp_emu_embedding_bwd
#define hp_cuda_embedding_fwd hp_emu_embedding_fwd
#define hp_cuda_f32_to_bf16 hp_emu_f32_to_bf16
#define hp_cuda_fill_inf hp_emu_fill_inf
#define hp_cuda_fini hp_emu_fini
#define hp_cuda_flash_bwd hp_emu_flash_bwd
#define hp_cuda_flash_fwd hp_emu_flash_fwd
#define hp_cuda_flash_scratch hp_emu_flash_scratch
#define hp_cuda_flash_supports hp_emu_flash_supports
#define hp_cuda_free hp_emu_free
#define hp_cuda_gather_rows hp_emu_gather_rows
#define hp_cuda_gdn_gates_bwd hp_emu_gdn_gates_bwd
#define hp_cuda_gdn_gates_fwd hp_emu_gdn_gates_fwd
#define hp_cuda_gdr_bwd hp_emu_gdr_bwd
#define hp_cuda_gdr_fwd hp_emu_gdr_fwd
#define hp_cuda_glu_clamp_bwd hp_emu_glu_clamp_bwd
#define hp_cuda_glu_clamp_fwd hp_emu_glu_clamp_fwd
#define hp_cuda_grouped_bwd hp_emu_grouped_bwd
#define hp_cuda_grouped_fwd hp_emu_grouped_fwd
#define hp_cuda_heads_bcast hp_emu_heads_bcast
#define hp_cuda_heads_sum hp_emu_heads_sum
#define hp_cuda_host_alloc hp_emu_host_alloc
#define hp_cuda_host_free hp_emu_host_free
#define hp_cuda_init hp_emu_init
#define hp_cuda_l2norm_bwd hp_emu_l2norm_bwd
#define hp_cuda_l2norm_fwd hp_emu_l2norm_fwd
#define hp_cuda_linear_bwd hp_emu_linear_bwd
#define hp_cuda_linear_fwd hp_emu_linear_fwd
#define hp_cuda_mark_free hp_emu_mark_free
#define hp_cuda_mark_new hp_emu_mark_new
#define hp_cuda_mark_passed hp_emu_mark_passed
#define hp_cuda_mark_record hp_emu_mark_record
#define hp_cuda_mark_wait hp_emu_mark_wait
#define hp_cuda_max hp_emu_max
#define hp_cuda_mem_info hp_emu_mem_info
#define hp_cuda_moe_aux_acc hp_emu_moe_aux_acc
#define hp_cuda_moe_aux_fin hp_emu_moe_aux_fin
#define hp_cuda_moe_route hp_emu_moe_route
#define hp_cuda_reserve hp_emu_reserve
#define hp_cuda_rmsnorm_bwd hp_emu_rmsnorm_bwd
#define hp_cuda_rmsnorm_fwd hp_emu_rmsnorm_fwd
#define hp_cuda_rmsnorm_gated_bwd hp_emu_rmsnorm_gated_bwd
#define hp_cuda_rmsnorm_gated_fwd hp_emu_rmsnorm_gated_fwd
#define hp_cuda_rope_bwd hp_emu_rope_bwd
#define hp_cuda_rope_fwd hp_emu_rope_fwd
#define hp_cuda_router_bwd hp_emu_router_bwd
#define hp_cuda_router_group_bwd hp_emu_router_group_bwd
#define hp_cuda_router_group_fwd hp_emu_router_group_fwd
#define hp_cuda_router_topk hp_emu_router_topk
#define hp_cuda_scale hp_emu_scale
#define hp_cuda_scatter_add_rows hp_emu_scatter_add_rows
#define hp_cuda_scatter_rows hp_emu_scatter_rows
#define hp_cuda_sigmoid_gate_bwd hp_emu_sigmoid_gate_bwd
#define hp_cuda_sigmoid_gate_fwd hp_emu_sigmoid_gate_fwd
#define hp_cuda_sigmoid_gate_rows_bwd hp_emu_sigmoid_gate_rows_bwd
#define hp_cuda_sigmoid_gate_rows_fwd hp_emu_sigmoid_gate_rows_fwd
#define hp_cuda_sinks_bwd hp_emu_sinks_bwd
#define hp_cuda_sinks_fwd hp_emu_sinks_fwd
#define hp_cuda_stream hp_emu_stream
#define hp_cuda_sumsq hp_emu_sumsq
#define hp_cuda_swiglu_bwd hp_emu_swiglu_bwd
#define hp_cuda_swiglu_fwd hp_emu_swiglu_fwd
#define hp_cuda_swiglu_rows_bwd hp_emu_swiglu_rows_bwd
#define hp_cuda_swiglu_rows_fwd hp_emu_swiglu_rows_fwd
#define hp_cuda_sync hp_emu_sync
#define hp_cuda_timer_free hp_emu_timer_free
#define hp_cuda_timer_mark hp_emu_timer_mark
#define hp_cuda_timer_ms hp_emu_timer_ms
#define hp_cuda_timer_new hp_emu_timer_new
#define hp_cuda_upload hp_emu_upload
#define hp_cuda_vm_free hp_emu_vm_free
#define hp_cuda_vm_map hp_emu_vm_map
#define hp_cuda_vm_reserve hp_emu_vm_reserve
#define hp_cuda_vm_unmap hp_emu_vm_unmap
#define hp_cuda_vp_ce_bwd hp_emu_vp_ce_bwd
#define hp_cuda_vp_ce_loss hp_emu_vp_ce_loss
#define hp_cuda_vp_ce_max hp_emu_vp_ce_max
#define hp_cuda_vp_ce_sums hp_emu_vp_ce_sums
#define hp_cuda_zero hp_emu_zero

#endif
