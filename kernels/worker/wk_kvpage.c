/* SPDX-License-Identifier: Apache-2.0 */
/*
 * KV page messages: pack from a pool, check and import into one
 * (wk_kvpage.h). The pages are exported straight behind the header and the
 * destination list, so a prefill side writes each byte once into the
 * buffer the dataplane sends from.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "wk_kvpage.h"

static int st_format(void *arg, struct kn_kv_format *f)
{
	return kn_stage_kv_format(arg, f);
}

static int st_export(void *arg, const int32_t *blocks, int32_t n, void *dst, size_t len)
{
	return kn_stage_kv_export(arg, blocks, n, dst, len);
}

static int st_import(void *arg, const int32_t *blocks, int32_t n, const void *src, size_t len,
		     const struct kn_kv_format *f)
{
	return kn_stage_kv_import(arg, blocks, n, src, len, f);
}

static int st_import_segs(void *arg, const int32_t *blocks, int32_t n, const struct kn_seg *segs, int32_t n_segs,
			  size_t skip, size_t len, const struct kn_kv_format *f)
{
	return kn_stage_kv_import_segs(arg, blocks, n, segs, n_segs, skip, len, f);
}

static const char *st_error(void *arg)
{
	return kn_stage_error(arg);
}

struct wk_kv_io wk_kv_io_stage(struct kn_stage *s)
{
	return (struct wk_kv_io){ .format = st_format, .export_pages = st_export, .import_pages = st_import,
				  .import_pages_segs = st_import_segs,
				  .error = st_error, .arg = s };
}

size_t wk_kvpage_size(size_t block_bytes, int32_t n_blocks)
{
	return sizeof(struct dp_kvpage_hdr) + (size_t)n_blocks * (4 + block_bytes);
}

int64_t wk_kvpage_pack(const struct wk_kv_io *io, uint64_t room, uint32_t session, uint32_t first_index, int last,
		       const int32_t *src, const uint32_t *dst, int32_t n, void *buf, size_t cap, char *err,
		       size_t errlen)
{
	struct kn_kv_format f;
	struct dp_kvpage_fields h;
	size_t need;
	uint8_t *b = buf;
	int rc;

	rc = io->format(io->arg, &f);
	if (rc < 0) {
		snprintf(err, errlen, "reading the pool's page format: %s", io->error(io->arg));
		return rc;
	}
	if (n < 1 || n > WK_KVPAGE_MAX_BLOCKS) {
		snprintf(err, errlen, "a KV page message carries 1..%d blocks (got %d)", WK_KVPAGE_MAX_BLOCKS, (int)n);
		return -EINVAL;
	}
	need = wk_kvpage_size(f.block_bytes, n);
	if (cap < need) {
		snprintf(err, errlen, "%d KV blocks need %zu bytes; the buffer has %zu", (int)n, need, cap);
		return -ENOSPC;
	}
	h = (struct dp_kvpage_fields){
		.dtype = f.dtype == KN_DT_BF16 ? DP_KVPAGE_BF16 : DP_KVPAGE_F32, .room = room, .session = session,
		.flags = last ? DP_KVPAGE_LAST : 0, .layer_start = f.layer_start, .layer_end = f.layer_end,
		.n_kv_heads = (uint32_t)f.n_kv_heads, .head_dim = (uint32_t)f.head_dim, .first_index = first_index,
		.n_blocks = (uint32_t)n, .block_bytes = f.block_bytes,
	};
	dp_kvpage_hdr_put(b, &h);
	for (int32_t i = 0; i < n; i++) {
		uint32_t v = htole32(dst[i]);

		memcpy(b + sizeof(struct dp_kvpage_hdr) + 4 * (size_t)i, &v, 4);
	}
	rc = io->export_pages(io->arg, src, n, b + sizeof(struct dp_kvpage_hdr) + 4 * (size_t)n,
			      (size_t)n * f.block_bytes);
	if (rc < 0) {
		snprintf(err, errlen, "exporting room %llu's pages: %s", (unsigned long long)room, io->error(io->arg));
		return rc;
	}
	return (int64_t)need;
}

#define BAD(code, ...)                                       \
	do {                                                 \
		snprintf(err, errlen, __VA_ARGS__);          \
		return code;                                 \
	} while (0)

/* The first @p cap bytes of the pieces into @p dst; @return how many there were. */
static size_t head_of(const struct kn_seg *segs, int32_t n_segs, uint8_t *dst, size_t cap)
{
	size_t got = 0;

	for (int32_t i = 0; i < n_segs && got < cap; i++) {
		size_t k = segs[i].len < cap - got ? segs[i].len : cap - got;

		memcpy(dst + got, segs[i].p, k);
		got += k;
	}
	return got;
}

int wk_kvpage_import(const struct wk_kv_io *io, const void *buf, size_t len, struct wk_kvpage_info *info, char *err,
		     size_t errlen)
{
	const struct kn_seg one = { buf, len };

	return wk_kvpage_import_segs(io, &one, 1, len, info, err, errlen);
}

