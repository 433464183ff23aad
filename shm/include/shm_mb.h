/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file shm_mb.h
 * The micro-batch message: what travels between kvferry-ctrld and the
 * kvferry-worker stages, through shm rings on one node and through the
 * dataplane between nodes (the same bytes either way). A shared-memory and
 * wire ABI: fixed-width little-endian fields, offsets not pointers, a
 * static_assert on every offset; any layout change bumps SHM_MB_VERSION.
 *
 * Layout of one message (every part starts 64-byte aligned):
 *
 *   struct shm_mb_hdr                     384 bytes
 *   column records [n_cols]               SHM_MB_COL_BYTES each (struct kn_column)
 *   op records [n_ops]                    SHM_MB_OP_BYTES each (struct kn_op)
 *   payload, by kind:
 *     SHM_MB_TOKENS  nothing (the token ids ride in the columns)
 *     SHM_MB_HIDDEN  f32 rows [n_cols][hidden]
 *     SHM_MB_RESULT  int32 tokens [n_cols], then f32 logprobs [n_cols], then
 *                    (n_logprobs > 0, version 2) int32 top ids [n_cols][n_logprobs]
 *                    and f32 top logprobs [n_cols][n_logprobs]
 *     SHM_MB_JOIN, SHM_MB_POOL  struct shm_mb_setup
 *     SHM_MB_KV      struct shm_mb_kv, then int32 blocks [n_blocks]; the
 *                    vector ops (proto 4): n_copies struct shm_mb_kv_copy,
 *                    then each copy's blocks, n_blocks words in all
 *
 * Frozen across versions: magic, version, kind, status and err sit at the
 * same offsets in every version, so a process of another version can still
 * refuse a message with a readable error that names both versions.
 *
 * Versions: 2 added n_logprobs (the header's former reserved0, zero in
 * every version-1 message) and the top-logprob arrays after a RESULT's
 * logprobs. A version-1 message reads as a version-2 one with n_logprobs 0,
 * byte for byte, so readers accept SHM_MB_VERSION_MIN .. SHM_MB_VERSION; a
 * stage answers in the version it was sent, and ctrld sends the oldest
 * version its stages speak.
 *
 * Error pass-through: a stage that fails a step sets status (-errno) and err,
 * still applies the ops (every stage validates ops identically, so block
 * tables stay the same on every stage) and forwards the message; later
 * stages apply the ops, skip the step and forward; the last stage turns it
 * into a RESULT carrying the first failure.
 *
 * shm/ knows nothing of the model: the column and op records are opaque
 * here; kernels/ and ctrl/ static_assert that their structs have these sizes.
 */
#ifndef SHM_MB_H
#define SHM_MB_H

#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHM_MB_MAGIC 0x424d464bu /* "KFMB" little-endian */
#define SHM_MB_VERSION 2u
/** Oldest version a reader still accepts (see "Versions"). */
#define SHM_MB_VERSION_MIN 1u
/** Most top logprobs per column a RESULT carries. */
#define SHM_MB_MAX_LOGPROBS 20
/** Bytes of one column record (struct kn_column). */
#define SHM_MB_COL_BYTES 32u
/** Bytes of one op record (struct kn_op). */
#define SHM_MB_OP_BYTES 16u
/** Length of the error text, NUL included. */
#define SHM_MB_ERRLEN 160u
/** Most stages a setup message describes. */
#define SHM_MB_MAX_STAGES 16
/** Most plan widths a setup message carries. */
/** Plans a setup message carries: 4 in plan_widths, 4 more in plan_widths_hi (proto 2). */
#define SHM_MB_MAX_PLANS 8

/** What a message carries (shm_mb_hdr.kind; also shm_desc.type). */
enum shm_mb_kind {
	SHM_MB_TOKENS = 1, /**< to the first stage: columns (token ids) + ops */
	SHM_MB_HIDDEN = 2, /**< between stages: columns + ops + hidden rows */
	SHM_MB_RESULT = 3, /**< last stage to ctrld: tokens + logprobs */
	SHM_MB_JOIN = 4,   /**< setup: assignment down, each stage's report back */
	SHM_MB_POOL = 5,   /**< setup: the negotiated KV block count for every stage */
	SHM_MB_KV = 6,     /**< one stage's KV pages out of or into a buffer of the region (proto 3) */
};

