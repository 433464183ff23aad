/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-cuda.so's one export: the CUDA engine's entry points as the table
 * the model library's loader checks and calls (kn_cuda_module.h). The same
 * object is linked whole into the CUDA tests and benchmarks, where the
 * loader finds the table in the program itself.
 */
#include <cuda_runtime_api.h>
#include <errno.h>

#include "kn_cuda.h"
#include "kn_cuda_module.h"
#include "kn_stage_impl.h"
#include "kvf_config.h"

static int versions(int *driver, int *runtime)
{
	*driver = *runtime = 0;
	if (cudaDriverGetVersion(driver) != cudaSuccess || cudaRuntimeGetVersion(runtime) != cudaSuccess) {
		cudaGetLastError();
		return -EIO;
	}
	return 0;
}

const struct kn_cuda_module kn_cuda_module_v1 = {
	.abi = KN_CUDA_MODULE_ABI,
	.opts_bytes = sizeof(struct kn_stage_opts),
	.stage_bytes = sizeof(struct kn_stage),
	.info_bytes = sizeof(struct kn_stage_info),
	.version = KVF_VERSION,
	.stage_create = kn_cuda_stage_create,
	.device_count = kn_cuda_device_count,
	.versions = versions,
	.host_register = kn_cuda_host_register,
	.host_unregister = kn_cuda_host_unregister,
};
