/* SPDX-License-Identifier: Apache-2.0 */
/*
 * PD rooms (ctrl_pd.h): each promise of DESIGN.md "PD rooms" as a test, and
 * the table against a plain list under 200,000 random operations.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "ctrl_pd.h"

#define S 1000000000ull

static struct ctrl_rooms *rooms(uint32_t capacity)
{
	struct ctrl_rooms_opts o;
	ctrl_rooms_opts_init(&o);
	o.capacity = capacity;
	o.vocab_size = 1000;
	o.timeout_ns = 10 * S;
	struct ctrl_rooms *r = ctrl_rooms_create(&o);
	assert_non_null(r);
	return r;
}

static enum ctrl_room_state state_of(struct ctrl_rooms *r, uint64_t id)
{
	enum ctrl_room_state s;
	assert_int_equal(ctrl_room_get(r, id, &s, NULL, NULL), 0);
	return s;
}

static void to_waiting(struct ctrl_rooms *r, uint64_t id)
{
	assert_int_equal(ctrl_room_bootstrapped(r, id), 0);
	assert_int_equal(ctrl_room_waiting(r, id), 0);
}

static void a_room_succeeds_only_when_every_rank_reported_and_one_carried_the_token(void **state)
{
	(void)state;
	struct ctrl_rooms *r = rooms(8);
	assert_int_equal(ctrl_room_open(r, 7, 1, 4, 0), 0);
	assert_int_equal(state_of(r, 7), CTRL_ROOM_BOOTSTRAPPING);
	to_waiting(r, 7);
	assert_int_equal(ctrl_room_report(r, 7, 0, -1), 0);
	assert_int_equal(ctrl_room_report(r, 7, 2, 123), 0);
	assert_int_equal(ctrl_room_report(r, 7, 1, -1), 0);
	assert_int_equal(ctrl_room_report(r, 7, 1, -1), 0); /* a duplicate changes nothing */
	assert_int_equal(state_of(r, 7), CTRL_ROOM_WAITING);
	assert_int_equal(ctrl_room_report(r, 7, 3, -1), 0);
	int32_t tok;
	const char *why;
	enum ctrl_room_state s;
	assert_int_equal(ctrl_room_get(r, 7, &s, &tok, &why), 0);
	assert_int_equal(s, CTRL_ROOM_SUCCESS);
	assert_int_equal(tok, 123);
	assert_string_equal(why, "");
	assert_int_equal(ctrl_room_report(r, 7, 4, -1), -EINVAL); /* no rank 4 */
	ctrl_rooms_destroy(r);
}

static void every_rank_without_a_valid_token_fails_the_room(void **state)
{
	(void)state;
	struct ctrl_rooms *r = rooms(8);
	assert_int_equal(ctrl_room_open(r, 1, 0, 2, 0), 0);
	to_waiting(r, 1);
	assert_int_equal(ctrl_room_report(r, 1, 0, 1000), 0); /* outside the vocabulary */
	assert_int_equal(ctrl_room_report(r, 1, 1, -1), 0);
	const char *why;
	enum ctrl_room_state s;
	assert_int_equal(ctrl_room_get(r, 1, &s, NULL, &why), 0);
	assert_int_equal(s, CTRL_ROOM_FAILED);
	assert_non_null(strstr(why, "none carried a valid first token (0..999)"));
	assert_int_equal(ctrl_room_fail(r, 1, "late"), -EALREADY);
	ctrl_rooms_destroy(r);
}

/* A fast prefill node reports before the decode side waits: the room
 * succeeds as it starts waiting, not before. */
static void early_reports_are_kept_until_the_room_waits(void **state)
{
	(void)state;
	struct ctrl_rooms *r = rooms(8);
	assert_int_equal(ctrl_room_open(r, 9, 0, 1, 0), 0);
	assert_int_equal(ctrl_room_report(r, 9, 0, 5), 0);
	assert_int_equal(state_of(r, 9), CTRL_ROOM_BOOTSTRAPPING);
	assert_int_equal(ctrl_room_waiting(r, 9), -EINVAL); /* not bootstrapped yet */
	assert_int_equal(ctrl_room_bootstrapped(r, 9), 0);
	assert_int_equal(ctrl_room_bootstrapped(r, 9), -EINVAL);
	assert_int_equal(state_of(r, 9), CTRL_ROOM_BOOTSTRAPPED);
	assert_int_equal(ctrl_room_waiting(r, 9), 0);
	assert_int_equal(state_of(r, 9), CTRL_ROOM_SUCCESS);
	ctrl_rooms_destroy(r);
}

