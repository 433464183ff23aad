/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: a PD control message as the dataplane delivers it
 * (manifest, status, abort, abort ack: ctrl_pd_msg_parse()), and a status
 * applied to a table of open rooms (ctrl_pd_status_apply()).
 *
 * Input: the message. It is applied for session 7 to rooms 1 and 2
 * (Bootstrapped, waiting for two ranks), 3 (still Bootstrapping) and 4
 * (failed).
 *
 * Beyond the sanitizers: a parsed message's blocks and top logprobs lie
 * inside it; encoding what was parsed and parsing that again gives the same
 * message (nothing is read that the encoder would not write; a reason
 * holding a NUL, which no sender writes, is left out of this); an apply
 * counts the message in exactly one of its outcomes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_pd.h"
#include "ctrl_pd_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Encode @p m again into @p buf; @return its length or < 0. */
static int reencode(const struct ctrl_pd_msg *m, uint8_t *buf, size_t cap)
{
	char text[CTRL_PD_MAX_TEXT + 1];
	int32_t ids[CTRL_PD_MAX_TOP];
	float lps[CTRL_PD_MAX_TOP];
	uint32_t *blocks;
	int n;

	memcpy(text, m->text ? m->text : "", m->text_len);
	text[m->text_len] = 0;
	switch (m->kind) {
	case CTRL_PD_MANIFEST:
		blocks = malloc(((size_t)m->n_blocks + 1) * sizeof(*blocks));
		if (!blocks)
			return -1;
		for (uint32_t i = 0; i < m->n_blocks; i++)
			blocks[i] = ctrl_pd_msg_block(m, i);
		n = ctrl_pd_encode_manifest(buf, cap, m->room, m->session, m->rank, m->prefix_cached, blocks,
					    m->n_blocks);
		free(blocks);
		return n;
	case CTRL_PD_STATUS:
		for (uint32_t i = 0; i < m->n_top; i++)
			ctrl_pd_msg_top(m, i, &ids[i], &lps[i]);
		return ctrl_pd_encode_status_top(buf, cap, m->room, m->session, m->rank, m->failed, m->first_token,
						 m->cached_tokens, text, m->first_logprob, m->n_top, ids, lps);
	case CTRL_PD_ABORT:
		return ctrl_pd_encode_abort(buf, cap, m->room, m->session, m->rank, text);
	case CTRL_PD_ABORT_ACK:
		return ctrl_pd_encode_abort_ack(buf, cap, m->room, m->session, m->rank);
	}
	return -1;
}

static void same(const struct ctrl_pd_msg *a, const struct ctrl_pd_msg *b)
{
	if (a->kind != b->kind || a->room != b->room || a->session != b->session || a->rank != b->rank ||
	    a->prefix_cached != b->prefix_cached || a->n_blocks != b->n_blocks || a->failed != b->failed ||
	    a->first_token != b->first_token || a->cached_tokens != b->cached_tokens ||
	    a->text_len != b->text_len || a->n_top != b->n_top ||
	    memcmp(&a->first_logprob, &b->first_logprob, sizeof(float)))
		abort();
	if (a->text_len && memcmp(a->text, b->text, a->text_len))
		abort();
	if (a->n_blocks && memcmp(a->blocks, b->blocks, (size_t)a->n_blocks * 4))
		abort();
	if (a->n_top && memcmp(a->top, b->top, (size_t)a->n_top * 8))
		abort();
}

static void parse_roundtrip(const uint8_t *data, size_t size)
{
	struct ctrl_pd_msg m, m2;
	char err[256];
	uint8_t *buf;
	int n;

	if (ctrl_pd_msg_parse(data, size, &m, err, sizeof(err)))
		return;
	if ((m.n_blocks && (m.blocks < data || m.blocks + (size_t)m.n_blocks * 4 > data + size)) ||
	    (m.n_top && (m.top < data || m.top + (size_t)m.n_top * 8 > data + size)) ||
	    (m.text_len && ((const uint8_t *)m.text < data || (const uint8_t *)m.text + m.text_len > data + size)))
		abort();
	if (m.text_len && memchr(m.text, 0, m.text_len))
		return;
	buf = malloc(size + 64);
	if (!buf)
		return;
	n = reencode(&m, buf, size + 64);
	if (n <= 0 || ctrl_pd_msg_parse(buf, (size_t)n, &m2, err, sizeof(err)))
		abort();
	same(&m, &m2);
	free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ctrl_pd_msg_stats st = {0};
	struct ctrl_rooms_opts o;
	struct ctrl_rooms *rooms;

	parse_roundtrip(data, size);

	ctrl_rooms_opts_init(&o);
	o.capacity = 8;
	o.vocab_size = 1000;
	rooms = ctrl_rooms_create(&o);
	if (!rooms)
		return 0;
	/* 1, 2: Bootstrapped; 3: still Bootstrapping; 4: failed */
	for (uint64_t r = 1; r <= 4; r++)
		if (ctrl_room_open(rooms, r, 0, 2, 0) || (r != 3 && ctrl_room_bootstrapped(rooms, r)))
			abort();
	if (ctrl_room_fail(rooms, 4, "failed before the message"))
		abort();
	(void)ctrl_pd_status_apply(rooms, 7, data, size, &st);
	if (st.applied + st.malformed + st.wrong_kind + st.stale_room + st.bad_rank + st.wrong_session != 1)
		abort();
	ctrl_rooms_destroy(rooms);
	return 0;
}