/** shm_mb_hdr.flags */
#define SHM_MB_F_OPS_ONLY 0x1u /**< apply the ops, run no step (status says why) */

/** The fixed header (384 bytes). */
struct shm_mb_hdr {
	uint32_t magic;      /**< SHM_MB_MAGIC (frozen offset 0) */
	uint16_t version;    /**< SHM_MB_VERSION (frozen offset 4) */
	uint16_t kind;       /**< enum shm_mb_kind (frozen offset 6) */
	int32_t status;      /**< 0, or -errno of the first failure (frozen offset 8) */
	uint32_t flags;      /**< SHM_MB_F_* */
	uint64_t epoch;      /**< the chain's setup generation: stages drop other epochs */
	uint64_t seq;        /**< the chain's submission number (stale results are dropped) */
	uint32_t group;      /**< micro-batch group id */
	int32_t stage;       /**< index of the stage that receives it next */
	int32_t n_stages;
	int32_t n_cols;
	int32_t n_ops;
	int32_t hidden;      /**< floats per hidden row (HIDDEN), else 0 */
	uint32_t total_len;  /**< bytes of the whole message */
	int32_t n_logprobs;  /**< RESULT, version 2: top logprobs per column (0 .. SHM_MB_MAX_LOGPROBS) */
	uint8_t reserved[32];
	char err[SHM_MB_ERRLEN]; /**< with status < 0: what failed, where (frozen offset 96) */
	uint32_t busy_us[SHM_MB_MAX_STAGES]; /**< each stage adds its step time (stage table) */
	uint8_t reserved2[64];
};
static_assert(offsetof(struct shm_mb_hdr, magic) == 0, "magic at 0");
static_assert(offsetof(struct shm_mb_hdr, version) == 4, "version at 4");
static_assert(offsetof(struct shm_mb_hdr, kind) == 6, "kind at 6");
static_assert(offsetof(struct shm_mb_hdr, status) == 8, "status at 8");
static_assert(offsetof(struct shm_mb_hdr, flags) == 12, "flags at 12");
static_assert(offsetof(struct shm_mb_hdr, epoch) == 16, "epoch at 16");
static_assert(offsetof(struct shm_mb_hdr, seq) == 24, "seq at 24");
static_assert(offsetof(struct shm_mb_hdr, group) == 32, "group at 32");
static_assert(offsetof(struct shm_mb_hdr, stage) == 36, "stage at 36");
static_assert(offsetof(struct shm_mb_hdr, n_stages) == 40, "n_stages at 40");
static_assert(offsetof(struct shm_mb_hdr, n_cols) == 44, "n_cols at 44");
static_assert(offsetof(struct shm_mb_hdr, n_ops) == 48, "n_ops at 48");
static_assert(offsetof(struct shm_mb_hdr, hidden) == 52, "hidden at 52");
static_assert(offsetof(struct shm_mb_hdr, total_len) == 56, "total_len at 56");
static_assert(offsetof(struct shm_mb_hdr, n_logprobs) == 60, "n_logprobs at 60");
static_assert(offsetof(struct shm_mb_hdr, err) == 96, "err at 96");
static_assert(offsetof(struct shm_mb_hdr, busy_us) == 256, "busy_us at 256");
static_assert(sizeof(struct shm_mb_hdr) == 384, "header is 384 bytes");

/** The wire protocol of the stage chain (join refuses another). 2: up to 8 plans.
 *  3: SHM_MB_KV messages. 4: SHM_MB_KV_EXPORT_V / _IMPORT_V. */
#define SHM_MB_PROTO 4u

