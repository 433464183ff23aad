/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kn_cuda.h
 * Private to kernels/: entry points of the CUDA engine beyond the vtable
 * (kn_cuda_stage_create() is declared in kn_stage_impl.h), callable from C.
 *
 * Threading: like kn_stage, one thread drives a stage; the probes may run
 * from any thread but use the current device exclusively while they run.
 */
#ifndef KN_CUDA_H
#define KN_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kn_model.h"
#include "kn_stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * A CUDA stage with weights drawn on the device from @p seed instead of a
 * model directory (benchmarks at 8B shapes without 16 GB of files). Weights
 * of layer l depend only on (seed, l), so two stages splitting the model
 * hold exactly the weights one whole-model stage holds. Use it through the
 * public kn_stage_* calls; kn_stage_info() works, the model pointer is NULL.
 * @param cfg  shape; copied
 * @return the stage, or NULL + errno (EINVAL, ENOMEM, ENODEV, EIO), @p err filled.
 */
struct kn_stage *kn_cuda_stage_create_random(const struct kn_model_config *cfg, uint64_t seed,
					     const struct kn_stage_opts *o, char *err,
					     size_t errlen);

/** @return the number of usable CUDA devices (0 when there is no driver or GPU). */
int kn_cuda_device_count(void);

/** @return 1 when CUDA device @p device can run the one numerics family
 *  (kn_stage_opts.cuda_batch_invariant: Hopper, compute capability 9.x), else 0. */
int kn_cuda_one_family_ok(int device);

/**
 * Pin a host range (e.g. the worker's shm region) so hidden rows move by
 * copy-engine DMA straight from/to it (cudaHostRegister, portable).
 * @return 0, or -EIO with @p err naming the call.
 */
int kn_cuda_host_register(void *p, size_t len, char *err, size_t errlen);

/** Undo kn_cuda_host_register(). @return 0 or -EIO. */
int kn_cuda_host_unregister(void *p);

/**
 * Device-to-device copy bandwidth (bytes read + written per second) over a
 * @p bytes buffer, median of @p iters copies.
 * @return 0 or -EIO / -ENOMEM with @p err filled.
 */
int kn_cuda_probe_copy_bw(int device, size_t bytes, int iters, double *bytes_per_s, char *err,
			  size_t errlen);

/**
 * One linear layer Y = X W^T (X f32 [n][in], W bf16 [out][in]) as the
 * engine runs it: @p kind 0 cuBLAS with X rounded to bf16, 1 cuBLAS with X
 * split into bf16 hi + lo (two products), 2 the tensor-core kernel whose
 * bits do not depend on n (kn_cuda_gemm_mma), 3 the warpgroup kernel whose
 * bits do not depend on n, X rounded (kn_cuda_gemm_wg). Plans of at most
 * 16 columns run the engine's skinny kernels in kinds 0 and 1. Median
 * seconds of @p iters.
 * @return 0 or -EIO / -ENOMEM with @p err filled.
 */
int kn_cuda_probe_linear(int device, int n, int in, int out, int kind, int iters, double *sec_per_call, char *err,
			 size_t errlen);

/**
 * cuBLAS bf16 GEMM rate (m x n x k, f32 accumulate, bf16 out) on random data.
 * @return 0 or -EIO / -ENOMEM with @p err filled.
 */
int kn_cuda_probe_gemm(int device, int m, int n, int k, int iters, double *flop_per_s, char *err,
		       size_t errlen);

/**
 * Paged attention alone: @p n_cols columns at position @p ctx - 1 with
 * random K/V over a shuffled block table. Reports K/V bytes read per second.
 * @param tile  0: the column kernel (CUDA cores); 1: the tensor-core tile
 *              kernel with the engine's choices for a plan of @p n_cols
 *              columns (split, q and P exact when n_cols <= 16)
 * @param back_to_back  0: one launch between two events (the host's launch
 *              gap included); 1: at least 8 launches back to back, each
 *              over the next of several K/V copies that together pass
 *              256 MB (so none is read from L2): the time a launch takes
 *              in a stream, as inside the engine's CUDA graphs
 * @return 0 or -EIO / -ENOMEM with @p err filled.
 */
int kn_cuda_probe_attention(int device, int n_cols, int ctx, int n_heads, int n_kv_heads,
			    int head_dim, int tile, int back_to_back, int iters, double *bytes_per_s,
			    double *sec_per_call, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* KN_CUDA_H */
