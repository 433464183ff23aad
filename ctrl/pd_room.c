/* SPDX-License-Identifier: Apache-2.0 */
/*
 * PD rooms (ctrl_pd.h): a fixed-size open-addressing table keyed by room id,
 * linear probing with backward-shift deletion (no tombstones, so a
 * forgotten id leaves nothing a late message could find). A hash table of
 * our own because the set is small, fixed and hot, and the promise "only
 * open creates" is easiest to keep where every path is visible.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_pd.h"

#define WHY_LEN 200

struct room {
	uint64_t id;
	uint64_t opened_ns;   /* when the timeout began: the open, or the manifest */
	uint8_t since_manifest;
	uint64_t reported;    /* bit per rank */
	uint32_t node, n_ranks;
	int32_t first_token;  /* first valid token reported, else -1 */
	uint8_t used;
	uint8_t state;        /* enum ctrl_room_state */
	char why[WHY_LEN];
};

struct ctrl_rooms {
	struct ctrl_rooms_opts o;
	char knob[64];
	uint32_t mask;        /* table size - 1 (a power of two >= 2 x capacity) */
	uint32_t count;
	struct room *t;
};

void ctrl_rooms_opts_init(struct ctrl_rooms_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->capacity = 4096;
	o->timeout_ns = 30ull * 1000000000ull;
	o->timeout_knob = "pd_room_timeout";
}

static const char *state_name(uint8_t s)
{
	static const char *const n[] = { "Bootstrapping", "Bootstrapped", "WaitingForInput", "Success", "Failed" };
	return s <= CTRL_ROOM_FAILED ? n[s] : "?";
}

const char *ctrl_room_state_name(enum ctrl_room_state s)
{
	return state_name((uint8_t)s);
}

static uint32_t home(const struct ctrl_rooms *r, uint64_t id)
{
	return (uint32_t)((id * 0x9e3779b97f4a7c15ull) >> 32) & r->mask;
}

static struct room *find(const struct ctrl_rooms *r, uint64_t id)
{
	for (uint32_t i = home(r, id);; i = (i + 1) & r->mask) {
		struct room *x = &r->t[i];
		if (!x->used)
			return NULL;
		if (x->id == id)
			return x;
	}
}

struct ctrl_rooms *ctrl_rooms_create(const struct ctrl_rooms_opts *o)
{
	if (!o || o->capacity == 0 || o->capacity > (1u << 28) || o->vocab_size < 1 || o->timeout_ns == 0) {
		errno = EINVAL;
		return NULL;
	}
	struct ctrl_rooms *r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	uint32_t size = 2;
	while (size < 2 * o->capacity)
		size <<= 1;
	r->t = calloc(size, sizeof(*r->t));
	if (!r->t) {
		free(r);
		errno = ENOMEM;
		return NULL;
	}
	r->o = *o;
	snprintf(r->knob, sizeof(r->knob), "%s", o->timeout_knob ? o->timeout_knob : "the room timeout");
	r->o.timeout_knob = r->knob;
	r->mask = size - 1;
	return r;
}

void ctrl_rooms_destroy(struct ctrl_rooms *r)
{
	if (!r)
		return;
	free(r->t);
	free(r);
}

int ctrl_room_open(struct ctrl_rooms *r, uint64_t id, uint32_t node, uint32_t n_ranks, uint64_t now_ns)
{
	if (n_ranks < 1 || n_ranks > CTRL_ROOM_MAX_RANKS)
		return -EINVAL;
	if (find(r, id))
		return -EEXIST;
	if (r->count >= r->o.capacity)
		return -ENOSPC;
	uint32_t i = home(r, id);
	while (r->t[i].used)
		i = (i + 1) & r->mask;
	struct room *x = &r->t[i];
	memset(x, 0, sizeof(*x));
	x->used = 1;
	x->id = id;
	x->node = node;
	x->n_ranks = n_ranks;
	x->opened_ns = now_ns;
	x->first_token = -1;
	x->state = CTRL_ROOM_BOOTSTRAPPING;
	r->count++;
	return 0;
}

static bool finished(const struct room *x)
{
	return x->state == CTRL_ROOM_SUCCESS || x->state == CTRL_ROOM_FAILED;
}

static uint32_t n_reported(const struct room *x)
{
	return (uint32_t)__builtin_popcountll(x->reported);
}

static void fail(struct room *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct room *x, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(x->why, sizeof(x->why), fmt, ap);
	va_end(ap);
	x->state = CTRL_ROOM_FAILED;
}

/* A waiting room whose every rank has reported is finished. */
static void settle(const struct ctrl_rooms *r, struct room *x)
{
	if (x->state != CTRL_ROOM_WAITING || n_reported(x) < x->n_ranks)
		return;
	if (x->first_token >= 0) {
		x->state = CTRL_ROOM_SUCCESS;
		return;
	}
	fail(x, "all %u prefill ranks reported and none carried a valid first token (0..%d)", x->n_ranks,
	     r->o.vocab_size - 1);
}

