/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file wk_tp_area.h
 * The area a tensor-parallel stage's worker processes share in their
 * node's region (kernels/worker/worker_tp.c): named after the stage's input
 * ring, "<in>.tp", made by rank 0 at its first join. Besides the ranks'
 * reduce slots it says who the ranks are, which ctrld reads for `ctrlctl
 * stages` (ctrl/chain_proc_view.c).
 */
#ifndef WK_TP_AREA_H
#define WK_TP_AREA_H

#include <stdatomic.h>
#include <stdint.h>

#include "shm_mb.h"

#define WK_TP_MAX 8
#define WK_TP_MAGIC 0x50544b57u /* "WKTP" */
#define WK_TP_AREA_SUFFIX ".tp"
/* Most block words a KV message carries (worker_kv.c): the area holds one whole */
#define WK_TP_KV_WORDS 8192
#define WK_TP_KV_MSG (sizeof(struct shm_mb_hdr) + sizeof(struct shm_mb_kv) + 4 * WK_TP_KV_WORDS)

enum { WK_TP_KV_MSG_JOB = 1, WK_TP_KV_PAGES_JOB = 2 };

/** One rank's record. */
struct wk_tp_rec {
	_Atomic uint64_t arrive;  /**< the reduces this rank has put its partial in for */
	_Atomic uint64_t depart;  /**< ... and finished reading the others' of */
	_Atomic uint64_t done;    /**< messages it has handled (followers) */
	_Atomic uint64_t ack;     /**< the join generation it answered (followers) */
	uint64_t done_at;         /**< its done count once that join is handled */
	int32_t status, pid, live; /**< its answer to that join, its pid and liveness slot */
	char err[SHM_MB_ERRLEN];
	int32_t kv_status;        /**< its share of the last KV page copy (followers): 0 or -errno */
	char kv_err[SHM_MB_ERRLEN];
	_Atomic uint64_t kv_done; /**< the last KV job (kv_seq) it finished (followers) */
} __attribute__((aligned(64)));

/** The area's head; the ranks' slots follow it. */
struct wk_tp_area {
	uint32_t magic, size;     /**< WK_TP_MAGIC once made; the ranks */
	uint32_t max_cols, ld;    /**< a slot: max_cols rows of ld floats */
	_Atomic uint64_t gen;     /**< join generation: rank 0 bumps it before handing a join on */
	int32_t leader_pid, leader_live;
	uint8_t share[256];       /**< what rank 0 hands the others at stage creation (wk_tp_share: NCCL's id) */
	/* a KV job: page copies outside the input's order (the side ring, the
	 * dataplane's page messages), each rank its share (worker_tp.c) */
	_Atomic uint64_t kv_seq;  /**< the leader's last job */
	uint32_t kv_kind, kv_len; /**< WK_TP_KV_MSG_JOB: the KV message in kv_msg; WK_TP_KV_PAGES_JOB: a page
	                               message of kv_len bytes at region offset kv_off */
	uint64_t kv_off;
	uint8_t kv_msg[WK_TP_KV_MSG];
	struct wk_tp_rec r[WK_TP_MAX];
} __attribute__((aligned(64)));

#endif /* WK_TP_AREA_H */
