/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA backend's module ABI: what kvferry-cuda.so (kernels/cuda/module/)
 * exports to the model library's loader (kn_cuda_load.c). One symbol,
 * kn_cuda_module_v1, a table of the engine's entry points. Private to the
 * two: the module and the program it is loaded into must come from one
 * build of kvferry, which the loader checks (version and the sizes of the
 * structs they share) before it calls anything.
 */
#ifndef KN_CUDA_MODULE_H
#define KN_CUDA_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "kn_model.h"
#include "kn_stage.h"

#define KN_CUDA_MODULE_SYMBOL "kn_cuda_module_v1"
/* Bump on any change to this table or to struct kn_stage's backend vtable. */
#define KN_CUDA_MODULE_ABI 1u
#define KN_CUDA_MODULE_FILE "kvferry-cuda.so"

struct kn_cuda_module {
	uint32_t abi;         /* KN_CUDA_MODULE_ABI */
	uint32_t opts_bytes;  /* sizeof(struct kn_stage_opts) in the module */
	uint32_t stage_bytes; /* sizeof(struct kn_stage) (kn_stage_impl.h) in the module */
	uint32_t info_bytes;  /* sizeof(struct kn_stage_info) */
	const char *version;  /* KVF_VERSION of the module's build */
	struct kn_stage *(*stage_create)(const struct kn_model *m, const struct kn_stage_opts *o, char *err,
					 size_t errlen);
	int (*device_count)(void);
	/* cudaDriverGetVersion / cudaRuntimeGetVersion: 0 or -EIO */
	int (*versions)(int *driver, int *runtime);
	int (*host_register)(void *p, size_t len, char *err, size_t errlen);
	int (*host_unregister)(void *p);
};

/**
 * The module, loaded on first use (kn_cuda_open() for the search order).
 * @return the table, or NULL with errno set (ENODEV, ENOENT, ELIBBAD) and @p err filled.
 * Thread-safe.
 */
const struct kn_cuda_module *kn_cuda_module_get(const char *path, char *err, size_t errlen);

#endif /* KN_CUDA_MODULE_H */
