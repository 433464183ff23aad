/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tensor parallelism inside a stage: tp_size worker processes, each a CPU
 * stage holding its rank's share of every layer (kn_stage_opts.tp_*).
 *
 * Rank 0, the leader, reads the stage's input hop as any worker does and
 * answers for the stage. Every message it takes it hands on to each other
 * rank, a follower, on a ring of its own (<in>.tp.f<r>), then handles it
 * itself; followers handle the same messages in the same order and never
 * send. A join or pool message is answered by each follower in the group's
 * area (<in>.tp): the leader folds a refusal into its own answer before it
 * passes the setup message on. The leader goes on to the next message only
 * once every follower has handled the last one (its "done" count), so no
 * follower reads a message after the group's answer let its producer reuse
 * the buffer.
 *
 * The reduce (wk_tp_reduce, the engine's tp_reduce): each rank copies its
 * partial into its slot of the area, says it arrived, waits for every
 * rank, adds the slots pairwise in rank order ((r0 + r1) + (r2 + r3)) + ...
 * (the order kn_cpu.c needs for the unsharded bits), says it departed and
 * waits for every rank again, so no slot is rewritten while read.
 *
 * A rank that dies takes the group with it: a reduce waiting on a dead rank
 * fails its step, and every rank that sees another of its group gone (the
 * leader its followers, a follower the leader) starts itself again, so the
 * group rejoins whole; ctrld sees the leader go and replays what it lost.
 */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf_clock.h"
#include "shm_live.h"
#include "shm_ring.h"
#include "worker_hop.h"
#include "worker_int.h"
#include "wk_tp_area.h"
#include "wk_kvpage.h"
#include "shm_region.h"

#define WK_TP_WAIT_S 30         /* a rank waited on longer than this: the step fails */

static size_t area_bytes(uint32_t size, uint32_t max_cols, uint32_t ld)
{
	return sizeof(struct wk_tp_area) + (size_t)size * max_cols * ld * sizeof(float);
}

int wk_tp_init(struct worker *w, char *err, size_t errlen)
{
	struct wk_tp *t = &w->tp;
	char name[96];

	t->size = w->o.tp_size > 1 ? w->o.tp_size : 1;
	t->rank = t->size > 1 ? w->o.tp_rank : 0;
	if (t->size == 1)
		return 0;
	snprintf(t->base, sizeof(t->base), "%s", w->o.in + 5); /* wk_load_opts: "ring:NAME" */
	for (int32_t r = 1; t->rank == 0 && r < t->size; r++) {
		snprintf(name, sizeof(name), "%s.tp.f%d", t->base, (int)r);
		if ((t->fq[r] = wk_ring_open(w->reg, name, err, errlen)) == NULL)
			return -EIO;
		snprintf(name, sizeof(name), "%s.tp.k%d", t->base, (int)r);
		if ((t->kq[r] = wk_ring_open(w->reg, name, err, errlen)) == NULL)
			return -EIO;
	}
	if (t->rank > 0) {
		snprintf(name, sizeof(name), "%s.tp.k%d", t->base, (int)t->rank);
		if ((t->kin = wk_ring_open(w->reg, name, err, errlen)) == NULL)
			return -EIO;
	}
	WK_INFO(w, "tensor parallelism: rank %d of %d of the stage fed by %s%s", t->rank, t->size, t->base,
	        t->rank == 0 ? " (it reads the input and answers for the stage)" : "");
	return 0;
}

void wk_tp_close(struct worker *w)
{
	for (int32_t r = 1; r < WK_TP_MAX; r++) {
		shm_ring_close(w->tp.fq[r]);
		shm_ring_close(w->tp.kq[r]);
	}
	shm_ring_close(w->tp.kin);
}

const char *wk_tp_input(struct worker *w, char *buf, size_t n)
{
	if (w->o.tp_size <= 1 || w->o.tp_rank == 0)
		return w->o.in;
	snprintf(buf, n, "%s.tp.f%d", w->o.in, (int)w->o.tp_rank);
	return buf;
}

/* The group's area: the leader makes it (at its first join, when a
 * micro-batch's width is known), a follower finds it. @return 0 or -errno. */
static int area(struct worker *w, uint32_t max_cols, char *err, size_t errlen)
{
	struct wk_tp *t = &w->tp;
	const uint32_t ld = (uint32_t)((kn_model_config(w->m)->hidden_size + 15) / 16 * 16); /* kn_pad() */
	char name[96];
	uint64_t off;
	size_t size;
	int rc;

	snprintf(name, sizeof(name), "%s" WK_TP_AREA_SUFFIX, t->base);
	if (shm_region_find_area(w->reg, name, &off, &size) == 0) {
		struct wk_tp_area *a = shm_ptr(w->reg, off);

		if (a->magic != WK_TP_MAGIC || a->size != (uint32_t)t->size || a->max_cols < max_cols || a->ld < ld
		    || size < area_bytes(a->size, a->max_cols, a->ld)) {
			snprintf(err, errlen, "the group's area %s holds %u ranks of %u x %u floats, not %d of %u x %u: "
				 "the stage's tp_size or micro-batch width changed; start the node on a fresh region",
				 name, a->size, a->max_cols, a->ld, (int)t->size, max_cols, ld);
			return -EINVAL;
		}
		t->a = a;
	} else if (t->rank != 0) {
		snprintf(err, errlen, "no area %s: rank 0 of the stage has not joined", name);
		return -ENOENT;
	} else {
		rc = shm_region_add_area(w->reg, name, area_bytes((uint32_t)t->size, max_cols, ld), 64, SHM_AREA_RAW,
					 &off);
		if (rc < 0) {
			snprintf(err, errlen, "the group's area %s (%zu bytes) does not fit the region %s: %s; make "
				 "the region larger", name, area_bytes((uint32_t)t->size, max_cols, ld), w->o.region,
				 strerror(-rc));
			return rc;
		}
		t->a = shm_ptr(w->reg, off);
		memset(t->a, 0, sizeof(*t->a));
		t->a->size = (uint32_t)t->size;
		t->a->max_cols = max_cols;
		t->a->ld = ld;
		__atomic_store_n(&t->a->magic, WK_TP_MAGIC, __ATOMIC_RELEASE);
	}
	t->slots = (float *)(t->a + 1);
	return 0;
}

int wk_tp_begin(struct worker *w, const struct shm_mb_hdr *h, char *err, size_t errlen)
{
	struct wk_tp *t = &w->tp;
	const struct shm_mb_setup *s = shm_mb_payload((struct shm_mb_hdr *)h);
	int rc;

	if (t->size == 1)
		return 0;
	if (t->a == NULL && (rc = area(w, (uint32_t)s->max_cols, err, errlen)) < 0)
		return rc;
	t->seq = 0;
	if (t->rank != 0)
		return 0;
	/* every rank has finished every reduce (the leader waited for them
	 * before it went on): the counts start again */
	for (int32_t r = 0; r < t->size; r++) {
		atomic_store(&t->a->r[r].arrive, 0);
		atomic_store(&t->a->r[r].depart, 0);
	}
	t->a->leader_pid = (int32_t)getpid();
	t->a->leader_live = w->live;
	atomic_fetch_add(&t->a->gen, 1);
	return 0;
}

static int gone(struct worker *w);

void wk_tp_forward(struct worker *w, const struct shm_desc *d)
{
	struct wk_tp *t = &w->tp;

	for (int32_t r = 1; t->rank == 0 && r < t->size && !t->broken; r++) {
		/* a full ring: its follower is behind, or gone (then the group starts again) */
		for (uint32_t spins = 0; shm_ring_enqueue_burst(t->fq[r], d, 1) != 1 && !g_stop; spins++) {
			sched_yield();
			if (spins % 1024 == 1023 && gone(w)) {
				t->broken = 1;
				break;
			}
		}
	}
	if (t->rank == 0 && t->size > 1)
		t->fwd++;
}

/* The registration epoch of liveness slot @p slot (0: none). */
static uint64_t live_epoch(struct worker *w, int slot)
{
	struct shm_live_info li;

	return shm_live_check(w->reg, slot, UINT64_MAX, &li) > SHM_LIVE_EMPTY ? li.epoch : 0;
}

/* Is the rank of @p pid at liveness slot @p slot gone: dead, or started
 * again in place (execv keeps the pid; the new registration has another
 * epoch than @p epoch, where one was recorded)? A rank that starts again
 * releases its slot and registers anew within milliseconds, so a look that
 * falls outside that window would miss it without the epoch. */
static int rank_gone(struct worker *w, int slot, int32_t pid, uint64_t epoch)
{
	return pid > 0 && (shm_live_gone(w->reg, slot, pid) || (epoch != 0 && live_epoch(w, slot) != epoch));
}

/* Is another rank of the group gone? The leader asks about its followers, a
 * follower about the leader and about the other followers that answered the
 * same join (a follower waiting in a reduce on a dead one must not wait for
 * the leader to notice and start again). */
static int gone(struct worker *w)
{
	struct wk_tp *t = &w->tp;

	if (t->a == NULL)
		return 0;
	if (t->rank != 0) {
		const uint64_t gen = atomic_load(&t->a->gen);

		if (rank_gone(w, t->a->leader_live, t->a->leader_pid, t->leader_epoch))
			return 1;
		for (int32_t r = 1; r < t->size && t->joined_gen == gen; r++) {
			const struct wk_tp_rec *o = &t->a->r[r];

			if (r != t->rank && atomic_load(&o->ack) == gen && rank_gone(w, o->live, o->pid, 0))
				return 1;
		}
		return 0;
	}
	for (int32_t r = 1; r < t->size; r++)
		if (rank_gone(w, t->live[r], t->pid[r], t->epoch[r]))
			return 1;
	return 0;
}

int wk_tp_gone(struct worker *w)
{
	uint64_t now = kvf_mono_ns();

	if (w->tp.size == 1 || now < w->tp.next_check_ns)
		return 0;
	w->tp.next_check_ns = now + 100000000ull;
	return gone(w);
}

/* Wait until every rank's counter at @p field reached @p want. @return 0, -EPIPE (one is gone), -ETIMEDOUT, -EINTR. */
static int wait_all(struct worker *w, size_t field, uint64_t want, const char *what)
{
	struct wk_tp *t = &w->tp;
	uint64_t t0 = 0;

	for (uint32_t spins = 0;; spins++) {
		int32_t r = 0;

		while (r < t->size
		       && atomic_load_explicit((_Atomic uint64_t *)((char *)&t->a->r[r] + field), memory_order_acquire) >= want)
			r++;
		if (r == t->size)
			return 0;
		if (spins % 1024 != 1023)
			continue;
		sched_yield();
		if (t0 == 0)
			t0 = kvf_mono_ns();
		if (g_stop)
			return -EINTR;
		if (gone(w) || kvf_mono_ns() - t0 > (uint64_t)WK_TP_WAIT_S * 1000000000ull) {
			WK_ERR(w, "tensor parallelism: rank %d did not %s within %d s (or another rank of the group is "
			       "gone): the step fails and the group starts again", (int)r, what, WK_TP_WAIT_S);
			t->broken = 1;
			return gone(w) ? -EPIPE : -ETIMEDOUT;
		}
	}
}

int wk_tp_reduce(void *arg, float *buf, int32_t n, int32_t ld, int32_t dim)
{
	struct worker *w = arg;
	struct wk_tp *t = &w->tp;
	const uint64_t seq = ++t->seq;
	const size_t slot = t->a != NULL ? (size_t)t->a->max_cols * t->a->ld : 0;
	int rc;

	if (t->a == NULL || n > (int32_t)t->a->max_cols || dim > (int32_t)t->a->ld)
		return -EINVAL;
	for (int32_t j = 0; j < n; j++)
		memcpy(t->slots + (size_t)t->rank * slot + (size_t)j * t->a->ld, buf + (size_t)j * ld,
		       (size_t)dim * sizeof(float));
	atomic_store_explicit(&t->a->r[t->rank].arrive, seq, memory_order_release);
	if ((rc = wait_all(w, offsetof(struct wk_tp_rec, arrive), seq, "reach a reduce")) < 0)
		return rc;
	for (int32_t j = 0; j < n; j++)
		for (int32_t i = 0; i < dim; i++) {
			float v[WK_TP_MAX];

			for (int32_t r = 0; r < t->size; r++)
				v[r] = t->slots[(size_t)r * slot + (size_t)j * t->a->ld + i];
			for (int32_t step = 1; step < t->size; step *= 2) /* pairwise, in rank order */
				for (int32_t r = 0; r + step < t->size; r += 2 * step)
					v[r] += v[r + step];
			buf[(size_t)j * ld + i] = v[0];
		}
	atomic_store_explicit(&t->a->r[t->rank].depart, seq, memory_order_release);
	return wait_all(w, offsetof(struct wk_tp_rec, depart), seq, "finish a reduce");
}

/* The leader: wait until every follower has handled what it was handed. */
static void followers_done(struct worker *w)
{
	struct wk_tp *t = &w->tp;

	for (int32_t r = 1; r < t->size && t->a != NULL && !t->broken; r++) {
		uint64_t t0 = kvf_mono_ns();

		while (atomic_load_explicit(&t->a->r[r].done, memory_order_acquire) < t->base_done[r] + t->fwd) {
			sched_yield();
			if (g_stop || gone(w) || kvf_mono_ns() - t0 > (uint64_t)WK_TP_WAIT_S * 1000000000ull) {
				WK_ERR(w, "tensor parallelism: rank %d did not handle its messages: the group starts again",
				       (int)r);
				t->broken = 1;
				break;
			}
		}
	}
}

uint64_t wk_tp_kv_begin(struct worker *w, uint32_t kind, const void *msg, uint32_t len, uint64_t off)
{
	struct wk_tp *t = &w->tp;
	struct wk_tp_area *a = t->a;
	uint64_t job;

	if (t->size == 1 || t->rank != 0)
		return 0;
	t->kv_failed = 0;
	if (a == NULL || t->broken || (kind == WK_TP_KV_MSG_JOB && len > sizeof(a->kv_msg))) {
		t->kv_failed = 1;
		return 0;
	}
	/* every follower finished the last job (the leader waited): the slot is free */
	a->kv_kind = kind;
	a->kv_len = len;
	a->kv_off = off;
	if (kind == WK_TP_KV_MSG_JOB)
		memcpy(a->kv_msg, msg, len);
	job = atomic_load(&a->kv_seq) + 1;
	atomic_store_explicit(&a->kv_seq, job, memory_order_release);
	for (int32_t r = 1; r < t->size; r++) {
		const struct shm_desc d = { .seq = job };

		/* a full ring: its follower is behind, or gone */
		for (uint32_t spins = 0; shm_ring_enqueue_burst(t->kq[r], &d, 1) != 1; spins++) {
			sched_yield();
			if (g_stop || (spins % 1024 == 1023 && gone(w))) {
				t->kv_failed = 1;
				return job;
			}
		}
	}
	return job;
}

/* Rank @p r's answer to the last KV copy: its status, and its message in
 * @p err when it failed (a follower writes them with kv_note()). */
static int rank_kv_error(const struct wk_tp *t, int32_t r, char *err, size_t errlen)
{
	if (t->a->r[r].kv_status >= 0)
		return 0;
	snprintf(err, errlen, "rank %d of %d of the stage: %s", (int)r, (int)t->size, t->a->r[r].kv_err);
	return t->a->r[r].kv_status;
}

/* A follower's answer to a KV copy, for the leader: published by the count
 * that follows (kv_done, or the done count of wk_tp_handled()). */
static void kv_note(struct wk_tp_rec *rec, int rc, const char *err)
{
	rec->kv_status = rc;
	snprintf(rec->kv_err, sizeof(rec->kv_err), "%s", rc < 0 ? err : "");
}

int wk_tp_kv_end(struct worker *w, uint64_t job, char *err, size_t errlen)
{
	struct wk_tp *t = &w->tp;

	if (t->size == 1 || t->rank != 0)
		return 0;
	if (job == 0 || t->kv_failed) {
		snprintf(err, errlen, "the stage's %d tensor-parallel workers could not share a KV page copy (a rank "
			 "is gone or behind): the group starts again", (int)t->size);
		t->broken = 1;
		return -EPIPE;
	}
	for (int32_t r = 1; r < t->size; r++) {
		const uint64_t t0 = kvf_mono_ns();

		while (atomic_load_explicit(&t->a->r[r].kv_done, memory_order_acquire) < job) {
			sched_yield();
			if (g_stop || gone(w) || kvf_mono_ns() - t0 > (uint64_t)WK_TP_WAIT_S * 1000000000ull) {
				snprintf(err, errlen, "rank %d of %d of the stage did not copy its share of the KV pages "
					 "within %d s (or is gone): the group starts again", (int)r, (int)t->size,
					 WK_TP_WAIT_S);
				t->broken = 1;
				return g_stop ? -EINTR : -ETIMEDOUT;
			}
		}
		int rc = rank_kv_error(t, r, err, errlen);

		if (rc < 0)
			return rc;
	}
	return 0;
}

int wk_tp_kv_poll(struct worker *w)
{
	struct wk_tp *t = &w->tp;
	struct wk_tp_area *a = t->a;
	struct wk_kvpage_info info;
	struct shm_desc d;
	char err[SHM_MB_ERRLEN] = "";
	int rc;

	if (t->kin == NULL || shm_ring_dequeue_burst(t->kin, &d, 1) != 1)
		return 0;
	if (a == NULL || d.seq != atomic_load_explicit(&a->kv_seq, memory_order_acquire))
		return 1; /* a job of a leader before this group's: nobody waits for it */
	if (!w->joined || w->st == NULL) {
		snprintf(err, sizeof(err), "rank %d has no stage yet", (int)t->rank);
		rc = -EPROTO;
	} else if (a->kv_kind == WK_TP_KV_MSG_JOB && a->kv_len >= sizeof(struct shm_mb_hdr) + sizeof(struct shm_mb_kv)) {
		rc = wk_kv_act(w, (struct shm_mb_kv *)(a->kv_msg + sizeof(struct shm_mb_hdr)), err, sizeof(err));
	} else if (a->kv_kind == WK_TP_KV_PAGES_JOB && a->kv_len <= shm_region_size(w->reg)
		   && a->kv_off <= shm_region_size(w->reg) - a->kv_len) {
		struct wk_kv_io io = wk_kv_io_stage(w->st);

		rc = wk_kvpage_import(&io, shm_ptr(w->reg, a->kv_off), a->kv_len, &info, err, sizeof(err));
	} else {
		snprintf(err, sizeof(err), "a KV job of kind %u, %u bytes, that this rank cannot read", a->kv_kind,
			 a->kv_len);
		rc = -EBADMSG;
	}
	if (rc < 0)
		WK_ERR(w, "tensor parallelism: %s", err);
	kv_note(&a->r[t->rank], rc, err);
	atomic_store_explicit(&a->r[t->rank].kv_done, d.seq, memory_order_release);
	return 1;
}

int wk_tp_share(void *arg, void *buf, size_t len)
{
	struct worker *w = arg;
	float token = 0.f;
	int rc;

	if (w->tp.a == NULL || len > sizeof(w->tp.a->share))
		return -EINVAL;
	if (w->tp.rank == 0)
		memcpy(w->tp.a->share, buf, len);
	/* a reduce of nothing is the group's barrier: rank 0's bytes are in
	 * the area once every rank has reached it, and stay until every rank
	 * has read them and reached the second */
	if ((rc = wk_tp_reduce(w, &token, 1, 1, 1)) < 0)
		return rc;
	if (w->tp.rank != 0)
		memcpy(buf, w->tp.a->share, len);
	return wk_tp_reduce(w, &token, 1, 1, 1);
}

void wk_tp_handled(struct worker *w)
{
	struct wk_tp *t = &w->tp;

	if (t->size == 1)
		return;
	if (t->rank != 0) {
		if (t->a != NULL)
			atomic_fetch_add_explicit(&t->a->r[t->rank].done, 1, memory_order_release);
		return;
	}
	followers_done(w);
}

void wk_tp_kv_note(struct worker *w, int rc, const char *err)
{
	if (w->tp.rank != 0 && w->tp.a != NULL)
		kv_note(&w->tp.a->r[w->tp.rank], rc, err); /* published by wk_tp_handled()'s count */
}

int wk_tp_kv_wait(struct worker *w, char *err, size_t errlen)
{
	struct wk_tp *t = &w->tp;

	if (t->size == 1 || t->rank != 0)
		return 0;
	followers_done(w);
	if (t->broken || t->a == NULL) {
		snprintf(err, errlen, "a rank of the stage's %d tensor-parallel workers is gone or did not copy its "
			 "share of the KV pages: the group starts again", (int)t->size);
		return -EPIPE;
	}
	for (int32_t r = 1; r < t->size; r++) {
		int rc = rank_kv_error(t, r, err, errlen);

		if (rc < 0)
			return rc;
	}
	return 0;
}

void wk_tp_answer(struct worker *w, int rc, const char *err)
{
	struct wk_tp_rec *me;

	if (w->tp.a == NULL) {
		/* no area to answer in: the leader's join times out naming this rank */
		WK_ERR(w, "tensor parallelism: cannot answer the join: %s", w->tp.err);
		return;
	}
	me = &w->tp.a->r[w->tp.rank];

	me->status = rc;
	me->done_at = atomic_load(&me->done) + 1; /* wk_tp_handled() counts this join next */
	me->pid = (int32_t)getpid();
	me->live = w->live;
	snprintf(me->err, sizeof(me->err), "%s", err);
	/* the leader this join came from: its registration, for gone() */
	w->tp.joined_gen = atomic_load(&w->tp.a->gen);
	w->tp.leader_epoch = live_epoch(w, w->tp.a->leader_live);
	atomic_store_explicit(&me->ack, w->tp.joined_gen, memory_order_release);
}

int wk_tp_answers(struct worker *w, char *err, size_t errlen)
{
	struct wk_tp *t = &w->tp;
	const uint64_t gen = t->a != NULL ? atomic_load(&t->a->gen) : 0;

	if (t->a == NULL) {
		snprintf(err, errlen, "tensor parallelism: %s", t->err);
		return -EIO;
	}
	for (int32_t r = 1; r < t->size; r++) {
		uint64_t t0 = kvf_mono_ns();

		while (atomic_load_explicit(&t->a->r[r].ack, memory_order_acquire) != gen) {
			if (g_stop || kvf_mono_ns() - t0 > (uint64_t)WK_TP_WAIT_S * 1000000000ull) {
				snprintf(err, errlen, "rank %d of %d of the stage (tensor parallelism) did not answer in "
					 "%d s: start a worker with --tp-rank %d on ring %s", (int)r, (int)t->size,
					 WK_TP_WAIT_S, (int)r, t->base);
				return -ETIMEDOUT;
			}
			sched_yield();
		}
		if (t->a->r[r].status < 0) {
			snprintf(err, errlen, "rank %d of %d of the stage (tensor parallelism): %s", (int)r, (int)t->size,
				 t->a->r[r].err);
			return t->a->r[r].status;
		}
		t->pid[r] = t->a->r[r].pid;
		t->live[r] = t->a->r[r].live;
		t->epoch[r] = live_epoch(w, t->live[r]);
		/* its count of messages handled (kept in the area across its
		 * restarts, and counting stale messages it dropped) against ours */
		t->base_done[r] = t->a->r[r].done_at - t->fwd;
	}
	return 0;
}
