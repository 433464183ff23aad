/* SPDX-License-Identifier: Apache-2.0 */
/*
 * PD control messages: encode, parse, and a status applied to its room
 * (ctrl_pd_msg.h). Byte layouts (little-endian):
 *
 *   header   0 magic u32 | 4 version u16 | 6 kind u16 | 8 room u64 | 16 len u32 | 20 session u32
 *   MANIFEST 24 rank u32 | 28 prefix_cached u32 | 32 n_blocks u32 | 36 blocks u32[n]
 *   STATUS   24 rank u32 | 28 failed u32 | 32 first_token i32 | 36 cached_tokens u32 | 40 text_len u32 | 44 text
 *            | then logprob f32 | n_top u32 | (id u32, logprob f32)[n_top]   (version 2)
 *   ABORT    24 rank u32 | 28 text_len u32 | 32 text
 *   ACK      24 rank u32
 *
 * A parse checks every length against the buffer before it reads, so a
 * truncated, extended or lying message is refused, never read past.
 */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ctrl_pd_msg.h"
#include "kn_stage.h"

static void put32(uint8_t *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return le32toh(v);
}

static void header(uint8_t *b, enum ctrl_pd_kind kind, uint64_t room, uint32_t len, uint32_t session)
{
	uint16_t v = htole16(CTRL_PD_MSG_VERSION), k = htole16((uint16_t)kind);
	uint64_t r = htole64(room);

	put32(b, CTRL_PD_MSG_MAGIC);
	memcpy(b + 4, &v, 2);
	memcpy(b + 6, &k, 2);
	memcpy(b + 8, &r, 8);
	put32(b + 16, len);
	put32(b + 20, session);
}

uint32_t ctrl_pd_msg_block(const struct ctrl_pd_msg *m, uint32_t i)
{
	return i < m->n_blocks ? get32(m->blocks + 4 * (size_t)i) : UINT32_MAX;
}

size_t ctrl_pd_manifest_size(uint32_t n_blocks)
{
	return CTRL_PD_MSG_HDR + 12 + 4 * (size_t)n_blocks;
}

int ctrl_pd_encode_manifest(uint8_t *buf, size_t cap, uint64_t room, uint32_t session, uint32_t rank,
			    uint32_t prefix_cached, const uint32_t *blocks, uint32_t n_blocks)
{
	size_t len = ctrl_pd_manifest_size(n_blocks);

	if (n_blocks < 1 || n_blocks > CTRL_PD_MAX_BLOCKS || prefix_cached > n_blocks * (uint32_t)KN_PAGE_BLK)
		return -EINVAL;
	if (cap < len)
		return -ENOSPC;
	header(buf, CTRL_PD_MANIFEST, room, (uint32_t)len, session);
	put32(buf + 24, rank);
	put32(buf + 28, prefix_cached);
	put32(buf + 32, n_blocks);
	for (uint32_t i = 0; i < n_blocks; i++)
		put32(buf + 36 + 4 * (size_t)i, blocks[i]);
	return (int)len;
}

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

int ctrl_pd_encode_status(uint8_t *buf, size_t cap, uint64_t room, uint32_t session, uint32_t rank, int failed,
			  int32_t first_token, uint32_t cached_tokens, const char *text)
{
	return ctrl_pd_encode_status_top(buf, cap, room, session, rank, failed, first_token, cached_tokens, text, 0.0f,
					 0, NULL, NULL);
}

int ctrl_pd_encode_status_top(uint8_t *buf, size_t cap, uint64_t room, uint32_t session, uint32_t rank, int failed,
			      int32_t first_token, uint32_t cached_tokens, const char *text, float logprob,
			      uint32_t n_top, const int32_t *top_ids, const float *top_logprobs)
{
	size_t tl = text != NULL ? strlen(text) : 0, len = CTRL_PD_MSG_HDR + 28 + tl + 8 * (size_t)n_top;

	if (tl > CTRL_PD_MAX_TEXT || first_token < -1 || (failed != 0 && failed != 1) || n_top > CTRL_PD_MAX_TOP
	    || (n_top > 0 && (top_ids == NULL || top_logprobs == NULL)))
		return -EINVAL;
	if (cap < len)
		return -ENOSPC;
	header(buf, CTRL_PD_STATUS, room, (uint32_t)len, session);
	put32(buf + 24, rank);
	put32(buf + 28, (uint32_t)failed);
	put32(buf + 32, (uint32_t)first_token);
	put32(buf + 36, cached_tokens);
	put32(buf + 40, (uint32_t)tl);
	if (tl)
		memcpy(buf + 44, text, tl);
	put32(buf + 44 + tl, f32_bits(logprob));
	put32(buf + 48 + tl, n_top);
	for (uint32_t i = 0; i < n_top; i++) {
		put32(buf + 52 + tl + 8 * (size_t)i, (uint32_t)top_ids[i]);
		put32(buf + 56 + tl + 8 * (size_t)i, f32_bits(top_logprobs[i]));
	}
	return (int)len;
}

