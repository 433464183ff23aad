/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-worker's options: one table (worker_cfg.c) over the floor's engine
 * (kvf_cfg.h), read from kvferry.conf's [worker] section, KVFERRY_WK_*
 * variables and flags, each value range-checked and named on a bad one.
 */
#ifndef WK_CFG_H
#define WK_CFG_H

#include <stddef.h>
#include <stdint.h>

#include "kn_stage.h"
#include "kvf_cfg.h"

/* The table's values (the engine stores integers as int64_t). */
struct wk_settings {
	char region[CFG_STRLEN], model[CFG_STRLEN], in[CFG_STRLEN], out[CFG_STRLEN], role[CFG_STRLEN];
	int64_t backend;  /* 0 cpu, 1 cuda */
	int64_t node, threads, kv_mib, device, wait_s, depth, spin_us;
	int64_t cuda_gemv, cuda_wide_x, cuda_attn, cuda_batch_invariant; /* kn_stage_opts' CUDA kernel choices */
	int64_t kv_rx_pieces;                    /* 0 auto, 1 yes, 2 no */
	int64_t tp_size, tp_rank;                /* tensor parallelism inside the stage (worker_tp.c) */
	char tp_devices[CFG_STRLEN];             /* the ranks' CUDA devices, "0,1,..." */
	char trace[CFG_STRLEN], cuda_module[CFG_STRLEN];
};

/* What the daemon runs with, defaults resolved for the backend. */
struct wk_opts {
	const char *region, *model, *in, *out, *role, *trace, *cuda_module;
	enum kn_backend backend;
	int32_t node, threads, device, wait_s, depth, spin_us;
	int32_t cuda_gemv, cuda_wide_x, cuda_attn, cuda_batch_invariant;
	int kv_rx_pieces;            /* take KV page messages received in place as lists of frames */
	int32_t tp_size, tp_rank;    /* this worker is rank tp_rank of its stage's tp_size (worker_tp.c) */
	size_t kv_bytes;
};

/*
 * Read the configuration: the file (--config PATH, else KVFERRY_CONFIG, else
 * /etc/kvferry/kvferry.conf when it exists), KVFERRY_WK_* variables, flags.
 * @p o points into @p *cfg (free it with cfg_free() after the last use).
 * @return 0; 1 when the arguments asked for --help, --print-config or
 *         --check and that is done; < 0 with @p err naming the key, the
 *         value and where it came from.
 */
int wk_load_opts(int argc, char **argv, int max_depth, struct wk_opts *o, struct cfg **cfg, char *err,
		 size_t errlen);

#endif /* WK_CFG_H */
