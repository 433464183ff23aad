/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What operators see of a ctrld's PD service: the "pd" object of /stats
 * (rooms by state, counters, the prefill nodes' health) and the admin
 * commands /pd/rooms, /pd/release and /pd/restore (ctrlctl rooms, pd
 * release, pd restore). Each reads the service under its lock.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <jansson.h>

#include "ctrl_admin.h"
#include "kvf_clock.h"
#include "pd_serve_int.h"

static void count_state(void *arg, const struct ctrl_pd_room_view *v)
{
	int64_t *n = arg;

	if (v->state <= CTRL_ROOM_FAILED)
		n[v->state]++;
}

json_t *pd_serve_stats(void *ctx)
{
	struct ctrl_pd_serve *s = ctx;
	json_t *j = s->o.base.stats != NULL ? s->o.base.stats(s->o.base.ctx) : NULL, *pd;
	struct ctrl_pd_link_stats ls;

	if (j == NULL)
		j = json_object();
	pthread_mutex_lock(&s->mu);
	ctrl_pd_link_stats(s->link, &ls);
	if (s->pre != NULL) {
		struct ctrl_pd_prefill_stats ps;

		ctrl_pd_prefill_stats(s->pre, &ps);
		pd = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "role", "prefill",
			       "rooms_expired_total", (json_int_t)ps.expired, "refused_aborted_total",
			       (json_int_t)ps.refused_aborted,
			       "rooms_done_total", (json_int_t)ps.rooms_done, "rooms_failed_total", (json_int_t)ps.rooms_failed,
			       "aborts_total", (json_int_t)ps.aborts, "kv_blocks_shipped_total", (json_int_t)ps.pages_shipped,
			       "kv_messages_sent_total", (json_int_t)ls.kv_sent, "kv_bytes_sent_total",
			       (json_int_t)ls.kv_bytes_sent, "malformed_total", (json_int_t)ps.malformed);
		/* rooms failed because their KV's stages re-formed before all of it went */
		json_object_set_new(pd, "rooms_kv_gone_total", json_integer((json_int_t)ps.kv_gone));
		json_object_set_new(pd, "rooms_orphaned_total", json_integer((json_int_t)ps.orphaned));
		/* a successful room's prompt: its prefill, then its last pages until the status */
		json_object_set_new(pd, "rooms_timed_total", json_integer((json_int_t)ps.timed_rooms));
		json_object_set_new(pd, "prefill_seconds_mean", json_real(ps.timed_rooms ? (double)ps.prefill_ns / 1e9 /
									    (double)ps.timed_rooms : 0.0));
		json_object_set_new(pd, "finish_to_status_seconds_mean",
				    json_real(ps.timed_rooms ? (double)ps.tail_ns / 1e9 / (double)ps.timed_rooms : 0.0));
		/* where the pages' time went: the stages copying them out, waits for buffers and lane slots */
		json_object_set_new(pd, "kv_export_seconds_total", json_real((double)ls.export_ns / 1e9));
		json_object_set_new(pd, "kv_buffer_wait_seconds_total", json_real((double)ls.buf_wait_ns / 1e9));
		json_object_set_new(pd, "kv_lane_wait_seconds_total", json_real((double)ls.lane_wait_ns / 1e9));
	} else {
		struct ctrl_pd_decode_stats ds;
		json_t *nodes = json_array();

		ctrl_pd_decode_stats(s->dec, &ds);
		for (int32_t i = 0; i < ctrl_pd_peers_count(s->peers); i++) {
			int healthy = 0;
			int32_t fails = 0, rooms = 0;

			ctrl_pd_peer_state(s->peers, i, &healthy, &fails, &rooms);
			json_array_append_new(nodes, json_pack("{s:s, s:b, s:i, s:i, s:b, s:b}", "address",
							       ctrl_pd_peer_addr(s->peers, i), "healthy", healthy,
							       "heartbeat_misses", fails, "rooms_in_flight", rooms,
							       "dataplane_silent", i < CTRL_PD_MAX_PEERS && s->peer_silent[i],
							       "dataplane_gone", i < CTRL_PD_MAX_PEERS && s->peer_gone[i]));
		}
		int64_t by_state[CTRL_ROOM_FAILED + 1] = { 0 };
		json_t *states = json_object();

		ctrl_pd_decode_rooms(s->dec, count_state, by_state);
		for (int k = 0; k <= CTRL_ROOM_FAILED; k++)
			json_object_set_new(states, ctrl_room_state_name((enum ctrl_room_state)k), json_integer(by_state[k]));
		pd = json_pack("{s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "role", "decode",
			       "rooms", states, "prefill_nodes_lost_total", (json_int_t)s->nodes_lost,
			       "rooms_opened_total", (json_int_t)ds.rooms_opened, "rooms_ok_total", (json_int_t)ds.rooms_ok,
			       "rooms_failed_total", (json_int_t)ds.rooms_failed, "aborts_sent_total",
			       (json_int_t)ds.aborts_sent, "kv_messages_received_total", (json_int_t)ls.kv_received,
			       "kv_bytes_received_total", (json_int_t)ls.kv_bytes_received, "kv_refused_total",
			       (json_int_t)ls.kv_refused, "forward_failures_total", (json_int_t)s->forward_failures,
			       "prefill_nodes", nodes);
		json_object_set_new(pd, "rooms_lost_dataplane_total", json_integer((json_int_t)ds.rooms_lost_dataplane));
		json_object_set_new(pd, "rooms_retried_total", json_integer((json_int_t)ds.rooms_retried));
		json_object_set_new(pd, "prefill_dataplane_silences_total", json_integer((json_int_t)s->peer_silences));
		json_object_set_new(pd, "requests_replayed_here_total", json_integer((json_int_t)ds.replayed_here));
		json_object_set_new(pd, "rooms_pages_lost_total", json_integer((json_int_t)ds.pages_lost));
		json_object_set_new(pd, "requests_computed_here_total", json_integer((json_int_t)ds.computed_here));
		json_object_set_new(pd, "kv_lost_stages_down_total", json_integer((json_int_t)ls.kv_lost_down));
		json_object_set_new(pd, "kv_rx_stale_total", json_integer((json_int_t)ls.rx_stale));
		/* each landed room's pages from its first message to its last */
		json_object_set_new(pd, "kv_rooms_timed_total", json_integer((json_int_t)ds.xfer_rooms));
		json_object_set_new(pd, "kv_room_bytes_total", json_integer((json_int_t)ds.xfer_bytes));
		json_object_set_new(pd, "kv_room_seconds_total", json_real((double)ds.xfer_ns / 1e9));
		/* where a landed room's time went, from its submission */
		json_t *ph = json_object();

		for (int k = 0; k < CTRL_PD_PHASES; k++)
			json_object_set_new(ph, ctrl_pd_phase_names[k],
					    json_real(ds.phase_rooms ? (double)ds.phase_ns[k] / 1e9 / (double)ds.phase_rooms
							   : 0.0));
		json_object_set_new(pd, "room_phase_seconds_mean", ph);
		json_object_set_new(pd, "kv_import_seconds_total", json_real((double)ls.import_ns / 1e9));
		/* page messages the stages took from the dataplane themselves ([pd] worker_rx) */
		json_object_set_new(pd, "kv_landed_by_stages_total", json_integer((json_int_t)ls.kv_landed_by_stages));
		json_object_set_new(pd, "kv_landed_in_place_total", json_integer((json_int_t)ls.kv_landed_in_place));
		json_object_set_new(pd, "stages_take_pages", json_boolean(s->rx_on));
		json_object_set_new(pd, "rooms_gate_full_total", json_integer((json_int_t)ls.rooms_gate_full));
		json_object_set_new(pd, "rooms_phased_total", json_integer((json_int_t)ds.phase_rooms));
	}
	if (pd != NULL) {
		json_object_set_new(pd, "control_sent_total", json_integer((json_int_t)ls.ctl_sent));
		json_object_set_new(pd, "control_received_total", json_integer((json_int_t)ls.ctl_received));
		json_object_set_new(pd, "kv_send_failures_total", json_integer((json_int_t)ls.kv_failed));
		json_object_set_new(pd, "dataplane_deaths_total", json_integer((json_int_t)s->dp_deaths));
	}
	pthread_mutex_unlock(&s->mu);
	json_object_set_new(j, "pd", pd != NULL ? pd : json_object());
	return j;
}