void ctrl_pd_msg_top(const struct ctrl_pd_msg *m, uint32_t i, int32_t *id, float *logprob)
{
	*id = (int32_t)get32(m->top + 8 * (size_t)i);
	*logprob = bits_f32(get32(m->top + 8 * (size_t)i + 4));
}

int ctrl_pd_encode_abort(uint8_t *buf, size_t cap, uint64_t room, uint32_t session, uint32_t rank,
			 const char *text)
{
	size_t tl = text != NULL ? strlen(text) : 0, len = CTRL_PD_MSG_HDR + 8 + tl;

	if (tl > CTRL_PD_MAX_TEXT)
		return -EINVAL;
	if (cap < len)
		return -ENOSPC;
	header(buf, CTRL_PD_ABORT, room, (uint32_t)len, session);
	put32(buf + 24, rank);
	put32(buf + 28, (uint32_t)tl);
	if (tl)
		memcpy(buf + 32, text, tl);
	return (int)len;
}

int ctrl_pd_encode_abort_ack(uint8_t *buf, size_t cap, uint64_t room, uint32_t session, uint32_t rank)
{
	const size_t len = CTRL_PD_MSG_HDR + 4;

	if (cap < len)
		return -ENOSPC;
	header(buf, CTRL_PD_ABORT_ACK, room, (uint32_t)len, session);
	put32(buf + 24, rank);
	return (int)len;
}

#define BAD(...)                                             \
	do {                                                 \
		if (err != NULL && errlen > 0)               \
			snprintf(err, errlen, __VA_ARGS__);  \
		return -EBADMSG;                             \
	} while (0)

int ctrl_pd_msg_parse(const uint8_t *b, size_t len, struct ctrl_pd_msg *m, char *err, size_t errlen)
{
	uint16_t version, kind;
	uint64_t room;
	uint32_t hlen;

	memset(m, 0, sizeof(*m));
	if (b == NULL || len < CTRL_PD_MSG_HDR)
		BAD("PD message of %zu bytes: shorter than its %d-byte header", len, CTRL_PD_MSG_HDR);
	if (get32(b) != CTRL_PD_MSG_MAGIC)
		BAD("PD message magic %08x, expected %08x", get32(b), CTRL_PD_MSG_MAGIC);
	memcpy(&version, b + 4, 2);
	memcpy(&kind, b + 6, 2);
	memcpy(&room, b + 8, 8);
	version = le16toh(version);
	kind = le16toh(kind);
	hlen = get32(b + 16);
	if (version != CTRL_PD_MSG_VERSION)
		BAD("PD message version %u: this node speaks %d (run the same kvferry version on every node)",
		    version, CTRL_PD_MSG_VERSION);
	if (hlen != len)
		BAD("PD message says %u bytes, %zu arrived", hlen, len);
	m->kind = (enum ctrl_pd_kind)kind;
	m->room = le64toh(room);
	m->session = get32(b + 20);
	switch (kind) {
	case CTRL_PD_MANIFEST:
		if (len < CTRL_PD_MSG_HDR + 12)
			BAD("PD manifest of %zu bytes: shorter than its fixed part", len);
		m->rank = get32(b + 24);
		m->prefix_cached = get32(b + 28);
		m->n_blocks = get32(b + 32);
		if (m->n_blocks < 1 || m->n_blocks > CTRL_PD_MAX_BLOCKS)
			BAD("PD manifest of room %llu: %u blocks, expected 1..%d", (unsigned long long)m->room,
			    m->n_blocks, CTRL_PD_MAX_BLOCKS);
		if (len != ctrl_pd_manifest_size(m->n_blocks))
			BAD("PD manifest of room %llu: %u blocks need %zu bytes, it has %zu", (unsigned long long)m->room,
			    m->n_blocks, ctrl_pd_manifest_size(m->n_blocks), len);
		if (m->prefix_cached > m->n_blocks * (uint32_t)KN_PAGE_BLK)
			BAD("PD manifest of room %llu: %u cached positions in %u blocks", (unsigned long long)m->room,
			    m->prefix_cached, m->n_blocks);
		m->blocks = b + 36;
		return 0;
	case CTRL_PD_STATUS:
		if (len < CTRL_PD_MSG_HDR + 28)
			BAD("PD status of %zu bytes: shorter than its fixed part", len);
		m->rank = get32(b + 24);
		m->failed = (int)get32(b + 28);
		m->first_token = (int32_t)get32(b + 32);
		m->cached_tokens = get32(b + 36);
		m->text_len = get32(b + 40);
		if (get32(b + 28) > 1)
			BAD("PD status of room %llu: failed = %u, expected 0 or 1", (unsigned long long)m->room,
			    get32(b + 28));
		if (m->first_token < -1)
			BAD("PD status of room %llu: first token %d", (unsigned long long)m->room, (int)m->first_token);
		if (m->text_len > CTRL_PD_MAX_TEXT || len < (size_t)CTRL_PD_MSG_HDR + 28 + m->text_len)
			BAD("PD status of room %llu: a %u-byte reason in %zu bytes", (unsigned long long)m->room,
			    m->text_len, len);
		m->text = (const char *)b + 44;
		m->first_logprob = bits_f32(get32(b + 44 + m->text_len));
		m->n_top = get32(b + 48 + m->text_len);
		if (m->n_top > CTRL_PD_MAX_TOP
		    || len != (size_t)CTRL_PD_MSG_HDR + 28 + m->text_len + 8 * (size_t)m->n_top)
			BAD("PD status of room %llu: %u top logprobs in %zu bytes (at most %d)", (unsigned long long)m->room,
			    m->n_top, len, CTRL_PD_MAX_TOP);
		m->top = b + 52 + m->text_len;
		return 0;
	case CTRL_PD_ABORT:
		if (len < CTRL_PD_MSG_HDR + 8)
			BAD("PD abort of %zu bytes: shorter than its fixed part", len);
		m->rank = get32(b + 24);
		m->text_len = get32(b + 28);
		if (m->text_len > CTRL_PD_MAX_TEXT || len != (size_t)CTRL_PD_MSG_HDR + 8 + m->text_len)
			BAD("PD abort of room %llu: a %u-byte reason in %zu bytes", (unsigned long long)m->room,
			    m->text_len, len);
		m->text = (const char *)b + 32;
		return 0;
	case CTRL_PD_ABORT_ACK:
		if (len != CTRL_PD_MSG_HDR + 4)
			BAD("PD abort ack of %zu bytes, expected %d", len, CTRL_PD_MSG_HDR + 4);
		m->rank = get32(b + 24);
		return 0;
	}
	BAD("PD message kind %u: expected 1..4", kind);
}

