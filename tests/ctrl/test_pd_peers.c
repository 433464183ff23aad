/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The decode side's prefill nodes: [pd] prefill is parsed with errors that
 * name the entry; the heartbeat loses a node after max_failures misses in a
 * row (interval >= 2 s, failures >= 1), and exactly that node's unfinished
 * rooms fail — not those of a node whose address extends its own; the pick
 * takes the healthy node with the fewest rooms in flight.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ctrl_pd.h"

/* A scripted probe: addresses listed in `down` do not answer. */
struct script {
	const char *down[8];
	int probes;
};

static int probe(void *arg, const char *addr, double timeout_s, char *err, size_t errlen)
{
	struct script *s = arg;

	(void)timeout_s;
	s->probes++;
	for (int i = 0; i < 8 && s->down[i]; i++)
		if (strcmp(s->down[i], addr) == 0) {
			snprintf(err, errlen, "connection refused");
			return -EHOSTUNREACH;
		}
	return 0;
}

static struct ctrl_pd_peers *peers(const char *list, struct script *s, double interval, int failures)
{
	struct ctrl_pd_peers_opts o;
	char err[256];
	struct ctrl_pd_peers *p;

	ctrl_pd_peers_opts_init(&o);
	o.interval_s = interval;
	o.max_failures = failures;
	o.probe = probe;
	o.probe_arg = s;
	p = ctrl_pd_peers_create(list, &o, err, sizeof(err));
	if (p == NULL)
		print_message("refused: %s\n", err);
	return p;
}

static void a_bad_list_is_refused_naming_the_entry(void **state)
{
	struct ctrl_pd_peers_opts o;
	struct script s = { { NULL }, 0 };
	char err[256];

	(void)state;
	ctrl_pd_peers_opts_init(&o);
	o.probe = probe;
	o.probe_arg = &s;
	assert_null(ctrl_pd_peers_create("10.0.0.1:8998, 10.0.0.2", &o, err, sizeof(err)));
	assert_non_null(strstr(err, "'10.0.0.2' is not host:port"));
	assert_null(ctrl_pd_peers_create("10.0.0.1:99999", &o, err, sizeof(err)));
	assert_non_null(strstr(err, "1..65535"));
	assert_null(ctrl_pd_peers_create("10.0.0.1:8998,10.0.0.1:8998", &o, err, sizeof(err)));
	assert_non_null(strstr(err, "twice"));
	o.probe = NULL;
	assert_null(ctrl_pd_peers_create("10.0.0.1:8998", &o, err, sizeof(err)));
	o.probe = probe;
	{
		struct ctrl_pd_peers *p = ctrl_pd_peers_create(" 10.0.0.1:8998 , [::1]:8998,h:1", &o, err, sizeof(err));

		assert_non_null(p);
		assert_int_equal(ctrl_pd_peers_count(p), 3);
		assert_string_equal(ctrl_pd_peer_addr(p, 1), "[::1]:8998");
		ctrl_pd_peers_destroy(p);
	}
}

static void losing_a_node_fails_exactly_its_rooms_not_a_longer_address(void **state)
{
	struct script s = { { "10.0.0.1:80" }, 0 };
	struct ctrl_pd_peers *p = peers("10.0.0.1:80, 10.0.0.1:8080", &s, 5, 2);
	struct ctrl_rooms_opts ro;
	struct ctrl_rooms *r;
	enum ctrl_room_state st;
	int healthy;

	(void)state;
	assert_non_null(p);
	ctrl_rooms_opts_init(&ro);
	ro.vocab_size = 100;
	r = ctrl_rooms_create(&ro);
	assert_non_null(r);
	assert_int_equal(ctrl_room_open(r, 1, 0, 1, 0), 0); /* on 10.0.0.1:80 */
	assert_int_equal(ctrl_room_open(r, 2, 1, 1, 0), 0); /* on 10.0.0.1:8080 */
	assert_int_equal(ctrl_room_open(r, 3, 0, 1, 0), 0);
	assert_int_equal(ctrl_room_report(r, 3, 0, 7), 0);
	assert_int_equal(ctrl_room_bootstrapped(r, 3), 0);
	assert_int_equal(ctrl_room_waiting(r, 3), 0); /* finished: Success */
	/* one miss: not lost yet */
	assert_int_equal(ctrl_pd_peers_tick(p, 0.0, r), 0);
	ctrl_pd_peer_state(p, 0, &healthy, NULL, NULL);
	assert_int_equal(healthy, 1);
	/* before the interval: no probe at all */
	assert_int_equal(ctrl_pd_peers_tick(p, 4.9, r), 0);
	assert_int_equal(s.probes, 2);
	/* the second miss in a row loses it, once */
	assert_int_equal(ctrl_pd_peers_tick(p, 5.0, r), 1);
	assert_int_equal(ctrl_pd_peers_tick(p, 10.0, r), 0);
	ctrl_room_get(r, 1, &st, NULL, NULL);
	assert_int_equal(st, CTRL_ROOM_FAILED);
	ctrl_room_get(r, 2, &st, NULL, NULL);
	assert_int_equal(st, CTRL_ROOM_BOOTSTRAPPING);
	ctrl_room_get(r, 3, &st, NULL, NULL);
	assert_int_equal(st, CTRL_ROOM_SUCCESS);
	ctrl_pd_peer_state(p, 1, &healthy, NULL, NULL);
	assert_int_equal(healthy, 1);
	ctrl_rooms_destroy(r);
	ctrl_pd_peers_destroy(p);
}