struct rooms_acc {
	struct ctrl_pd_serve *s;
	json_t *rows;
	int n;
};

static void decode_row(void *arg, const struct ctrl_pd_room_view *v)
{
	struct rooms_acc *a = arg;
	const char *peer = ctrl_pd_peer_addr(a->s->peers, (int32_t)v->node);

	json_array_append_new(a->rows, json_pack("{s:I, s:I, s:s, s:s, s:f, s:i, s:I, s:b}", "room",
						 (json_int_t)v->room, "request", (json_int_t)v->id, "prefill_node",
						 peer != NULL ? peer : "?", "state", ctrl_room_state_name(v->state),
						 "age_s", v->age_s, "streams_left", v->streams_left, "bytes_landed",
						 (json_int_t)v->bytes_landed, "told", v->told));
}

static void prefill_row(void *arg, const struct ctrl_pd_prefill_view *v)
{
	struct rooms_acc *a = arg;

	json_array_append_new(a->rows, json_pack("{s:I, s:I, s:i, s:s, s:i}", "room", (json_int_t)v->room, "request",
						 (json_int_t)v->id, "decode_node", (int)v->node, "state",
						 !v->have_manifest ? (v->prefilled ? "KV held, waiting for the manifest"
										   : "prefilling, no manifest yet")
								   : "prefilling, manifest in",
						 "blocks_held", v->blocks));
}

