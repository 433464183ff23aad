/* SPDX-License-Identifier: Apache-2.0 */
/*
 * KV page messages: pack from a stage, check and import into one
 * (wk_kvpage.h). The pages are exported straight behind the header and the
 * destination list, so a prefill worker writes each byte once into the
 * buffer the dataplane sends from.
 */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "wk_kvpage.h"

size_t wk_kvpage_size(size_t block_bytes, int32_t n_blocks)
{
	return sizeof(struct dp_kvpage_hdr) + (size_t)n_blocks * (4 + block_bytes);
}

int64_t wk_kvpage_pack(struct kn_stage *s, uint64_t room, uint32_t session, uint32_t first_index, int last,
		       const int32_t *src, const uint32_t *dst, int32_t n, void *buf, size_t cap, char *err,
		       size_t errlen)
{
	struct kn_kv_format f;
	struct dp_kvpage_hdr h;
	size_t need;
	uint8_t *b = buf;
	int rc;

	kn_stage_kv_format(s, &f);
	if (n < 1) {
		snprintf(err, errlen, "a KV page message needs at least one block (got %d)", (int)n);
		return -EINVAL;
	}
	need = wk_kvpage_size(f.block_bytes, n);
	if (cap < need) {
		snprintf(err, errlen, "%d KV blocks need %zu bytes; the buffer has %zu", (int)n, need, cap);
		return -ENOSPC;
	}
	memset(&h, 0, sizeof(h));
	h.magic = htole32(DP_KVPAGE_MAGIC);
	h.version = htole16(DP_KVPAGE_VERSION);
	h.dtype = htole16(f.dtype == KN_DT_BF16 ? DP_KVPAGE_BF16 : DP_KVPAGE_F32);
	h.room = htole64(room);
	h.session = htole32(session);
	h.flags = htole32(last ? DP_KVPAGE_LAST : 0);
	h.layer_start = (int32_t)htole32((uint32_t)f.layer_start);
	h.layer_end = (int32_t)htole32((uint32_t)f.layer_end);
	h.n_kv_heads = htole32((uint32_t)f.n_kv_heads);
	h.head_dim = htole32((uint32_t)f.head_dim);
	h.first_index = htole32(first_index);
	h.n_blocks = htole32((uint32_t)n);
	h.block_bytes = htole64(f.block_bytes);
	memcpy(b, &h, sizeof(h));
	for (int32_t i = 0; i < n; i++) {
		uint32_t v = htole32(dst[i]);

		memcpy(b + sizeof(h) + 4 * (size_t)i, &v, 4);
	}
	rc = kn_stage_kv_export(s, src, n, b + sizeof(h) + 4 * (size_t)n, (size_t)n * f.block_bytes);
	if (rc < 0) {
		snprintf(err, errlen, "exporting room %llu's pages: %s", (unsigned long long)room, kn_stage_error(s));
		return rc;
	}
	return (int64_t)need;
}

#define BAD(code, ...)                                       \
	do {                                                 \
		snprintf(err, errlen, __VA_ARGS__);          \
		return code;                                 \
	} while (0)

int wk_kvpage_import(struct kn_stage *s, const void *buf, size_t len, struct wk_kvpage_info *info, char *err,
		     size_t errlen)
{
	struct dp_kvpage_hdr h;
	struct kn_kv_format mine, theirs;
	const uint8_t *b = buf;
	int32_t blocks[256];
	uint32_t n, dtype;
	uint64_t bb;
	int rc;

	if (len < sizeof(h))
		BAD(-EBADMSG, "KV page message of %zu bytes: shorter than its %zu-byte header", len, sizeof(h));
	memcpy(&h, b, sizeof(h));
	if (le32toh(h.magic) != DP_KVPAGE_MAGIC || le16toh(h.version) != DP_KVPAGE_VERSION)
		BAD(-EBADMSG, "KV page message magic %08x version %u: expected %08x version %u (the same kvferry "
		    "version on every node)", le32toh(h.magic), le16toh(h.version), DP_KVPAGE_MAGIC, DP_KVPAGE_VERSION);
	dtype = le16toh(h.dtype);
	n = le32toh(h.n_blocks);
	bb = le64toh(h.block_bytes);
	kn_stage_kv_format(s, &mine);
	theirs.dtype = dtype == DP_KVPAGE_BF16 ? KN_DT_BF16 : dtype == DP_KVPAGE_F32 ? KN_DT_F32 : -1;
	theirs.layer_start = (int32_t)le32toh((uint32_t)h.layer_start);
	theirs.layer_end = (int32_t)le32toh((uint32_t)h.layer_end);
	theirs.n_kv_heads = (int32_t)le32toh(h.n_kv_heads);
	theirs.head_dim = (int32_t)le32toh(h.head_dim);
	if (theirs.dtype < 0)
		BAD(-EBADMSG, "KV page message dtype %u: expected %u (f32) or %u (bf16)", dtype, DP_KVPAGE_F32,
		    DP_KVPAGE_BF16);
	if (theirs.layer_start != mine.layer_start || theirs.layer_end != mine.layer_end
	    || theirs.n_kv_heads != mine.n_kv_heads || theirs.head_dim != mine.head_dim)
		BAD(-EINVAL, "KV pages of layers [%d,%d), %d KV heads x %d for a stage of layers [%d,%d), %d x %d: "
		    "split the model into the same stages on both nodes", (int)theirs.layer_start,
		    (int)theirs.layer_end, (int)theirs.n_kv_heads, (int)theirs.head_dim, (int)mine.layer_start,
		    (int)mine.layer_end, (int)mine.n_kv_heads, (int)mine.head_dim);
	theirs.block_bytes = (size_t)(theirs.layer_end - theirs.layer_start) * 2 * (size_t)theirs.n_kv_heads
			     * KN_PAGE_BLK * (size_t)theirs.head_dim * (theirs.dtype == KN_DT_BF16 ? 2 : 4);
	if (bb != theirs.block_bytes)
		BAD(-EBADMSG, "KV page message says %llu bytes a block; its layout makes %zu",
		    (unsigned long long)bb, theirs.block_bytes);
	if (n < 1 || n > sizeof(blocks) / sizeof(blocks[0]) || len != wk_kvpage_size(theirs.block_bytes, (int32_t)n))
		BAD(-EBADMSG, "KV page message of %zu bytes with %u blocks of %zu (at most %zu blocks a message)", len,
		    n, theirs.block_bytes, sizeof(blocks) / sizeof(blocks[0]));
	for (uint32_t i = 0; i < n; i++) {
		uint32_t v;

		memcpy(&v, b + sizeof(h) + 4 * (size_t)i, 4);
		v = le32toh(v);
		if (v > INT32_MAX)
			BAD(-EINVAL, "KV page message: destination block %u (entry %u) is not a block id", v, i);
		blocks[i] = (int32_t)v;
	}
	rc = kn_stage_kv_import(s, blocks, (int32_t)n, b + sizeof(h) + 4 * (size_t)n, (size_t)n * theirs.block_bytes,
				&theirs);
	if (rc < 0)
		BAD(rc, "importing room %llu's pages: %s", (unsigned long long)le64toh(h.room), kn_stage_error(s));
	info->room = le64toh(h.room);
	info->session = le32toh(h.session);
	info->first_index = le32toh(h.first_index);
	info->n_blocks = n;
	info->last = (le32toh(h.flags) & DP_KVPAGE_LAST) != 0;
	return 0;
}