/** What ctrld assigns to stage i, and what stage i reports back (JOIN, POOL). */
struct shm_mb_stage {
	/* assignment (ctrld) */
	int32_t layer_start;
	int32_t layer_end;
	/* report (the stage) */
	int32_t status;          /**< 0, or -errno: the stage refused or failed */
	uint32_t proto;          /**< the stage's SHM_MB_PROTO */
	uint32_t mb_version;     /**< the stage's SHM_MB_VERSION */
	int32_t pid;
	int32_t node;            /**< dataplane node id, -1 without a dataplane */
	int32_t live_slot;       /**< its shm_live slot in its node's region */
	uint64_t fingerprint;    /**< kn_model_fingerprint of what it loaded */
	int32_t n_blocks;        /**< JOIN: blocks it can hold; POOL: blocks it now holds */
	int32_t hidden;
	uint64_t weight_bytes;
	uint64_t kv_bytes;
	uint64_t load_ns;        /**< time to load its layers */
	char role[24];           /**< its liveness role ("stage1") */
	char backend[8];         /**< "cpu", "cuda" */
	char err[SHM_MB_ERRLEN];
};
static_assert(offsetof(struct shm_mb_stage, status) == 8, "status at 8");
static_assert(offsetof(struct shm_mb_stage, fingerprint) == 32, "fingerprint at 32");
static_assert(offsetof(struct shm_mb_stage, n_blocks) == 40, "n_blocks at 40");
static_assert(offsetof(struct shm_mb_stage, weight_bytes) == 48, "weight_bytes at 48");
static_assert(offsetof(struct shm_mb_stage, load_ns) == 64, "load_ns at 64");
static_assert(offsetof(struct shm_mb_stage, role) == 72, "role at 72");
static_assert(offsetof(struct shm_mb_stage, backend) == 96, "backend at 96");
static_assert(offsetof(struct shm_mb_stage, err) == 104, "err at 104");
static_assert(sizeof(struct shm_mb_stage) == 264, "stage entry is 264 bytes");

/** Payload of JOIN and POOL. */
struct shm_mb_setup {
	uint32_t proto;          /**< ctrld's SHM_MB_PROTO */
	int32_t n_stages;
	uint64_t fingerprint;    /**< ctrld's kn_model_fingerprint */
	int32_t n_slots;
	int32_t max_blocks_per_slot;
	int32_t n_blocks;        /**< JOIN: a fixed count, or -1 (each stage reports what
	                              its budget holds); POOL: the negotiated count */
	int32_t max_groups;      /**< group ids 0 .. max_groups-1 */
	int32_t max_cols;
	int32_t max_ops;
	int32_t plan_widths[4];  /**< plans 0..3 (shm_mb_setup_plan() reads all of them) */
	int32_t n_plans;
	int32_t n_threads;       /**< CPU engine threads per stage (0 = online cores) */
	uint64_t kv_budget_bytes;
	float kv_mem_fraction;
	int32_t reserved0;
	int32_t plan_widths_hi[4]; /**< plans 4..7 */
	struct shm_mb_stage stage[SHM_MB_MAX_STAGES];
};
static_assert(offsetof(struct shm_mb_setup, fingerprint) == 8, "fingerprint at 8");
static_assert(offsetof(struct shm_mb_setup, n_blocks) == 24, "n_blocks at 24");
static_assert(offsetof(struct shm_mb_setup, plan_widths) == 40, "plan_widths at 40");
static_assert(offsetof(struct shm_mb_setup, kv_budget_bytes) == 64, "kv_budget at 64");
static_assert(offsetof(struct shm_mb_setup, plan_widths_hi) == 80, "plan_widths_hi at 80");
static_assert(offsetof(struct shm_mb_setup, stage) == 96, "stage table at 96");

/** @return plan @p i (0 .. SHM_MB_MAX_PLANS-1) of @p s. */
static inline int32_t shm_mb_setup_plan(const struct shm_mb_setup *s, int32_t i)
{
	return i < 4 ? s->plan_widths[i] : s->plan_widths_hi[i - 4];
}