static void intervals_and_failures_are_clamped_and_an_answer_resets_the_count(void **state)
{
	struct script s = { { "a:1" }, 0 };
	struct ctrl_pd_peers *p = peers("a:1", &s, 0.5, 0); /* read as 2 s and 1 failure */
	int healthy;

	(void)state;
	assert_non_null(p);
	assert_int_equal(ctrl_pd_peers_tick(p, 0.0, NULL), 1); /* one miss is enough */
	assert_int_equal(ctrl_pd_peers_tick(p, 1.0, NULL), 0);
	assert_int_equal(s.probes, 1);                          /* 2 s apart, not 0.5 */
	s.down[0] = NULL;                                       /* it answers again */
	assert_int_equal(ctrl_pd_peers_tick(p, 2.0, NULL), 0);
	ctrl_pd_peer_state(p, 0, &healthy, NULL, NULL);
	assert_int_equal(healthy, 1);
	ctrl_pd_peers_destroy(p);

	/* max 2: miss, answer, miss is not two in a row */
	s = (struct script){ { "a:1" }, 0 };
	p = peers("a:1", &s, 2, 2);
	assert_int_equal(ctrl_pd_peers_tick(p, 0.0, NULL), 0);
	s.down[0] = NULL;
	assert_int_equal(ctrl_pd_peers_tick(p, 2.0, NULL), 0);
	s.down[0] = "a:1";
	assert_int_equal(ctrl_pd_peers_tick(p, 4.0, NULL), 0);
	assert_int_equal(ctrl_pd_peers_tick(p, 6.0, NULL), 1);
	ctrl_pd_peers_destroy(p);
}

/* A node whose prompt connection was refused is lost at once (its rooms
 * fail), the pick skips it, and its next answered heartbeat brings it back. */
static void an_unreachable_node_is_lost_at_once_and_a_heartbeat_brings_it_back(void **state)
{
	struct script s = { { NULL }, 0 };
	struct ctrl_pd_peers *p = peers("10.0.0.1:80, 10.0.0.2:80", &s, 5, 2);
	struct ctrl_rooms_opts ro;
	struct ctrl_rooms *r;
	enum ctrl_room_state st;
	int healthy;
	int32_t failures;

	(void)state;
	assert_non_null(p);
	ctrl_rooms_opts_init(&ro);
	ro.vocab_size = 100;
	r = ctrl_rooms_create(&ro);
	assert_non_null(r);
	assert_int_equal(ctrl_room_open(r, 1, 0, 1, 0), 0);
	assert_int_equal(ctrl_room_open(r, 2, 1, 1, 0), 0);
	assert_int_equal(ctrl_pd_peers_tick(p, 0.0, r), 0); /* both answer */
	assert_int_equal(ctrl_pd_peers_pick(p), 0);
	assert_int_equal(ctrl_pd_peers_unreachable(p, 0, "connection refused", r), 1);
	assert_int_equal(ctrl_pd_peers_unreachable(p, 0, "connection refused", r), 0); /* once */
	assert_int_equal(ctrl_pd_peers_unreachable(p, 7, "x", r), -ENOENT);
	ctrl_pd_peer_state(p, 0, &healthy, &failures, NULL);
	assert_int_equal(healthy, 0);
	assert_int_equal(failures, 2);
	ctrl_room_get(r, 1, &st, NULL, NULL);
	assert_int_equal(st, CTRL_ROOM_FAILED);
	ctrl_room_get(r, 2, &st, NULL, NULL);
	assert_int_equal(st, CTRL_ROOM_BOOTSTRAPPING);
	assert_int_equal(ctrl_pd_peers_pick(p), 1);
	assert_int_equal(ctrl_pd_peers_tick(p, 5.0, r), 0); /* it answers again */
	ctrl_pd_peer_state(p, 0, &healthy, &failures, NULL);
	assert_int_equal(healthy, 1);
	assert_int_equal(failures, 0);
	assert_int_equal(ctrl_pd_peers_pick(p), 0);
	ctrl_rooms_destroy(r);
	ctrl_pd_peers_destroy(p);
}

