/* SPDX-License-Identifier: Apache-2.0 */
/*
 * PD control messages: each kind round-trips; every truncation, extension
 * and lying field of a valid message is refused with a reason; random and
 * bit-flipped buffers never read past their end (the sanitizer pass runs
 * this) and parse only when they are exactly what an encode produces; a
 * status lands in its room, and a malformed, stale, foreign-session or
 * wrong-rank one is counted and changes nothing.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ctrl_pd_msg.h"

static void every_kind_round_trips(void **state)
{
	uint8_t b[512];
	const uint32_t blocks[3] = { 7, 9, 400000 };
	struct ctrl_pd_msg m;
	char err[256];
	int n;

	(void)state;
	n = ctrl_pd_encode_manifest(b, sizeof(b), 0x1122334455667788ull, 42, 1, 20, blocks, 3);
	assert_int_equal(n, (int)ctrl_pd_manifest_size(3));
	assert_int_equal(ctrl_pd_msg_parse(b, (size_t)n, &m, err, sizeof(err)), 0);
	assert_int_equal(m.kind, CTRL_PD_MANIFEST);
	assert_true(m.room == 0x1122334455667788ull);
	assert_int_equal(m.session, 42);
	assert_int_equal(m.rank, 1);
	assert_int_equal(m.prefix_cached, 20);
	assert_int_equal(m.n_blocks, 3);
	assert_int_equal(ctrl_pd_msg_block(&m, 2), 400000);
	assert_int_equal(ctrl_pd_msg_block(&m, 3), UINT32_MAX);

	n = ctrl_pd_encode_status(b, sizeof(b), 5, 42, 0, 0, 1234, 16, NULL);
	assert_int_equal(ctrl_pd_msg_parse(b, (size_t)n, &m, err, sizeof(err)), 0);
	assert_int_equal(m.kind, CTRL_PD_STATUS);
	assert_int_equal(m.first_token, 1234);
	assert_int_equal(m.cached_tokens, 16);
	assert_int_equal(m.failed, 0);
	{
		const int32_t ids[3] = { 1234, 7, 99 };
		const float lps[3] = { -0.25f, -1.5f, -3.0f };
		int32_t id;
		float lp;

		n = ctrl_pd_encode_status_top(b, sizeof(b), 5, 42, 0, 0, 1234, 16, NULL, -0.25f, 3, ids, lps);
		assert_int_equal(ctrl_pd_msg_parse(b, (size_t)n, &m, err, sizeof(err)), 0);
		assert_true(m.first_logprob == -0.25f);
		assert_int_equal(m.n_top, 3);
		ctrl_pd_msg_top(&m, 2, &id, &lp);
		assert_int_equal(id, 99);
		assert_true(lp == -3.0f);
		for (int k = 0; k < n; k++) /* every truncation is refused */
			assert_int_equal(ctrl_pd_msg_parse(b, (size_t)k, &m, err, sizeof(err)), -EBADMSG);
		assert_int_equal(ctrl_pd_encode_status_top(b, sizeof(b), 5, 42, 0, 0, 1, 0, NULL, 0.0f,
							   CTRL_PD_MAX_TOP + 1, ids, lps), -EINVAL);
	}
	n = ctrl_pd_encode_status(b, sizeof(b), 5, 42, 1, 1, -1, 0, "out of KV blocks");
	assert_int_equal(ctrl_pd_msg_parse(b, (size_t)n, &m, err, sizeof(err)), 0);
	assert_int_equal(m.failed, 1);
	assert_int_equal(m.text_len, 16);
	assert_memory_equal(m.text, "out of KV blocks", 16);

	n = ctrl_pd_encode_abort(b, sizeof(b), 6, 42, 2, "client went away");
	assert_int_equal(ctrl_pd_msg_parse(b, (size_t)n, &m, err, sizeof(err)), 0);
	assert_int_equal(m.kind, CTRL_PD_ABORT);
	assert_int_equal(m.rank, 2);
	n = ctrl_pd_encode_abort_ack(b, sizeof(b), 6, 42, 2);
	assert_int_equal(ctrl_pd_msg_parse(b, (size_t)n, &m, err, sizeof(err)), 0);
	assert_int_equal(m.kind, CTRL_PD_ABORT_ACK);

	/* limits at encode */
	assert_int_equal(ctrl_pd_encode_manifest(b, sizeof(b), 1, 1, 0, 0, blocks, 0), -EINVAL);
	assert_int_equal(ctrl_pd_encode_manifest(b, sizeof(b), 1, 1, 0, 49, blocks, 3), -EINVAL);
	assert_int_equal(ctrl_pd_encode_manifest(b, 20, 1, 1, 0, 0, blocks, 3), -ENOSPC);
	assert_int_equal(ctrl_pd_encode_status(b, sizeof(b), 1, 1, 0, 0, -2, 0, NULL), -EINVAL);
}