/** Set plan @p i (0 .. SHM_MB_MAX_PLANS-1) of @p s. */
static inline void shm_mb_setup_set_plan(struct shm_mb_setup *s, int32_t i, int32_t w)
{
	if (i < 4)
		s->plan_widths[i] = w;
	else
		s->plan_widths_hi[i - 4] = w;
}
static_assert(sizeof(struct shm_mb_setup) == 96 + 264 * SHM_MB_MAX_STAGES, "setup size");

/*
 * SHM_MB_KV: what a node's ctrld asks of one stage's KV pool for
 * prefill/decode disaggregation, in order with the micro-batches (a stage
 * finishes every step before it, so an export reads what they wrote and an
 * import lands before anything after it runs). The pages sit in a buffer of
 * the region that ctrld owns and names by offset (a page message it sends
 * or received over the dataplane): the stage copies straight between its
 * pool and that buffer. Only stage `target` acts; the others forward it
 * untouched, and the last returns it to ctrld with status (and err) set.
 * The target must map the buffer's region: a stage on ctrld's node.
 */
#define SHM_MB_KV_FORMAT 1u /**< report the stage's page format (the fields below) */
#define SHM_MB_KV_EXPORT 2u /**< blocks[0..n) of the pool into the buffer, back to back */
#define SHM_MB_KV_IMPORT 3u /**< the buffer (in the format below) into blocks[0..n) */
/** EXPORT / IMPORT of several buffers in one message (a batch of page
 * messages): the stage waits for its running steps once, not once each.
 * The words after the record hold n_copies struct shm_mb_kv_copy, then
 * each copy's blocks in turn; n_blocks counts every word; buf_off and
 * buf_len are unused. An IMPORT_V's copies share the record's format. */
#define SHM_MB_KV_EXPORT_V 4u
#define SHM_MB_KV_IMPORT_V 5u

/** Take the KV page messages of dataplane stream buf_off (dp_ipc.h receive
 * routes; ctrld sends it to the stage that owns the stream's layers): the
 * stage makes its receive ring (<in>.rx) and its landing ring (<in>.kvl),
 * routes the stream there, and from then on imports each page message
 * itself, when its room is open in the SHM_MB_KVROOMS_AREA area, and says
 * so on <in>.kvl (below). Answered like FORMAT; a stage that cannot (no
 * such area, no dataplane in its region) answers an error and ctrld goes
 * on taking the pages itself. */
#define SHM_MB_KV_RXROUTE 6u

struct shm_mb_kv {
	uint32_t op;             /**< SHM_MB_KV_* */
	int32_t target;          /**< the stage that acts */
	uint64_t buf_off;        /**< the pages: region offset ... */
	uint64_t buf_len;        /**< ... and bytes (EXPORT: room for them) */
	int32_t n_blocks;        /**< entries of the blocks array after this record */
	/* the page format: the target's answer to FORMAT; what IMPORT's pages are in */
	int32_t dtype;           /**< KN_DT_F32 or KN_DT_BF16 */
	int32_t layer_start, layer_end;
	int32_t n_kv_heads, head_dim;
	uint64_t block_bytes;    /**< one block, every layer of the range, K and V */
	uint32_t n_copies;       /**< the vector ops: shm_mb_kv_copy records after this one */
	uint8_t reserved[4];
};
static_assert(offsetof(struct shm_mb_kv, n_copies) == 56, "n_copies at 56");
static_assert(offsetof(struct shm_mb_kv, buf_off) == 8, "buf_off at 8");
static_assert(offsetof(struct shm_mb_kv, n_blocks) == 24, "n_blocks at 24");
static_assert(offsetof(struct shm_mb_kv, block_bytes) == 48, "block_bytes at 48");
static_assert(sizeof(struct shm_mb_kv) == 64, "shm_mb_kv is 64 bytes");