int ctrl_room_bootstrapped(struct ctrl_rooms *r, uint64_t id)
{
	struct room *x = find(r, id);
	if (!x)
		return -ENOENT;
	if (x->state != CTRL_ROOM_BOOTSTRAPPING)
		return -EINVAL;
	x->state = CTRL_ROOM_BOOTSTRAPPED;
	return 0;
}

int ctrl_room_waiting(struct ctrl_rooms *r, uint64_t id)
{
	struct room *x = find(r, id);
	if (!x)
		return -ENOENT;
	if (x->state != CTRL_ROOM_BOOTSTRAPPED)
		return -EINVAL;
	x->state = CTRL_ROOM_WAITING;
	settle(r, x);
	return 0;
}

int ctrl_room_waiting_since(struct ctrl_rooms *r, uint64_t id, uint64_t now_ns)
{
	struct room *x = find(r, id);
	int rc;

	if (x == NULL)
		return -ENOENT;
	rc = ctrl_room_waiting(r, id);
	if (rc == 0) {
		x->opened_ns = now_ns;
		x->since_manifest = 1;
	}
	return rc;
}

int ctrl_room_report(struct ctrl_rooms *r, uint64_t id, uint32_t rank, int32_t first_token)
{
	struct room *x = find(r, id);
	if (!x)
		return -ENOENT;
	if (rank >= x->n_ranks)
		return -EINVAL;
	if (finished(x) || (x->reported >> rank & 1))
		return 0;
	x->reported |= 1ull << rank;
	if (x->first_token < 0 && first_token >= 0 && first_token < r->o.vocab_size)
		x->first_token = first_token;
	settle(r, x);
	return 0;
}

int ctrl_room_fail(struct ctrl_rooms *r, uint64_t id, const char *why)
{
	struct room *x = find(r, id);
	if (!x)
		return -ENOENT;
	if (finished(x))
		return -EALREADY;
	fail(x, "%s", why ? why : "failed");
	return 0;
}

int ctrl_rooms_node_lost(struct ctrl_rooms *r, uint32_t node)
{
	int n = 0;
	for (uint32_t i = 0; i <= r->mask; i++) {
		struct room *x = &r->t[i];
		if (!x->used || finished(x) || x->node != node)
			continue;
		fail(x, "prefill node %u was lost while the room was %s (%u of %u ranks had reported)", node,
		     state_name(x->state), n_reported(x), x->n_ranks);
		n++;
	}
	return n;
}

int ctrl_rooms_expire(struct ctrl_rooms *r, uint64_t now_ns)
{
	int n = 0;
	for (uint32_t i = 0; i <= r->mask; i++) {
		struct room *x = &r->t[i];
		if (!x->used || finished(x) || now_ns - x->opened_ns <= r->o.timeout_ns)
			continue;
		fail(x, "unfinished %.1f s after %s (%s, %u of %u prefill ranks reported); raise %s (now %.1f s) if prefill queues run this long",
		     (double)(now_ns - x->opened_ns) / 1e9, x->since_manifest ? "its page manifest went out" : "it opened",
		     state_name(x->state), n_reported(x), x->n_ranks, r->knob, (double)r->o.timeout_ns / 1e9);
		n++;
	}
	return n;
}

int ctrl_room_get(const struct ctrl_rooms *r, uint64_t id, enum ctrl_room_state *state, int32_t *first_token,
		  const char **why)
{
	const struct room *x = find(r, id);
	if (!x)
		return -ENOENT;
	if (state)
		*state = (enum ctrl_room_state)x->state;
	if (first_token)
		*first_token = x->state == CTRL_ROOM_SUCCESS ? x->first_token : -1;
	if (why)
		*why = x->state == CTRL_ROOM_FAILED ? x->why : "";
	return 0;
}

int ctrl_room_forget(struct ctrl_rooms *r, uint64_t id)
{
	struct room *x = find(r, id);
	if (!x)
		return -ENOENT;
	/* backward-shift deletion: pull later members of the probe run into
	 * the hole when their home does not lie cyclically in (hole, j] */
	uint32_t hole = (uint32_t)(x - r->t);
	for (uint32_t j = (hole + 1) & r->mask; r->t[j].used; j = (j + 1) & r->mask) {
		const uint32_t k = home(r, r->t[j].id);
		const bool stays = hole <= j ? (hole < k && k <= j) : (hole < k || k <= j);
		if (stays)
			continue;
		r->t[hole] = r->t[j];
		hole = j;
	}
	memset(&r->t[hole], 0, sizeof(r->t[hole]));
	r->count--;
	return 0;
}

uint32_t ctrl_rooms_count(const struct ctrl_rooms *r)
{
	return r->count;
}