static void a_forgotten_room_is_never_brought_back_by_a_late_message(void **state)
{
	(void)state;
	struct ctrl_rooms *r = rooms(8);
	assert_int_equal(ctrl_room_open(r, 42, 3, 2, 0), 0);
	assert_int_equal(ctrl_room_forget(r, 42), 0);
	assert_int_equal(ctrl_room_report(r, 42, 0, 7), -ENOENT);
	assert_int_equal(ctrl_room_bootstrapped(r, 42), -ENOENT);
	assert_int_equal(ctrl_room_waiting(r, 42), -ENOENT);
	assert_int_equal(ctrl_room_fail(r, 42, "x"), -ENOENT);
	assert_int_equal(ctrl_room_get(r, 42, NULL, NULL, NULL), -ENOENT);
	assert_int_equal(ctrl_room_forget(r, 42), -ENOENT);
	assert_int_equal(ctrl_room_report(r, 43, 0, 7), -ENOENT); /* never opened */
	assert_int_equal(ctrl_rooms_count(r), 0);
	/* an id is free again after it was forgotten: only open creates */
	assert_int_equal(ctrl_room_open(r, 42, 3, 2, 0), 0);
	assert_int_equal(state_of(r, 42), CTRL_ROOM_BOOTSTRAPPING);
	ctrl_rooms_destroy(r);
}

static void losing_a_prefill_node_fails_exactly_its_unfinished_rooms(void **state)
{
	(void)state;
	struct ctrl_rooms *r = rooms(16);
	for (uint64_t id = 0; id < 6; id++)
		assert_int_equal(ctrl_room_open(r, id, id % 2 ? 2 : 1, 1, 0), 0); /* odd ids on node 2 */
	to_waiting(r, 0);
	assert_int_equal(ctrl_room_report(r, 0, 0, 11), 0); /* node 1, finished */
	assert_int_equal(ctrl_room_bootstrapped(r, 2), 0);  /* node 1, bootstrapped */
	assert_int_equal(ctrl_rooms_node_lost(r, 1), 2);    /* rooms 2 and 4 */
	assert_int_equal(state_of(r, 0), CTRL_ROOM_SUCCESS);
	for (uint64_t id = 2; id <= 4; id += 2) {
		const char *why;
		enum ctrl_room_state s;
		assert_int_equal(ctrl_room_get(r, id, &s, NULL, &why), 0);
		assert_int_equal(s, CTRL_ROOM_FAILED);
		assert_non_null(strstr(why, "prefill node 1 was lost"));
	}
	for (uint64_t id = 1; id < 6; id += 2)
		assert_int_equal(state_of(r, id), CTRL_ROOM_BOOTSTRAPPING);
	assert_int_equal(ctrl_rooms_node_lost(r, 1), 0);
	ctrl_rooms_destroy(r);
}

static void a_room_past_the_timeout_fails_naming_the_setting(void **state)
{
	(void)state;
	struct ctrl_rooms *r = rooms(8);
	assert_int_equal(ctrl_room_open(r, 1, 0, 2, 100 * S), 0);
	assert_int_equal(ctrl_room_open(r, 2, 0, 1, 105 * S), 0);
	assert_int_equal(ctrl_room_open(r, 3, 0, 1, 100 * S), 0);
	to_waiting(r, 1);
	assert_int_equal(ctrl_room_report(r, 1, 0, 4), 0);
	to_waiting(r, 3);
	assert_int_equal(ctrl_room_report(r, 3, 0, 4), 0); /* finished in time */
	assert_int_equal(ctrl_rooms_expire(r, 110 * S), 0); /* exactly the limit */
	assert_int_equal(ctrl_rooms_expire(r, 111 * S), 1);
	const char *why;
	enum ctrl_room_state s;
	assert_int_equal(ctrl_room_get(r, 1, &s, NULL, &why), 0);
	assert_int_equal(s, CTRL_ROOM_FAILED);
	assert_non_null(strstr(why, "WaitingForInput, 1 of 2 prefill ranks reported"));
	assert_non_null(strstr(why, "raise pd_room_timeout (now 10.0 s)"));
	assert_int_equal(state_of(r, 2), CTRL_ROOM_BOOTSTRAPPING);
	assert_int_equal(state_of(r, 3), CTRL_ROOM_SUCCESS);
	assert_int_equal(ctrl_rooms_expire(r, 116 * S), 1);
	/* with the manifest's time, a room that queued long is charged from then */
	assert_int_equal(ctrl_room_open(r, 4, 0, 1, 100 * S), 0);
	assert_int_equal(ctrl_room_bootstrapped(r, 4), 0);
	assert_int_equal(ctrl_room_waiting_since(r, 4, 200 * S), 0);
	assert_int_equal(ctrl_rooms_expire(r, 210 * S), 0);
	assert_int_equal(ctrl_rooms_expire(r, 211 * S), 1);
	assert_int_equal(ctrl_room_get(r, 4, &s, NULL, &why), 0);
	assert_non_null(strstr(why, "after its page manifest went out"));
	assert_int_equal(ctrl_room_waiting_since(r, 99, 0), -ENOENT);
	ctrl_rooms_destroy(r);
}