/*
 * The rooms a decode node's stages may import pages for (SHM_MB_KV_RXROUTE),
 * an area of the dataplane's region that ctrld makes and alone writes the
 * slots of. A stage imports a page message only while the message's room
 * and session are open in a slot. ctrld opens a room's slot before its
 * manifest goes out and closes it before the room's blocks can go to
 * another request; to close, it clears the slot and then waits while a
 * stage says it is importing that room (busy[stage]): each side stores
 * first and reads the other's word after (sequentially consistent), so
 * either the stage sees the slot closed or ctrld sees the stage busy.
 *
 * Landing reports on <in>.kvl, one per page message taken off the stage's
 * receive ring: off = room, len = the message's bytes, type = the stage,
 * flags = SHM_MB_KVL_*, seq = its blocks, aux = its session.
 */
#define SHM_MB_KVROOMS_AREA "ctrld.kvrooms"
#define SHM_MB_KVROOMS_MAGIC 0x4d4f4f52u /* "ROOM" */
#define SHM_MB_KVROOMS_SLOTS 1024
#define SHM_MB_KVL_LAST 0x1u   /**< the stream's last message for the room */
#define SHM_MB_KVL_REFUSED 0x2u /**< not imported: closed room, other layers, or the copy failed */
#define SHM_MB_KVL_IN_PLACE 0x4u /**< imported from its frames where the dataplane received them (no gather) */

struct shm_mb_kvroom {
	uint64_t room;
	uint32_t session;
	uint32_t open;           /**< 1: pages may land (ctrld's word) */
};

struct shm_mb_kvrooms {
	uint32_t magic;
	uint32_t n_slots;
	struct {
		uint64_t room;   /**< what the stage is importing while on */
		int32_t pid;     /**< the stage's worker */
		uint32_t on;
	} busy[SHM_MB_MAX_STAGES];
	struct shm_mb_kvroom slot[SHM_MB_KVROOMS_SLOTS];
};

/** One buffer of a vector KV op: its pages in the region, and how many
 *  of the blocks after the copy records are its own (in record order). */
struct shm_mb_kv_copy {
	uint64_t buf_off;
	uint64_t buf_len;
	int32_t n_blocks;
	int32_t reserved;
};
static_assert(sizeof(struct shm_mb_kv_copy) == 24, "shm_mb_kv_copy is 24 bytes (6 words)");
#define SHM_MB_KV_COPY_WORDS ((int32_t)(sizeof(struct shm_mb_kv_copy) / sizeof(int32_t)))

/** @return the bytes of a KV message naming @p n_blocks blocks. */
static inline size_t shm_mb_kv_size(int32_t n_blocks)
{
	return sizeof(struct shm_mb_hdr) + sizeof(struct shm_mb_kv) + (size_t)n_blocks * sizeof(int32_t);
}

/** @return 1 if @p len bytes hold the KV message at @p h whole (n_blocks in 0 .. @p max_blocks). */
static inline int shm_mb_kv_whole(const struct shm_mb_hdr *h, size_t len, int32_t max_blocks)
{
	const struct shm_mb_kv *k = (const struct shm_mb_kv *)(h + 1);

	return h->n_cols == 0 && h->n_ops == 0 && len >= shm_mb_kv_size(0) && k->n_blocks >= 0
	       && k->n_blocks <= max_blocks && h->total_len >= shm_mb_kv_size(k->n_blocks) && len >= h->total_len;
}

/** @return @p x rounded up to 64. */
static inline size_t shm_mb_align(size_t x)
{
	return (x + 63u) & ~(size_t)63u;
}

/** @return offset of the column records. */
static inline size_t shm_mb_cols_off(void)
{
	return sizeof(struct shm_mb_hdr);
}

/** @return offset of the op records for @p n_cols columns. */
static inline size_t shm_mb_ops_off(int32_t n_cols)
{
	return shm_mb_align(shm_mb_cols_off() + (size_t)n_cols * SHM_MB_COL_BYTES);
}

/** @return offset of the payload for @p n_cols columns and @p n_ops ops. */
static inline size_t shm_mb_payload_off(int32_t n_cols, int32_t n_ops)
{
	return shm_mb_align(shm_mb_ops_off(n_cols) + (size_t)n_ops * SHM_MB_OP_BYTES);
}

