/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Loading the CUDA backend's module (kvferry-cuda.so). No program of the
 * kvferry package links NVIDIA's libraries: kn_stage_create() for the cuda
 * backend opens the module here, once per process, and calls through the
 * table it exports (kn_cuda_module.h). Where it looks, in order:
 *   1. kn_stage_opts.cuda_module (the daemons' `cuda_module` key), if set;
 *   2. beside the program (a folder of programs carried to a GPU machine);
 *   3. the build tree the program runs from: up to three folders above it,
 *      one that holds build.ninja, at kernels/cuda/module/;
 *   4. the installed module folder, KVF_CUDA_MODULE_DIR (the package's).
 * A program linked with the engine (the CUDA tests and benchmarks, which link
 * kernels/cuda/ statically) defines the table itself and uses it.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kn_cuda_module.h"
#include "kn_err.h"
#include "kn_stage_impl.h"
#include "kvf_config.h"

/* Defined only where the engine is linked in. */
extern const struct kn_cuda_module kn_cuda_module_v1 __attribute__((weak));

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static const struct kn_cuda_module *g_mod; /* under g_mu until set, then read-only */
static char g_path[512];

/* @return 0 when @p m was built with this program's kvferry, or -ELIBBAD. */
static int check_abi(const struct kn_cuda_module *m, const char *path, char *err, size_t errlen)
{
	if (m->abi == KN_CUDA_MODULE_ABI && m->opts_bytes == sizeof(struct kn_stage_opts)
	    && m->stage_bytes == sizeof(struct kn_stage) && m->info_bytes == sizeof(struct kn_stage_info)
	    && m->version && strcmp(m->version, KVF_VERSION) == 0)
		return 0;
	kn_seterr(err, errlen,
		  "%s is kvferry-cuda %s (module ABI %u), this program is kvferry %s (module ABI %u): "
		  "install the kvferry-cuda package of the same version as kvferry",
		  path, m->version ? m->version : "?", m->abi, KVF_VERSION, KN_CUDA_MODULE_ABI);
	return -ELIBBAD;
}

/* Open @p path. @return 0 (g_mod set), -ENOENT (no such file), -ELIBBAD. Under g_mu. */
static int open_module(const char *path, char *err, size_t errlen)
{
	if (access(path, F_OK) != 0) {
		kn_seterr(err, errlen, "cuda_module %s: %s", path, strerror(errno));
		return -ENOENT;
	}
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		kn_seterr(err, errlen,
			  "dlopen(%s) failed: %s (the CUDA backend needs NVIDIA's driver, CUDA 13 runtime and "
			  "cuBLAS: cuda-cudart-13-0 and libcublas-13-0 from NVIDIA's apt repository)",
			  path, dlerror());
		return -ELIBBAD;
	}
	const struct kn_cuda_module *m = dlsym(h, KN_CUDA_MODULE_SYMBOL);
	if (!m) {
		kn_seterr(err, errlen, "%s exports no %s: not a kvferry-cuda module", path, KN_CUDA_MODULE_SYMBOL);
		dlclose(h);
		return -ELIBBAD;
	}
	int rc = check_abi(m, path, err, errlen);
	if (rc < 0) {
		dlclose(h);
		return rc;
	}
	/* kept open for the process's life: stages hold pointers into it */
	snprintf(g_path, sizeof(g_path), "%s", path);
	g_mod = m;
	return 0;
}

/* The build tree's module, when the program runs from one: @return 1 with @p out set. */
static int build_tree_module(const char *exe_dir, char *out, size_t outlen)
{
	char dir[PATH_MAX], probe[PATH_MAX + 64];
	snprintf(dir, sizeof(dir), "%s", exe_dir);
	for (int up = 0; up <= 3; up++) {
		snprintf(probe, sizeof(probe), "%s/build.ninja", dir);
		if (access(probe, F_OK) == 0) {
			snprintf(out, outlen, "%s/kernels/cuda/module/%s", dir, KN_CUDA_MODULE_FILE);
			return access(out, F_OK) == 0;
		}
		char *slash = strrchr(dir, '/');
		if (!slash || slash == dir)
			return 0;
		*slash = '\0';
	}
	return 0;
}

/* Search when no path was given. Under g_mu. */
static int search_module(char *err, size_t errlen)
{
	char exe[PATH_MAX], cand[PATH_MAX + 64];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		exe[n] = '\0';
		char *slash = strrchr(exe, '/');
		if (slash && slash != exe) {
			*slash = '\0';
			snprintf(cand, sizeof(cand), "%s/%s", exe, KN_CUDA_MODULE_FILE);
			if (access(cand, F_OK) == 0)
				return open_module(cand, err, errlen);
			if (build_tree_module(exe, cand, sizeof(cand)))
				return open_module(cand, err, errlen);
		}
	}
	snprintf(cand, sizeof(cand), "%s/%s", KVF_CUDA_MODULE_DIR, KN_CUDA_MODULE_FILE);
	if (access(cand, F_OK) == 0)
		return open_module(cand, err, errlen);
	kn_seterr(err, errlen,
		  "the CUDA backend is not installed: no %s beside this program or in %s (install the "
		  "kvferry-cuda package, set cuda_module to the module's path, or use backend = cpu)",
		  KN_CUDA_MODULE_FILE, KVF_CUDA_MODULE_DIR);
	return -ENODEV;
}

const struct kn_cuda_module *kn_cuda_module_get(const char *path, char *err, size_t errlen)
{
	int rc = 0;
	pthread_mutex_lock(&g_mu);
	if (!g_mod) {
		if (&kn_cuda_module_v1 != NULL) {
			rc = check_abi(&kn_cuda_module_v1, "the linked-in CUDA engine", err, errlen);
			if (rc == 0) {
				snprintf(g_path, sizeof(g_path), "linked in");
				g_mod = &kn_cuda_module_v1;
			}
		} else if (path && *path) {
			rc = open_module(path, err, errlen);
		} else {
			rc = search_module(err, errlen);
		}
	}
	const struct kn_cuda_module *m = g_mod;
	pthread_mutex_unlock(&g_mu);
	if (!m)
		errno = -rc;
	return m;
}

int kn_cuda_open(const char *path, struct kn_cuda_info *info, char *err, size_t errlen)
{
	const struct kn_cuda_module *m = kn_cuda_module_get(path, err, errlen);
	if (!m)
		return -errno;
	if (info) {
		memset(info, 0, sizeof(*info));
		snprintf(info->module, sizeof(info->module), "%s", g_path);
		info->devices = m->device_count();
		m->versions(&info->driver_version, &info->runtime_version);
	}
	return 0;
}

int kn_stage_pin(void *p, size_t len, const char *cuda_module, char *err, size_t errlen)
{
	const struct kn_cuda_module *m = kn_cuda_module_get(cuda_module, err, errlen);
	if (!m)
		return -errno;
	return m->host_register(p, len, err, errlen);
}

int kn_stage_unpin(void *p)
{
	pthread_mutex_lock(&g_mu);
	const struct kn_cuda_module *m = g_mod;
	pthread_mutex_unlock(&g_mu);
	return m ? m->host_unregister(p) : -ENODEV;
}