int ctrl_pd_status_apply(struct ctrl_rooms *rooms, uint32_t session, const uint8_t *buf, size_t len,
			 struct ctrl_pd_msg_stats *st)
{
	struct ctrl_pd_msg m;
	char why[CTRL_PD_MAX_TEXT + 96];
	int rc;

	if (ctrl_pd_msg_parse(buf, len, &m, NULL, 0) < 0) {
		st->malformed++;
		return -EBADMSG;
	}
	if (m.kind != CTRL_PD_STATUS || m.session != session) {
		st->wrong_kind += m.kind != CTRL_PD_STATUS;
		st->wrong_session += m.kind == CTRL_PD_STATUS;
		return -EPROTO;
	}
	{
		enum ctrl_room_state rs;

		if (ctrl_room_get(rooms, m.room, &rs, NULL, NULL) < 0 || rs >= CTRL_ROOM_SUCCESS) {
			st->stale_room++;
			return -ENOENT; /* forgotten, never opened, or finished: never revived */
		}
		if (rs == CTRL_ROOM_BOOTSTRAPPING) {
			/* no manifest can have gone out: a rank that answers anyway is not ours */
			snprintf(why, sizeof(why), "prefill rank %u reported before the room's route was registered",
				 m.rank);
			ctrl_room_fail(rooms, m.room, why);
			st->bad_rank++;
			return -EINVAL;
		}
	}
	if (m.failed) {
		snprintf(why, sizeof(why), "prefill rank %u could not write the request's KV pages: %.*s", m.rank,
			 (int)m.text_len, m.text);
		rc = ctrl_room_fail(rooms, m.room, why);
	} else {
		rc = ctrl_room_report(rooms, m.room, m.rank, m.first_token);
		if (rc == -EINVAL) {
			snprintf(why, sizeof(why), "a status from prefill rank %u, which this room does not wait for",
				 m.rank);
			ctrl_room_fail(rooms, m.room, why);
			st->bad_rank++;
			return rc;
		}
	}
	if (rc == 0)
		st->applied++;
	else
		st->stale_room++;
	return rc == 0 ? 0 : -ENOENT;
}