static void the_pick_is_the_healthy_node_with_the_fewest_rooms(void **state)
{
	struct script s = { { NULL }, 0 };
	struct ctrl_pd_peers *p = peers("a:1,b:1,c:1", &s, 2, 1);

	(void)state;
	assert_int_equal(ctrl_pd_peers_pick(p), 0);
	ctrl_pd_peer_rooms(p, 0, +1);
	assert_int_equal(ctrl_pd_peers_pick(p), 1);
	ctrl_pd_peer_rooms(p, 1, +1);
	ctrl_pd_peer_rooms(p, 2, +1);
	ctrl_pd_peer_rooms(p, 2, +1);
	assert_int_equal(ctrl_pd_peers_pick(p), 0);
	s.down[0] = "a:1";
	s.down[1] = "b:1";
	ctrl_pd_peers_tick(p, 0.0, NULL);
	assert_int_equal(ctrl_pd_peers_pick(p), 2); /* the only healthy one, busiest or not */
	s.down[2] = "c:1";
	ctrl_pd_peers_tick(p, 2.0, NULL);
	assert_int_equal(ctrl_pd_peers_pick(p), -1);
	assert_int_equal(ctrl_pd_peer_rooms(p, 7, +1), -ENOENT);
	ctrl_pd_peers_destroy(p);
}

/* A node whose dataplane has been silent past the rooms' give-up bound
 * answers its heartbeats but gets no new room (each would fail there and
 * leave it holding KV) until its dataplane is heard again. */
static void a_node_whose_dataplane_is_gone_gets_no_new_room_until_heard_again(void **state)
{
	struct script s = { { NULL }, 0 };
	struct ctrl_pd_peers *p = peers("a:1,b:1", &s, 2, 1);

	(void)state;
	assert_int_equal(ctrl_pd_peers_pick(p), 0);
	assert_int_equal(ctrl_pd_peers_dataplane_gone(p, 0, 1), 0);
	assert_int_equal(ctrl_pd_peers_pick(p), 1); /* fewest rooms, but gone */
	assert_int_equal(ctrl_pd_peers_dataplane_gone(p, 1, 1), 0);
	assert_int_equal(ctrl_pd_peers_pick(p), -1);
	ctrl_pd_peers_tick(p, 0.0, NULL);           /* heartbeats answer: still none */
	assert_int_equal(ctrl_pd_peers_pick(p), -1);
	assert_int_equal(ctrl_pd_peers_dataplane_gone(p, 0, 0), 1);
	assert_int_equal(ctrl_pd_peers_pick(p), 0);
	assert_int_equal(ctrl_pd_peers_dataplane_gone(p, 2, 1), -ENOENT);
	ctrl_pd_peers_destroy(p);
}

/* A router names the prefill node by the host in its URL: written as in
 * [pd] prefill, or another name of the same address. */
static void a_routers_bootstrap_host_finds_its_node_by_name_or_by_address(void **state)
{
	struct script s = { { NULL }, 0 };
	struct ctrl_pd_peers *p = peers("10.0.0.1:80,10.0.0.1:8080,127.0.0.1:8998,[::1]:9000", &s, 2, 1);

	(void)state;
	assert_non_null(p);
	assert_int_equal(ctrl_pd_peers_find_host(p, "10.0.0.1", 8080), 1);
	assert_int_equal(ctrl_pd_peers_find_host(p, "10.0.0.1", 80), 0);
	assert_int_equal(ctrl_pd_peers_find_host(p, "10.0.0.1", 0), 0);  /* no port: the first of that host */
	assert_int_equal(ctrl_pd_peers_find_host(p, "10.0.0.1", 8998), -1);
	assert_int_equal(ctrl_pd_peers_find_host(p, "127.0.0.1", 0), 2);
	assert_int_equal(ctrl_pd_peers_find_host(p, "localhost", 8998), 2); /* by address */
	assert_int_equal(ctrl_pd_peers_find_host(p, "[::1]", 9000), 3);
	assert_int_equal(ctrl_pd_peers_find_host(p, "::1", 9000), 3);      /* brackets or not */
	assert_int_equal(ctrl_pd_peers_find_host(p, "10.0.0.2", 0), -1);
	assert_int_equal(ctrl_pd_peers_find_host(p, "", 0), -1);
	assert_int_equal(ctrl_pd_peers_find_host(p, NULL, 0), -1);
	ctrl_pd_peers_destroy(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_bad_list_is_refused_naming_the_entry),
		cmocka_unit_test(losing_a_node_fails_exactly_its_rooms_not_a_longer_address),
		cmocka_unit_test(intervals_and_failures_are_clamped_and_an_answer_resets_the_count),
		cmocka_unit_test(the_pick_is_the_healthy_node_with_the_fewest_rooms),
		cmocka_unit_test(a_node_whose_dataplane_is_gone_gets_no_new_room_until_heard_again),
		cmocka_unit_test(a_routers_bootstrap_host_finds_its_node_by_name_or_by_address),
		cmocka_unit_test(an_unreachable_node_is_lost_at_once_and_a_heartbeat_brings_it_back),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