static int cmd_rooms(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	struct rooms_acc a = { .s = arg, .rows = json_array() };

	(void)cmd;
	(void)params;
	if (a.rows == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	pthread_mutex_lock(&a.s->mu);
	if (a.s->dec != NULL)
		ctrl_pd_decode_rooms(a.s->dec, decode_row, &a);
	else
		ctrl_pd_prefill_rooms(a.s->pre, prefill_row, &a);
	pthread_mutex_unlock(&a.s->mu);
	*data = a.rows;
	return 0;
}

static void list_room(void *arg, const struct ctrl_pd_room_view *v)
{
	struct rooms_acc *a = arg;

	if (json_array_size(a->rows) < 8)
		json_array_append_new(a->rows, json_integer((json_int_t)v->room));
	a->n++;
}

/* ctrlctl pd release: refused while any room can still land (its pages
 * would write blocks of a session about to be forgotten). */
static int cmd_release(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	struct rooms_acc a = { .s = arg, .rows = json_array() };
	struct ctrl_pd_serve *s = arg;
	int rc = 0;

	(void)cmd;
	(void)params;
	if (s->dec == NULL) {
		json_decref(a.rows);
		snprintf(err, errlen, "pd release is a decode node's command: this node is a prefill node");
		return -EINVAL;
	}
	pthread_mutex_lock(&s->mu);
	ctrl_pd_decode_rooms(s->dec, list_room, &a);
	if (a.n > 0) {
		char *ids = json_dumps(a.rows, JSON_COMPACT);

		snprintf(err, errlen, "refused: %d room(s) can still land: %s%s; wait for them (ctrlctl rooms), or "
			 "ctrlctl drain first", a.n, ids != NULL ? ids : "?", a.n > 8 ? " ..." : "");
		free(ids);
		rc = -EBUSY;
	} else {
		s->released = 1;
	}
	pthread_mutex_unlock(&s->mu);
	json_decref(a.rows);
	if (rc == 0)
		*data = json_pack("{s:b, s:I}", "released", 1, "session", (json_int_t)s->session);
	return rc;
}

/* ctrlctl pd restore: a fresh session id; every prefill node's route is
 * fetched and checked again before its next room. */
static int cmd_restore(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	struct ctrl_pd_serve *s = arg;
	uint32_t old = s->session, fresh;
	int rc;

	(void)cmd;
	(void)params;
	if (s->dec == NULL) {
		snprintf(err, errlen, "pd restore is a decode node's command: this node is a prefill node");
		return -EINVAL;
	}
	if (getrandom(&fresh, sizeof(fresh), 0) != (ssize_t)sizeof(fresh))
		fresh = (uint32_t)kvf_mono_ns();
	if (fresh == old)
		fresh ^= 1u;
	pthread_mutex_lock(&s->mu);
	rc = ctrl_pd_decode_set_session(s->dec, fresh);
	if (rc == 0) {
		s->session = fresh;
		s->released = 0;
		for (int32_t i = 0; i < ctrl_pd_peers_count(s->peers); i++)
			s->node[i].ready = 0;
	}
	pthread_mutex_unlock(&s->mu);
	if (rc < 0) {
		snprintf(err, errlen, "refused: rooms are in flight under session %u (ctrlctl rooms)", old);
		return rc;
	}
	*data = json_pack("{s:b, s:I, s:I}", "released", 0, "session", (json_int_t)fresh, "old_session",
			  (json_int_t)old);
	return 0;
}

int ctrl_pd_serve_admin_register(struct ctrl_pd_serve *s, struct ctrl_admin *a)
{
	int rc = ctrl_admin_register(a, "/pd/rooms",
				     s->dec != NULL ? "rooms in flight: prefill node, state, age, page streams still out"
						    : "rooms this prefill node holds: decode node, state, KV blocks held",
				     cmd_rooms, s);

	if (rc == 0 && s->dec != NULL)
		rc = ctrl_admin_register(a, "/pd/release", "stop opening rooms (refused while any can still land)",
					 cmd_release, s);
	if (rc == 0 && s->dec != NULL)
		rc = ctrl_admin_register(a, "/pd/restore", "open rooms again under a fresh session id",
					 cmd_restore, s);
	return rc;
}