/* Every prefix and every one-byte extension of a valid message is refused. */
static void refuse_every_truncation(const uint8_t *b, int n)
{
	uint8_t x[600];
	struct ctrl_pd_msg m;
	char err[256];

	for (int k = 0; k < n; k++)
		assert_int_equal(ctrl_pd_msg_parse(b, (size_t)k, &m, err, sizeof(err)), -EBADMSG);
	memcpy(x, b, (size_t)n);
	x[n] = 0;
	assert_int_equal(ctrl_pd_msg_parse(x, (size_t)n + 1, &m, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "arrived"));
}

static void truncated_extended_and_lying_messages_are_refused_by_name(void **state)
{
	uint8_t b[512], x[512];
	const uint32_t blocks[4] = { 1, 2, 3, 4 };
	struct ctrl_pd_msg m;
	char err[256];
	int n;

	(void)state;
	n = ctrl_pd_encode_manifest(b, sizeof(b), 9, 3, 0, 0, blocks, 4);
	refuse_every_truncation(b, n);
	n = ctrl_pd_encode_status(b, sizeof(b), 9, 3, 0, 1, -1, 0, "why");
	refuse_every_truncation(b, n);
	n = ctrl_pd_encode_abort(b, sizeof(b), 9, 3, 0, "bye");
	refuse_every_truncation(b, n);
	n = ctrl_pd_encode_abort_ack(b, sizeof(b), 9, 3, 0);
	refuse_every_truncation(b, n);

	n = ctrl_pd_encode_manifest(b, sizeof(b), 9, 3, 0, 0, blocks, 4);
	memcpy(x, b, (size_t)n);
	x[0] ^= 1;
	assert_int_equal(ctrl_pd_msg_parse(x, (size_t)n, &m, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "magic"));
	memcpy(x, b, (size_t)n);
	x[4] = 3;
	assert_int_equal(ctrl_pd_msg_parse(x, (size_t)n, &m, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "version 3"));
	memcpy(x, b, (size_t)n);
	x[6] = 9;
	assert_int_equal(ctrl_pd_msg_parse(x, (size_t)n, &m, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "kind 9"));
	/* a block count that does not fit the bytes, or is absurd */
	memcpy(x, b, (size_t)n);
	x[32] = 5;
	assert_int_equal(ctrl_pd_msg_parse(x, (size_t)n, &m, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "5 blocks need"));
	memcpy(x, b, (size_t)n);
	x[35] = 0xff;
	assert_int_equal(ctrl_pd_msg_parse(x, (size_t)n, &m, err, sizeof(err)), -EBADMSG);
	memcpy(x, b, (size_t)n);
	memset(x + 32, 0, 4);
	assert_int_equal(ctrl_pd_msg_parse(x, (size_t)n, &m, err, sizeof(err)), -EBADMSG);
	/* a reason longer than the message */
	n = ctrl_pd_encode_status(b, sizeof(b), 9, 3, 0, 1, -1, 0, "why");
	memcpy(x, b, (size_t)n);
	x[40] = 200;
	assert_int_equal(ctrl_pd_msg_parse(x, (size_t)n, &m, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "200-byte reason"));
	memcpy(x, b, (size_t)n);
	x[28] = 7;
	assert_int_equal(ctrl_pd_msg_parse(x, (size_t)n, &m, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "failed = 7"));
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

/* A parse that succeeds must describe exactly the bytes: re-encode and compare. */
static void reencodes_to(const struct ctrl_pd_msg *m, const uint8_t *b, size_t len)
{
	uint8_t y[1024];
	char text[CTRL_PD_MAX_TEXT + 1];
	uint32_t blocks[64];
	int n = -1;

	memcpy(text, m->text != NULL ? m->text : "", m->text_len);
	text[m->text_len] = 0;
	if (memchr(text, 0, m->text_len) != NULL)
		return; /* an embedded NUL cannot be re-encoded from a C string */
	switch (m->kind) {
	case CTRL_PD_MANIFEST:
		assert_true(m->n_blocks <= 64);
		for (uint32_t i = 0; i < m->n_blocks; i++)
			blocks[i] = ctrl_pd_msg_block(m, i);
		n = ctrl_pd_encode_manifest(y, sizeof(y), m->room, m->session, m->rank, m->prefix_cached, blocks,
					    m->n_blocks);
		break;
	case CTRL_PD_STATUS: {
		int32_t ids[CTRL_PD_MAX_TOP];
		float lps[CTRL_PD_MAX_TOP];

		for (uint32_t i = 0; i < m->n_top; i++)
			ctrl_pd_msg_top(m, i, &ids[i], &lps[i]);
		n = ctrl_pd_encode_status_top(y, sizeof(y), m->room, m->session, m->rank, m->failed, m->first_token,
					      m->cached_tokens, text, m->first_logprob, m->n_top, ids, lps);
		break;
	}
	case CTRL_PD_ABORT:
		n = ctrl_pd_encode_abort(y, sizeof(y), m->room, m->session, m->rank, text);
		break;
	case CTRL_PD_ABORT_ACK:
		n = ctrl_pd_encode_abort_ack(y, sizeof(y), m->room, m->session, m->rank);
		break;
	}
	assert_int_equal(n, (int)len);
	assert_memory_equal(y, b, len);
}

static void random_and_flipped_buffers_never_read_past_their_end(void **state)
{
	const uint32_t blocks[5] = { 10, 11, 12, 13, 14 };
	uint8_t valid[4][400];
	int vn[4];
	struct ctrl_pd_msg m;
	long ok = 0;

	(void)state;
	vn[0] = ctrl_pd_encode_manifest(valid[0], 400, 77, 5, 1, 3, blocks, 5);
	vn[1] = ctrl_pd_encode_status(valid[1], 400, 77, 5, 1, 0, 99, 0, "fine");
	vn[2] = ctrl_pd_encode_abort(valid[2], 400, 77, 5, 1, "stop");
	vn[3] = ctrl_pd_encode_abort_ack(valid[3], 400, 77, 5, 1);
	for (int it = 0; it < 200000; it++) {
		/* each buffer is malloc'd at its exact length: a read past it is an ASan error */
		size_t len;
		uint8_t *b;

		if (it & 1) {
			int k = (int)(next() % 4);

			len = (size_t)vn[k];
			b = malloc(len);
			memcpy(b, valid[k], len);
			for (int f = 1 + (int)(next() % 3); f > 0; f--)
				b[next() % len] ^= (uint8_t)(1u << (next() % 8));
		} else {
			len = next() % 96;
			b = malloc(len ? len : 1);
			for (size_t i = 0; i < len; i++)
				b[i] = (uint8_t)next();
			if (len >= 8 && (it & 2)) { /* a plausible header, to reach the bodies */
				memcpy(b, valid[next() % 4], 8);
			}
		}
		if (ctrl_pd_msg_parse(b, len, &m, NULL, 0) == 0) {
			reencodes_to(&m, b, len);
			ok++;
		}
		free(b);
	}
	print_message("parsed %ld of 200000 random or flipped buffers, each re-encoding to its bytes\n", ok);
}

static void a_status_lands_in_its_room_and_a_bad_one_changes_nothing(void **state)
{
	struct ctrl_rooms_opts ro;
	struct ctrl_rooms *r;
	struct ctrl_pd_msg_stats st;
	enum ctrl_room_state rs;
	int32_t first;
	const char *why;
	uint8_t b[512];
	int n;

	(void)state;
	memset(&st, 0, sizeof(st));
	ctrl_rooms_opts_init(&ro);
	ro.vocab_size = 1000;
	r = ctrl_rooms_create(&ro);
	assert_int_equal(ctrl_room_open(r, 1, 0, 2, 0), 0); /* two ranks */
	assert_int_equal(ctrl_room_bootstrapped(r, 1), 0);
	assert_int_equal(ctrl_room_waiting(r, 1), 0);
	/* malformed: counted, nothing changes */
	n = ctrl_pd_encode_status(b, sizeof(b), 1, 42, 0, 0, 17, 0, NULL);
	assert_int_equal(ctrl_pd_status_apply(r, 42, b, (size_t)n - 1, &st), -EBADMSG);
	/* another registration's session, a manifest, a rank the room does not have */
	assert_int_equal(ctrl_pd_status_apply(r, 43, b, (size_t)n, &st), -EPROTO);
	{
		uint8_t mb[128];
		const uint32_t blk = 3;
		int mn = ctrl_pd_encode_manifest(mb, sizeof(mb), 1, 42, 0, 0, &blk, 1);

		assert_int_equal(ctrl_pd_status_apply(r, 42, mb, (size_t)mn, &st), -EPROTO);
	}
	ctrl_room_get(r, 1, &rs, NULL, NULL);
	assert_int_equal(rs, CTRL_ROOM_WAITING);
	/* a rank the room does not wait for fails it, naming the rank */
	assert_int_equal(ctrl_room_open(r, 3, 0, 2, 0), 0);
	assert_int_equal(ctrl_room_bootstrapped(r, 3), 0);
	n = ctrl_pd_encode_status(b, sizeof(b), 3, 42, 5, 0, 17, 0, NULL);
	assert_int_equal(ctrl_pd_status_apply(r, 42, b, (size_t)n, &st), -EINVAL);
	ctrl_room_get(r, 3, &rs, NULL, &why);
	assert_int_equal(rs, CTRL_ROOM_FAILED);
	assert_non_null(strstr(why, "prefill rank 5, which this room does not wait for"));
	/* so does one before the room's route was registered */
	assert_int_equal(ctrl_room_open(r, 4, 0, 1, 0), 0);
	n = ctrl_pd_encode_status(b, sizeof(b), 4, 42, 0, 0, 17, 0, NULL);
	assert_int_equal(ctrl_pd_status_apply(r, 42, b, (size_t)n, &st), -EINVAL);
	ctrl_room_get(r, 4, &rs, NULL, &why);
	assert_int_equal(rs, CTRL_ROOM_FAILED);
	assert_non_null(strstr(why, "before the room's route was registered"));
	/* rank 0 carries the first token, rank 1 none: Success with rank 0's token */
	n = ctrl_pd_encode_status(b, sizeof(b), 1, 42, 1, 0, -1, 0, NULL);
	assert_int_equal(ctrl_pd_status_apply(r, 42, b, (size_t)n, &st), 0);
	n = ctrl_pd_encode_status(b, sizeof(b), 1, 42, 0, 0, 17, 0, NULL);
	assert_int_equal(ctrl_pd_status_apply(r, 42, b, (size_t)n, &st), 0);
	ctrl_room_get(r, 1, &rs, &first, NULL);
	assert_int_equal(rs, CTRL_ROOM_SUCCESS);
	assert_int_equal(first, 17);
	/* a forgotten room is not brought back by a late status */
	assert_int_equal(ctrl_room_forget(r, 1), 0);
	assert_int_equal(ctrl_pd_status_apply(r, 42, b, (size_t)n, &st), -ENOENT);
	assert_int_equal(ctrl_room_get(r, 1, &rs, NULL, NULL), -ENOENT);
	/* a rank that failed fails its room with the rank's reason */
	assert_int_equal(ctrl_room_open(r, 2, 0, 1, 0), 0);
	assert_int_equal(ctrl_room_bootstrapped(r, 2), 0);
	n = ctrl_pd_encode_status(b, sizeof(b), 2, 42, 0, 1, -1, 0, "out of KV blocks");
	assert_int_equal(ctrl_pd_status_apply(r, 42, b, (size_t)n, &st), 0);
	ctrl_room_get(r, 2, &rs, NULL, &why);
	assert_int_equal(rs, CTRL_ROOM_FAILED);
	assert_non_null(strstr(why, "prefill rank 0 could not write the request's KV pages: out of KV blocks"));
	assert_int_equal(ctrl_pd_status_apply(r, 42, b, (size_t)n, &st), -ENOENT); /* finished: stale */
	assert_int_equal((int)st.applied, 3);
	assert_int_equal((int)st.malformed, 1);
	assert_int_equal((int)st.wrong_session, 1);
	assert_int_equal((int)st.wrong_kind, 1);
	assert_int_equal((int)st.bad_rank, 2);
	assert_int_equal((int)st.stale_room, 2);
	ctrl_rooms_destroy(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(every_kind_round_trips),
		cmocka_unit_test(truncated_extended_and_lying_messages_are_refused_by_name),
		cmocka_unit_test(random_and_flipped_buffers_never_read_past_their_end),
		cmocka_unit_test(a_status_lands_in_its_room_and_a_bad_one_changes_nothing),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