/**
 * @return the bytes of a message of @p kind with @p n_cols columns, @p n_ops
 *         ops and hidden rows of @p hidden floats (HIDDEN only).
 */
static inline size_t shm_mb_size(enum shm_mb_kind kind, int32_t n_cols, int32_t n_ops, int32_t hidden)
{
	size_t p = shm_mb_payload_off(n_cols, n_ops);

	switch (kind) {
	case SHM_MB_HIDDEN:
		return p + (size_t)n_cols * (size_t)hidden * sizeof(float);
	case SHM_MB_RESULT:
		return p + (size_t)n_cols * (sizeof(int32_t) + sizeof(float));
	case SHM_MB_JOIN:
	case SHM_MB_POOL:
		return p + sizeof(struct shm_mb_setup);
	default:
		return p;
	}
}

/**
 * @return the bytes of a RESULT with @p n_cols columns, @p n_ops ops and
 *         @p n_logprobs top logprobs per column.
 */
static inline size_t shm_mb_result_size(int32_t n_cols, int32_t n_ops, int32_t n_logprobs)
{
	return shm_mb_size(SHM_MB_RESULT, n_cols, n_ops, 0)
	       + (size_t)n_cols * (size_t)n_logprobs * (sizeof(int32_t) + sizeof(float));
}

/** @return 1 when this build reads messages of version @p v. */
static inline int shm_mb_version_ok(uint32_t v)
{
	return v >= SHM_MB_VERSION_MIN && v <= SHM_MB_VERSION;
}

/**
 * Check that a received message of @p len bytes is whole and self-consistent
 * before anything in it is read past the header.
 * @return 0, -EPROTO (magic or version differ: the caller names both),
 *         -EINVAL (counts out of range or @p len too short).
 */
static inline int shm_mb_check(const struct shm_mb_hdr *h, size_t len, int32_t max_cols,
			       int32_t max_ops)
{
	int32_t k;

	if (len < sizeof(*h) || h->magic != SHM_MB_MAGIC || !shm_mb_version_ok(h->version))
		return -EPROTO;
	k = h->version >= 2 && h->kind == SHM_MB_RESULT ? h->n_logprobs : 0;
	if (h->n_cols < 0 || h->n_cols > max_cols || h->n_ops < 0 || h->n_ops > max_ops
	    || h->hidden < 0 || h->hidden > (1 << 20) || h->total_len > len
	    || k < 0 || k > SHM_MB_MAX_LOGPROBS
	    || shm_mb_size((enum shm_mb_kind)h->kind, h->n_cols, h->n_ops, h->hidden) > h->total_len
	    || (k > 0 && shm_mb_result_size(h->n_cols, h->n_ops, k) > h->total_len))
		return -EINVAL;
	return 0;
}

/** @return the column records of @p h. */
static inline void *shm_mb_cols(struct shm_mb_hdr *h)
{
	return (char *)h + shm_mb_cols_off();
}

/** @return the op records of @p h. */
static inline void *shm_mb_ops(struct shm_mb_hdr *h)
{
	return (char *)h + shm_mb_ops_off(h->n_cols);
}

/** @return the payload of @p h. */
static inline void *shm_mb_payload(struct shm_mb_hdr *h)
{
	return (char *)h + shm_mb_payload_off(h->n_cols, h->n_ops);
}

/** @return a RESULT's top ids [n_cols][n_logprobs] (after tokens and logprobs). */
static inline int32_t *shm_mb_top_ids(struct shm_mb_hdr *h)
{
	return (int32_t *)((char *)shm_mb_payload(h)
			   + (size_t)h->n_cols * (sizeof(int32_t) + sizeof(float)));
}

/** @return a RESULT's top logprobs [n_cols][n_logprobs]. */
static inline float *shm_mb_top_logprobs(struct shm_mb_hdr *h)
{
	return (float *)(shm_mb_top_ids(h) + (size_t)h->n_cols * (size_t)h->n_logprobs);
}

#ifdef __cplusplus
}
#endif
#endif /* SHM_MB_H */