static void the_table_refuses_what_it_cannot_hold(void **state)
{
	(void)state;
	struct ctrl_rooms_opts o;
	ctrl_rooms_opts_init(&o);
	assert_null(ctrl_rooms_create(&o)); /* vocab_size unset */
	assert_int_equal(errno, EINVAL);
	struct ctrl_rooms *r = rooms(3);
	for (uint64_t id = 10; id < 13; id++)
		assert_int_equal(ctrl_room_open(r, id, 0, 1, 0), 0);
	assert_int_equal(ctrl_room_open(r, 13, 0, 1, 0), -ENOSPC);
	assert_int_equal(ctrl_room_open(r, 10, 0, 1, 0), -EEXIST);
	assert_int_equal(ctrl_room_open(r, 14, 0, 0, 0), -EINVAL);
	assert_int_equal(ctrl_room_open(r, 14, 0, CTRL_ROOM_MAX_RANKS + 1, 0), -EINVAL);
	assert_int_equal(ctrl_room_forget(r, 11), 0);
	assert_int_equal(ctrl_room_open(r, 13, 0, CTRL_ROOM_MAX_RANKS, 0), 0);
	to_waiting(r, 13);
	for (uint32_t k = 0; k < CTRL_ROOM_MAX_RANKS; k++)
		assert_int_equal(ctrl_room_report(r, 13, k, k == 63 ? 9 : -1), 0);
	assert_int_equal(state_of(r, 13), CTRL_ROOM_SUCCESS);
	ctrl_rooms_destroy(r);
}

/* Open, report, forget and look up random ids (many colliding in a small
 * table) against a plain list: every lookup agrees, so deletion never loses
 * or resurrects a room. */
static void the_table_agrees_with_a_plain_list_under_random_churn(void **state)
{
	(void)state;
	enum { CAP = 64, IDS = 200 };
	struct ctrl_rooms *r = rooms(CAP);
	int held[IDS] = { 0 };
	uint32_t n = 0;
	uint64_t x = 12345;
	for (int step = 0; step < 200000; step++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		const uint64_t id = (x >> 33) % IDS * 1000003ull; /* spread, yet often colliding */
		const int i = (int)((x >> 33) % IDS), op = (int)((x >> 20) % 3);
		if (op == 0) {
			const int rc = ctrl_room_open(r, id, 0, 1, 0);
			assert_int_equal(rc, held[i] ? -EEXIST : n >= CAP ? -ENOSPC : 0);
			if (!rc) {
				held[i] = 1;
				n++;
			}
		} else if (op == 1) {
			assert_int_equal(ctrl_room_forget(r, id), held[i] ? 0 : -ENOENT);
			if (held[i]) {
				held[i] = 0;
				n--;
			}
		} else {
			assert_int_equal(ctrl_room_report(r, id, 0, -1), held[i] ? 0 : -ENOENT);
		}
		assert_int_equal(ctrl_rooms_count(r), n);
	}
	for (int i = 0; i < IDS; i++)
		assert_int_equal(ctrl_room_get(r, (uint64_t)i * 1000003ull, NULL, NULL, NULL), held[i] ? 0 : -ENOENT);
	ctrl_rooms_destroy(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_room_succeeds_only_when_every_rank_reported_and_one_carried_the_token),
		cmocka_unit_test(every_rank_without_a_valid_token_fails_the_room),
		cmocka_unit_test(early_reports_are_kept_until_the_room_waits),
		cmocka_unit_test(a_forgotten_room_is_never_brought_back_by_a_late_message),
		cmocka_unit_test(losing_a_prefill_node_fails_exactly_its_unfinished_rooms),
		cmocka_unit_test(a_room_past_the_timeout_fails_naming_the_setting),
		cmocka_unit_test(the_table_refuses_what_it_cannot_hold),
		cmocka_unit_test(the_table_agrees_with_a_plain_list_under_random_churn),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