int wk_kvpage_import_segs(const struct wk_kv_io *io, const struct kn_seg *segs, int32_t n_segs, size_t len,
			  struct wk_kvpage_info *info, char *err, size_t errlen)
{
	struct dp_kvpage_fields h;
	struct kn_kv_format mine, theirs;
	/* the header and the block ids, read out of the pieces (one buffer: in place) */
	uint8_t head[sizeof(struct dp_kvpage_hdr) + 4 * WK_KVPAGE_MAX_BLOCKS];
	const size_t hl = sizeof(struct dp_kvpage_hdr);
	const uint8_t *b = n_segs == 1 ? segs[0].p : head;
	int32_t blocks[WK_KVPAGE_MAX_BLOCKS];
	const void *buf = b;
	int rc;

	if (n_segs < 1)
		BAD(-EBADMSG, "KV page message in %d pieces", (int)n_segs);
	if (n_segs > 1 && head_of(segs, n_segs, head, len < sizeof(head) ? len : sizeof(head))
			  < (len < sizeof(head) ? len : sizeof(head)))
		BAD(-EBADMSG, "KV page message of %zu bytes in pieces that hold fewer", len);
	rc = dp_kvpage_hdr_get(buf, len, &h);

	if (rc == -1)
		BAD(-EBADMSG, "KV page message of %zu bytes: shorter than its %zu-byte header", len, hl);
	if (rc < 0) {
		struct dp_kvpage_hdr raw;

		memcpy(&raw, buf, sizeof(raw));
		BAD(-EBADMSG, "KV page message magic %08x version %u: expected %08x version %u (the same kvferry "
		    "version on every node)", le32toh(raw.magic), le16toh(raw.version), DP_KVPAGE_MAGIC,
		    DP_KVPAGE_VERSION);
	}
	if (io->format(io->arg, &mine) < 0)
		BAD(-EIO, "reading the pool's page format: %s", io->error(io->arg));
	theirs.dtype = h.dtype == DP_KVPAGE_BF16 ? KN_DT_BF16 : h.dtype == DP_KVPAGE_F32 ? KN_DT_F32 : -1;
	theirs.layer_start = h.layer_start;
	theirs.layer_end = h.layer_end;
	theirs.n_kv_heads = (int32_t)h.n_kv_heads;
	theirs.head_dim = (int32_t)h.head_dim;
	if (theirs.dtype < 0)
		BAD(-EBADMSG, "KV page message dtype %u: expected %u (f32) or %u (bf16)", h.dtype, DP_KVPAGE_F32,
		    DP_KVPAGE_BF16);
	if (theirs.layer_start != mine.layer_start || theirs.layer_end != mine.layer_end
	    || theirs.n_kv_heads != mine.n_kv_heads || theirs.head_dim != mine.head_dim)
		BAD(-EINVAL, "KV pages of layers [%d,%d), %d KV heads x %d for a stage of layers [%d,%d), %d x %d: "
		    "split the model into the same stages on both nodes", (int)theirs.layer_start,
		    (int)theirs.layer_end, (int)theirs.n_kv_heads, (int)theirs.head_dim, (int)mine.layer_start,
		    (int)mine.layer_end, (int)mine.n_kv_heads, (int)mine.head_dim);
	if (theirs.layer_end <= theirs.layer_start || theirs.n_kv_heads < 1 || theirs.head_dim < 1)
		BAD(-EBADMSG, "KV page message with an empty layout");
	theirs.block_bytes = (size_t)(theirs.layer_end - theirs.layer_start) * 2 * (size_t)theirs.n_kv_heads
			     * KN_PAGE_BLK * (size_t)theirs.head_dim * (theirs.dtype == KN_DT_BF16 ? 2 : 4);
	if (h.block_bytes != theirs.block_bytes)
		BAD(-EBADMSG, "KV page message says %llu bytes a block; its layout makes %zu",
		    (unsigned long long)h.block_bytes, theirs.block_bytes);
	if (h.n_blocks < 1 || h.n_blocks > WK_KVPAGE_MAX_BLOCKS
	    || len != wk_kvpage_size(theirs.block_bytes, (int32_t)h.n_blocks))
		BAD(-EBADMSG, "KV page message of %zu bytes with %u blocks of %zu (at most %d blocks a message)", len,
		    h.n_blocks, theirs.block_bytes, WK_KVPAGE_MAX_BLOCKS);
	for (uint32_t i = 0; i < h.n_blocks; i++) {
		uint32_t v;

		memcpy(&v, b + hl + 4 * (size_t)i, 4);
		v = le32toh(v);
		if (v > INT32_MAX)
			BAD(-EINVAL, "KV page message: destination block %u (entry %u) is not a block id", v, i);
		blocks[i] = (int32_t)v;
	}
	if (n_segs == 1)
		rc = io->import_pages(io->arg, blocks, (int32_t)h.n_blocks, b + hl + 4 * (size_t)h.n_blocks,
				      (size_t)h.n_blocks * theirs.block_bytes, &theirs);
	else if (io->import_pages_segs != NULL)
		rc = io->import_pages_segs(io->arg, blocks, (int32_t)h.n_blocks, segs, n_segs,
					   hl + 4 * (size_t)h.n_blocks, (size_t)h.n_blocks * theirs.block_bytes, &theirs);
	else
		BAD(-ENOTSUP, "KV page message in %d pieces: this importer reads one buffer", (int)n_segs);
	if (rc < 0)
		BAD(rc, "importing room %llu's pages: %s", (unsigned long long)h.room, io->error(io->arg));
	info->room = h.room;
	info->session = h.session;
	info->first_index = h.first_index;
	info->n_blocks = h.n_blocks;
	info->last = (h.flags & DP_KVPAGE_LAST) != 0;
	return 0;
}
