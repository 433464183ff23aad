/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_pd_msg.h
 * The PD control messages between a decode node's ctrld and a prefill
 * node's (DP_MT_CONTROL payloads on the dataplane): the page manifest a
 * decode node sends each target prefill rank once the request's pages are
 * reserved, the status each rank sends back when its pages are written,
 * and abort / its acknowledgement.
 *
 * Every message: a 24-byte header (magic "KVPD", version 1, kind, room,
 * total length, session), then its body; integers little-endian. A parse
 * accepts exactly the bytes an encode produces: a truncated or extended
 * message, a bad magic, version, kind, length or count is refused with a
 * reason (-EBADMSG), never read past its end. ctrl_pd_status_apply() turns
 * a parsed status into its room's report and counts what it refused, so a
 * malformed or late message never changes a room (ctrl_pd.h).
 *
 * Threading: pure functions; ctrl_pd_status_apply() follows the rooms
 * table's one-thread rule.
 */
#ifndef CTRL_PD_MSG_H
#define CTRL_PD_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "ctrl_pd.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CTRL_PD_MSG_MAGIC 0x4450564bu /* "KVPD" little-endian */
#define CTRL_PD_MSG_VERSION 2 /* 2: a status carries the first token's logprob and top logprobs */
#define CTRL_PD_MSG_HDR 24
/** Most destination blocks one manifest carries (1M positions at 16 a block). */
#define CTRL_PD_MAX_BLOCKS 65536
/** Most top logprobs a status carries (the API's top_logprobs limit). */
#define CTRL_PD_MAX_TOP 20
/** Longest reason text a status or abort carries. */
#define CTRL_PD_MAX_TEXT 256

enum ctrl_pd_kind {
	CTRL_PD_MANIFEST = 1,  /**< decode -> prefill rank: where the request's pages go */
	CTRL_PD_STATUS = 2,    /**< prefill rank -> decode: pages written (or failed), first token */
	CTRL_PD_ABORT = 3,     /**< decode -> prefill rank: the request ended, free your side */
	CTRL_PD_ABORT_ACK = 4, /**< prefill rank -> decode: freed */
};

/** A parsed message; pointers point into the parsed buffer. */
struct ctrl_pd_msg {
	enum ctrl_pd_kind kind;
	uint64_t room;
	uint32_t session;
	uint32_t rank;          /**< MANIFEST: the target rank; STATUS: the sender */
	/* MANIFEST */
	uint32_t prefix_cached; /**< positions the decode node already holds */
	uint32_t n_blocks;
	const uint8_t *blocks;  /**< [n_blocks] little-endian u32: ctrl_pd_msg_block() */
	/* STATUS */
	int failed;             /**< 1: the rank could not write its pages (text says why) */
	int32_t first_token;    /**< -1: this rank carries none */
	uint32_t cached_tokens; /**< positions the prefill side found cached */
	/* STATUS, ABORT */
	uint32_t text_len;
	const char *text;       /**< [text_len], not NUL-terminated */
	/* STATUS: the first token's logprob and the top logprobs at its position */
	float first_logprob;
	uint32_t n_top;
	const uint8_t *top;     /**< [n_top] (id u32, logprob f32): ctrl_pd_msg_top() */
};

/** Destination block @p i of a parsed manifest. */
uint32_t ctrl_pd_msg_block(const struct ctrl_pd_msg *m, uint32_t i);

/** Top logprob @p i of a parsed status: its token id and logprob. */
void ctrl_pd_msg_top(const struct ctrl_pd_msg *m, uint32_t i, int32_t *id, float *logprob);

/** Bytes a manifest of @p n_blocks takes. */
size_t ctrl_pd_manifest_size(uint32_t n_blocks);

/**
 * Encode into @p buf (@p cap bytes).
 * @return the bytes written, or -ENOSPC (too small), -EINVAL (a count or
 *         text over its limit, no blocks).
 */
int ctrl_pd_encode_manifest(uint8_t *buf, size_t cap, uint64_t room, uint32_t session, uint32_t rank,
			    uint32_t prefix_cached, const uint32_t *blocks, uint32_t n_blocks);
int ctrl_pd_encode_status(uint8_t *buf, size_t cap, uint64_t room, uint32_t session, uint32_t rank, int failed,
			  int32_t first_token, uint32_t cached_tokens, const char *text);
/** A status with the first token's @p logprob and @p n_top (<= CTRL_PD_MAX_TOP) top logprobs. */
int ctrl_pd_encode_status_top(uint8_t *buf, size_t cap, uint64_t room, uint32_t session, uint32_t rank, int failed,
			      int32_t first_token, uint32_t cached_tokens, const char *text, float logprob,
			      uint32_t n_top, const int32_t *top_ids, const float *top_logprobs);
int ctrl_pd_encode_abort(uint8_t *buf, size_t cap, uint64_t room, uint32_t session, uint32_t rank,
			 const char *text);
int ctrl_pd_encode_abort_ack(uint8_t *buf, size_t cap, uint64_t room, uint32_t session, uint32_t rank);

/**
 * Parse @p len bytes.
 * @return 0, or -EBADMSG with @p err saying what is wrong (the field and
 *         its value).
 */
int ctrl_pd_msg_parse(const uint8_t *buf, size_t len, struct ctrl_pd_msg *m, char *err, size_t errlen);

/** What ctrl_pd_status_apply() did, cumulative. */
struct ctrl_pd_msg_stats {
	uint64_t applied;        /**< reports a room took */
	uint64_t malformed;      /**< refused by the parse */
	uint64_t wrong_kind;     /**< a parsed message that is not a status */
	uint64_t stale_room;     /**< for a room never opened, forgotten or finished: dropped */
	uint64_t bad_rank;       /**< from a rank the room does not expect (it failed the room) */
	uint64_t wrong_session;  /**< sent to another registration of this node */
};

/**
 * Apply one status message (@p len bytes) from the dataplane to @p rooms:
 * the rank's report, its first token (-1 when it carries none), or the
 * room's failure with the rank's reason. A message that does not parse, is
 * not a status, or is for another @p session, an unknown, forgotten or
 * finished room is dropped and counted in @p st, and changes no room. A
 * status from a rank the room does not wait for, or before the room's route
 * was registered (still Bootstrapping), fails that room, naming the rank.
 * @return 0 applied, or the reason it was dropped (-EBADMSG, -EPROTO wrong
 *         kind or session, -ENOENT room, -EINVAL rank).
 */
int ctrl_pd_status_apply(struct ctrl_rooms *rooms, uint32_t session, const uint8_t *buf, size_t len,
			 struct ctrl_pd_msg_stats *st);

#ifdef __cplusplus
}
#endif

#endif /* CTRL_PD_MSG_H */
