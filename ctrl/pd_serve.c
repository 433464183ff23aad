/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A ctrld's PD service (ctrl_pd_serve.h): the prefill end over the node's
 * dataplane link, behind the HTTP backend interface.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctrl_pd_link.h"
#include "ctrl_pd_serve.h"
#include "ctrl_pd_xfer.h"

struct ctrl_pd_serve {
	struct ctrl_pd_serve_opts o;
	pthread_mutex_t mu;
	struct ctrl_pd_link *link;
	struct ctrl_pd_prefill *pre;
	struct ctrl_pd_link_handlers h;
	pthread_t th;
	int started;
	atomic_int stop;
};

static int send_ctl(void *arg, uint32_t node, const uint8_t *m, size_t len)
{
	struct ctrl_pd_serve *s = arg;

	return ctrl_pd_link_send_ctl(s->link, node, m, len);
}

static int ship(void *arg, uint32_t node, uint64_t room, uint32_t session, const int32_t *src, const uint32_t *dst,
		int32_t n, char *err, size_t errlen)
{
	struct ctrl_pd_serve *s = arg;

	return ctrl_pd_link_ship(s->link, s->o.chain, s->o.n_stages, node, room, session, src, dst, n, err, errlen);
}

static void on_control(void *arg, uint32_t node, const uint8_t *m, size_t len)
{
	struct ctrl_pd_serve *s = arg;

	ctrl_pd_prefill_on_control(s->pre, node, m, len);
}

static void *poller(void *arg)
{
	struct ctrl_pd_serve *s = arg;

	while (!atomic_load(&s->stop)) {
		int moved;

		pthread_mutex_lock(&s->mu);
		moved = ctrl_pd_link_poll(s->link, &s->h);
		pthread_mutex_unlock(&s->mu);
		if (!moved)
			usleep(50);
	}
	return NULL;
}

struct ctrl_pd_serve *ctrl_pd_serve_start(const struct ctrl_pd_serve_opts *o, char *err, size_t errlen)
{
	struct ctrl_pd_serve *s = calloc(1, sizeof(*s));
	struct ctrl_pd_link_opts lo;
	struct ctrl_pd_prefill_opts po = { 0 };
	struct kn_kv_format f;

	if (s == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	s->o = *o;
	pthread_mutex_init(&s->mu, NULL);
	if (ctrl_chain_kv_format(o->chain, 0, &f) == -ENOTSUP)
		fprintf(stderr, "kvferry-ctrld: the stages run in worker processes: disaggregated requests will "
			"fail their rooms (KV pages from workers are not available yet)\n");
	ctrl_pd_link_opts_init(&lo);
	lo.region = o->region;
	s->link = ctrl_pd_link_open(&lo, err, errlen);
	if (s->link == NULL)
		goto fail;
	po.sched = o->sched;
	po.rank = o->rank;
	po.send = send_ctl;
	po.send_arg = s;
	po.ship = ship;
	po.ship_arg = s;
	po.lock = &s->mu;
	s->pre = ctrl_pd_prefill_create(&po);
	if (s->pre == NULL) {
		snprintf(err, errlen, "ctrl_pd_prefill_create: %s", strerror(errno));
		goto fail;
	}
	s->h = (struct ctrl_pd_link_handlers){ .control = on_control, .arg = s };
	if (pthread_create(&s->th, NULL, poller, s) != 0) {
		snprintf(err, errlen, "pthread_create(pd poller) failed");
		goto fail;
	}
	s->started = 1;
	return s;
fail:
	ctrl_pd_serve_stop(s);
	return NULL;
}

static int64_t be_submit(void *ctx, const struct ctrl_request *r)
{
	struct ctrl_pd_serve *s = ctx;

	return s->o.base.submit(s->o.base.ctx, r);
}

static int64_t be_submit_pd(void *ctx, const struct ctrl_request *r, const struct ctrl_http_pd *pd)
{
	struct ctrl_pd_serve *s = ctx;
	int64_t id;

	pthread_mutex_lock(&s->mu);
	id = ctrl_pd_prefill_submit(s->pre, r, pd->room, 0);
	pthread_mutex_unlock(&s->mu);
	return id == -EEXIST ? -EINVAL : id;
}

static int be_cancel(void *ctx, uint64_t id)
{
	struct ctrl_pd_serve *s = ctx;

	/* ids are the one scheduler's (replica 0, tag 0) for both kinds */
	return s->o.base.cancel(s->o.base.ctx, id);
}

static json_t *be_stats(void *ctx)
{
	struct ctrl_pd_serve *s = ctx;
	json_t *j = s->o.base.stats != NULL ? s->o.base.stats(s->o.base.ctx) : NULL;
	struct ctrl_pd_prefill_stats ps;
	struct ctrl_pd_link_stats ls;

	if (j == NULL)
		j = json_object();
	pthread_mutex_lock(&s->mu);
	ctrl_pd_prefill_stats(s->pre, &ps);
	ctrl_pd_link_stats(s->link, &ls);
	pthread_mutex_unlock(&s->mu);
	json_object_set_new(j, "pd", json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
		"role", "prefill", "rooms_done_total", (json_int_t)ps.rooms_done,
		"rooms_failed_total", (json_int_t)ps.rooms_failed, "aborts_total", (json_int_t)ps.aborts,
		"kv_blocks_shipped_total", (json_int_t)ps.pages_shipped,
		"kv_messages_sent_total", (json_int_t)ls.kv_sent, "kv_bytes_sent_total", (json_int_t)ls.kv_bytes_sent,
		"kv_send_failures_total", (json_int_t)ls.kv_failed, "control_sent_total", (json_int_t)ls.ctl_sent,
		"control_received_total", (json_int_t)ls.ctl_received,
		"malformed_total", (json_int_t)ps.malformed));
	return j;
}

void ctrl_pd_serve_backend(struct ctrl_pd_serve *s, struct ctrl_http_backend *be)
{
	be->submit = be_submit;
	be->submit_pd = be_submit_pd;
	be->cancel = be_cancel;
	be->stats = be_stats;
	be->ctx = s;
}

int32_t ctrl_pd_serve_node(const struct ctrl_pd_serve *s)
{
	return s != NULL ? ctrl_pd_link_self_node(s->link) : -1;
}

void ctrl_pd_serve_stop(struct ctrl_pd_serve *s)
{
	if (s == NULL)
		return;
	if (s->started) {
		atomic_store(&s->stop, 1);
		pthread_join(s->th, NULL);
	}
	ctrl_pd_prefill_destroy(s->pre);
	ctrl_pd_link_close(s->link);
	pthread_mutex_destroy(&s->mu);
	free(s);
}
