/* SPDX-License-Identifier: Apache-2.0 */
/*
 * KV page messages (DP_MT_KVPAGE bodies, dp_ipc.h struct dp_kvpage_hdr): a
 * prefill side packs a room's pages straight out of a stage's pool
 * (kn_stage_kv_export) behind the header; a decode side checks the header
 * against its own stage and the message's length, then imports the pages
 * into the destination blocks (kn_stage_kv_import). Nothing here allocates.
 *
 * The pages come from and go to a wk_kv_io: a stage engine in this process
 * (wk_kv_io_stage(): the worker) or anything that can export and import one
 * (ctrld's in-process chain, ctrl/pd_link.c).
 */
#ifndef WK_KVPAGE_H
#define WK_KVPAGE_H

#include <stddef.h>
#include <stdint.h>

#include "dp_ipc.h"
#include "kn_stage.h"

/** Where pages come from and go to; each call returns 0 or -errno. */
struct wk_kv_io {
	int (*format)(void *arg, struct kn_kv_format *f);
	int (*export_pages)(void *arg, const int32_t *blocks, int32_t n, void *dst, size_t len);
	int (*import_pages)(void *arg, const int32_t *blocks, int32_t n, const void *src, size_t len,
			    const struct kn_kv_format *f);
	/* the pages are the @p len bytes @p skip bytes into the pieces (a
	 * message received in place); NULL: wk_kvpage_import_segs() gathers */
	int (*import_pages_segs)(void *arg, const int32_t *blocks, int32_t n, const struct kn_seg *segs,
				 int32_t n_segs, size_t skip, size_t len, const struct kn_kv_format *f);
	const char *(*error)(void *arg); /**< why the last call failed */
	void *arg;
};

/** An io over stage engine @p s. */
struct wk_kv_io wk_kv_io_stage(struct kn_stage *s);

/** Bytes a message of @p n_blocks blocks of @p block_bytes takes. */
size_t wk_kvpage_size(size_t block_bytes, int32_t n_blocks);

/** Most blocks one message carries (the importer's limit). */
#define WK_KVPAGE_MAX_BLOCKS 256

/**
 * Pack blocks @p src[0..n) of @p io's pool, to land in the decode node's
 * blocks @p dst[0..n) (entries @p first_index.. of the room's manifest),
 * into @p buf. @p last marks the rank's last message for the room.
 * @return the bytes written, or -ENOSPC (@p cap short), -EINVAL (n outside
 *         1..WK_KVPAGE_MAX_BLOCKS, a block outside the pool: @p err names
 *         it), -EIO.
 */
int64_t wk_kvpage_pack(const struct wk_kv_io *io, uint64_t room, uint32_t session, uint32_t first_index, int last,
		       const int32_t *src, const uint32_t *dst, int32_t n, void *buf, size_t cap, char *err,
		       size_t errlen);

/** What an imported message said. */
struct wk_kvpage_info {
	uint64_t room;
	uint32_t session, first_index, n_blocks;
	int last;
};

/**
 * Check @p len bytes at @p buf as a KV page message for @p io (magic,
 * version, dtype, counts, block size, length; the layer range and head
 * layout must be io's) and import its pages into their destination
 * blocks (each must be in the pool).
 * @return 0 with @p info filled, or -EBADMSG (malformed or truncated),
 *         -EINVAL (another layout, a block outside the pool), -EIO; @p err
 *         names the field and both values. A refused message writes no page.
 */
int wk_kvpage_import(const struct wk_kv_io *io, const void *buf, size_t len, struct wk_kvpage_info *info, char *err,
		     size_t errlen);

/**
 * wk_kvpage_import() of a message in pieces (@p segs[0..n_segs), @p len
 * bytes in all: one received in place, each frame's payload where the
 * network driver left it): the header and block ids are read out, the
 * pages go to io's import_pages_segs, which reads them where they lie.
 * @return as wk_kvpage_import().
 */
int wk_kvpage_import_segs(const struct wk_kv_io *io, const struct kn_seg *segs, int32_t n_segs, size_t len,
			  struct wk_kvpage_info *info, char *err, size_t errlen);

#endif /* WK_KVPAGE_H */
