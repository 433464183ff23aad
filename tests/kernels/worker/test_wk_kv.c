/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A worker's KV side ring (worker_kv.c), driven as ctrld drives it: a batch
 * of page copies in one message moves the bytes kn_stage_kv_export/import
 * move; every lie a message can tell (copy records that overrun its words,
 * blocks outside the pool, buffers outside the region, another stage, a
 * stale epoch, a cut header) is answered with an error naming it, or
 * dropped, never acted on; thousands of random mutations of a good message
 * never crash the worker (ASan/UBSan in the sanitizer pass) and each gets
 * one answer or none. And the pages a decode node's stage takes from the
 * dataplane itself (worker_kvrx.c): landed only for a room ctrld opened,
 * in its session and the stage's layers, each reported, every buffer back.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "../../shm/fallback_region.h"
#include "kn_testutil.h"
#include "dp_ipc.h"
#include "shm_pool.h"
#include "shm_ring.h"
#include "wk_kvpage.h"
#include "worker_int.h"

/* What the worker's other files give worker_kv.c (worker.c, worker_step.c). */
volatile sig_atomic_t g_stop;

void wk_fmt(char *b, size_t n, const char *f, ...)
{
	va_list ap;

	va_start(ap, f);
	vsnprintf(b, n, f, ap);
	va_end(ap);
}

static int g_logged;

void wk_log(const struct worker *w, int pri, const char *fmt, ...)
{
	(void)w;
	(void)pri;
	(void)fmt;
	g_logged++;
}

void wk_send_msg(struct worker *w, struct shm_mb_hdr *oh)
{
	(void)w;
	(void)oh;
	fail_msg("a side-ring message must be answered on the side ring, not sent on");
}

/* worker_tp.c's: this test's stages have tp_size 1 */
void wk_tp_kv_note(struct worker *w, int rc, const char *err)
{
	(void)w;
	(void)rc;
	(void)err;
}

int wk_tp_kv_wait(struct worker *w, char *err, size_t errlen)
{
	(void)w;
	(void)err;
	(void)errlen;
	return 0;
}

uint64_t wk_tp_kv_begin(struct worker *w, uint32_t kind, const void *msg, uint32_t len, uint64_t off)
{
	(void)w;
	(void)kind;
	(void)msg;
	(void)len;
	(void)off;
	return 0;
}

int wk_tp_kv_end(struct worker *w, uint64_t job, char *err, size_t errlen)
{
	(void)w;
	(void)job;
	(void)err;
	(void)errlen;
	return 0;
}

#define NBLK 16
#define EPOCH 7
#define MSG_BYTES (64 << 10)

struct fixture {
	struct kt_model t;
	char name[32];
	struct shm_region *reg;
	struct kn_stage *st;
	struct worker w;
	struct shm_mb_hdr *msg; /* ctrld's message buffer, in the region */
	uint8_t *pages;         /* NBLK blocks' buffer, in the region */
	uint8_t *pool0;         /* the pool's bytes at set-up (every block exported) */
	struct kn_kv_format f;
};

static void *area(struct fixture *x, const char *name, size_t size)
{
	uint64_t off;
	size_t have;
	int rc = shm_region_add_area(x->reg, name, size, 4096, SHM_AREA_RAW, &off);

	if (rc == -EEXIST) { /* an earlier test of the group made it */
		assert_int_equal(shm_region_find_area(x->reg, name, &off, &have), 0);
		assert_true(have >= size);
		rc = 0;
	}
	assert_int_equal(rc, 0);
	return shm_ptr(x->reg, off);
}

static int setup(void **state)
{
	struct fixture *x;
	int32_t toks[40], all[NBLK];
	float *logits;
	char err[256];

	if (kt_fixture_setup(state, sizeof(*x), "--preset tiny --arch llama --layers 2 --seed 5"))
		return -1;
	x = *state;
	snprintf(x->name, sizeof(x->name), "twkkv%d", (int)getpid());
	x->reg = test_fallback_region(x->name, 16u << 20);
	if (x->reg == NULL || kt_cpu_chain(&x->t, 1, NBLK, 1, NBLK, &x->st))
		return -1;
	/* real KV in every block: a prompt over all of them */
	for (int32_t i = 0; i < NBLK; i++)
		all[i] = i;
	for (int32_t i = 0; i < 40; i++)
		toks[i] = (i * 7 + 3) % x->t.vocab;
	logits = malloc((size_t)x->t.vocab * 4);
	if (logits == NULL || kt_point_slot(&x->st, 1, 0, all, NBLK)
	    || kt_run(&x->t, &x->st, 1, toks, 40, 0, 0, logits) < 0)
		return -1;
	free(logits);
	kn_stage_kv_format(x->st, &x->f);
	x->w = (struct worker){ .reg = x->reg, .st = x->st, .idx = 0, .n_stages = 1, .epoch = EPOCH, .joined = 1 };
	x->w.o.in = "ring:t.in";
	x->w.o.role = "test";
	x->w.o.region = x->name;
	x->w.o.kv_rx_pieces = 1; /* a cpu stage's default (auto) */
	if (wk_kv_side_open(&x->w, err, sizeof(err)) < 0 || x->w.kvq == NULL) {
		fprintf(stderr, "wk_kv_side_open: %s\n", err);
		return -1;
	}
	x->msg = area(x, "t.msg", MSG_BYTES);
	x->pages = area(x, "t.pages", NBLK * x->f.block_bytes);
	x->pool0 = malloc(NBLK * x->f.block_bytes);
	if (x->pool0 == NULL || kn_stage_kv_export(x->st, all, NBLK, x->pool0, NBLK * x->f.block_bytes) < 0)
		return -1;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *x = *state;

	if (x == NULL)
		return 0;
	shm_ring_close(x->w.kvq);
	shm_ring_close(x->w.kvr);
	if (x->st != NULL)
		kn_stage_destroy(x->st);
	if (x->reg != NULL) {
		shm_region_detach(x->reg);
		shm_region_unlink(x->name);
	}
	free(x->pool0);
	kt_model_close(&x->t);
	free(x);
	return 0;
}

/* The pool's blocks now, one after another. */
static uint8_t *pool_now(struct fixture *x)
{
	int32_t all[NBLK];
	uint8_t *b = malloc(NBLK * x->f.block_bytes);

	for (int32_t i = 0; i < NBLK; i++)
		all[i] = i;
	assert_non_null(b);
	assert_int_equal(kn_stage_kv_export(x->st, all, NBLK, b, NBLK * x->f.block_bytes), 0);
	return b;
}

static void restore_pool(struct fixture *x)
{
	int32_t all[NBLK];

	for (int32_t i = 0; i < NBLK; i++)
		all[i] = i;
	assert_int_equal(kn_stage_kv_import(x->st, all, NBLK, x->pool0, NBLK * x->f.block_bytes, &x->f), 0);
}

/*
 * A vector message of @p n copies: copy i moves blocks ids[i][0..nb[i]) to or
 * from page buffer slot @p slot[i] (block_bytes each, in x->pages).
 */
static size_t build(struct fixture *x, uint32_t op, int n, const int32_t *nb, const int32_t (*ids)[NBLK],
		    const int32_t *slot, uint64_t seq)
{
	struct shm_mb_kv *k = (struct shm_mb_kv *)(x->msg + 1);
	int32_t *words = (int32_t *)(k + 1), *blocks, total = 0;

	for (int i = 0; i < n; i++)
		total += nb[i];
	memset(x->msg, 0, sizeof(*x->msg));
	*x->msg = (struct shm_mb_hdr){ .magic = SHM_MB_MAGIC, .version = SHM_MB_VERSION, .kind = SHM_MB_KV,
				       .epoch = EPOCH, .seq = seq, .stage = 0, .n_stages = 1 };
	*k = (struct shm_mb_kv){ .op = op, .target = 0, .n_blocks = n * SHM_MB_KV_COPY_WORDS + total,
				 .dtype = x->f.dtype, .layer_start = x->f.layer_start, .layer_end = x->f.layer_end,
				 .n_kv_heads = x->f.n_kv_heads, .head_dim = x->f.head_dim,
				 .block_bytes = x->f.block_bytes, .n_copies = (uint32_t)n };
	blocks = words + n * SHM_MB_KV_COPY_WORDS;
	for (int i = 0; i < n; i++) {
		struct shm_mb_kv_copy c = { .buf_off = shm_off(x->reg, x->pages + (size_t)slot[i] * x->f.block_bytes),
					    .buf_len = (uint64_t)nb[i] * x->f.block_bytes, .n_blocks = nb[i] };

		memcpy(words + i * SHM_MB_KV_COPY_WORDS, &c, sizeof(c));
		memcpy(blocks, ids[i], sizeof(int32_t) * (size_t)nb[i]);
		blocks += nb[i];
	}
	x->msg->total_len = (uint32_t)shm_mb_kv_size(k->n_blocks);
	return x->msg->total_len;
}

/*
 * Put the message on the side ring and let the worker take it.
 * @return 1 answered (status in *status), 0 dropped without an answer.
 */
static int send(struct fixture *x, size_t len, int32_t *status)
{
	struct shm_desc d = { .off = shm_off(x->reg, x->msg), .len = (uint32_t)len }, a;

	assert_int_equal(shm_ring_enqueue_burst(x->w.kvq, &d, 1), 1);
	assert_int_equal(wk_kv_side_poll(&x->w), 1);
	assert_int_equal(wk_kv_side_poll(&x->w), 0); /* one message, taken once */
	if (shm_ring_dequeue_burst(x->w.kvr, &a, 1) != 1)
		return 0;
	assert_int_equal(a.off, d.off);
	*status = x->msg->status;
	return 1;
}

static void a_batch_of_copies_moves_what_each_copy_alone_moves(void **state)
{
	struct fixture *x = *state;
	const int32_t nb[3] = { 2, 1, 3 }, slot[3] = { 0, 2, 3 };
	const int32_t ids[3][NBLK] = { { 5, 1 }, { 9 }, { 15, 0, 7 } }, into[3][NBLK] = { { 2, 3 }, { 4 }, { 10, 11, 12 } };
	int32_t status = 1;
	uint8_t *now;

	memset(x->pages, 0xee, NBLK * x->f.block_bytes);
	assert_int_equal(send(x, build(x, SHM_MB_KV_EXPORT_V, 3, nb, ids, slot, 1), &status), 1);
	assert_int_equal(status, 0);
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < nb[i]; j++)
			assert_memory_equal(x->pages + (size_t)(slot[i] + j) * x->f.block_bytes,
					    x->pool0 + (size_t)ids[i][j] * x->f.block_bytes, x->f.block_bytes);

	/* the same buffers back in, into other blocks */
	assert_int_equal(send(x, build(x, SHM_MB_KV_IMPORT_V, 3, nb, into, slot, 2), &status), 1);
	assert_int_equal(status, 0);
	now = pool_now(x);
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < nb[i]; j++)
			assert_memory_equal(now + (size_t)into[i][j] * x->f.block_bytes,
					    x->pool0 + (size_t)ids[i][j] * x->f.block_bytes, x->f.block_bytes);
	assert_memory_equal(now + 5 * x->f.block_bytes, x->pool0 + 5 * x->f.block_bytes, x->f.block_bytes);
	free(now);
	restore_pool(x);
}

/* Send the good two-copy import of blocks 3, 4 after @p lie changed it: the
 * answer must be an error, and no block of the pool may have changed. */
static void refused(struct fixture *x, void (*lie)(struct fixture *x), int dropped)
{
	const int32_t nb[2] = { 1, 1 }, slot[2] = { 0, 1 }, ids[2][NBLK] = { { 3 }, { 4 } };
	int32_t status = 0;
	size_t len = build(x, SHM_MB_KV_IMPORT_V, 2, nb, ids, slot, 3);
	uint8_t *now;

	memset(x->pages, 0x5a, 2 * x->f.block_bytes);
	lie(x); /* the descriptor keeps the good message's length */
	if (dropped) {
		assert_int_equal(send(x, len, &status), 0);
	} else {
		assert_int_equal(send(x, len, &status), 1);
		assert_true(status < 0);
		assert_true(x->msg->err[0] != '\0');
	}
	now = pool_now(x);
	assert_memory_equal(now, x->pool0, NBLK * x->f.block_bytes);
	free(now);
}

static struct shm_mb_kv *kvrec(struct fixture *x)
{
	return (struct shm_mb_kv *)(x->msg + 1);
}

static struct shm_mb_kv_copy *copyrec(struct fixture *x, int i)
{
	return (struct shm_mb_kv_copy *)((int32_t *)(kvrec(x) + 1) + i * SHM_MB_KV_COPY_WORDS);
}

static void lie_no_copies(struct fixture *x) { kvrec(x)->n_copies = 0; }
static void lie_more_copies_than_words(struct fixture *x) { kvrec(x)->n_copies = 1000; }
static void lie_copy_overruns(struct fixture *x) { copyrec(x, 0)->n_blocks = 3; }
static void lie_copy_negative(struct fixture *x) { copyrec(x, 1)->n_blocks = -1; }
static void lie_words_unused(struct fixture *x) { copyrec(x, 1)->n_blocks = 0; }
static void lie_buffer_outside(struct fixture *x) { copyrec(x, 0)->buf_off = (uint64_t)1 << 40; }
static void lie_buffer_wraps(struct fixture *x) { copyrec(x, 0)->buf_off = UINT64_MAX - 8; }
static void lie_buffer_short(struct fixture *x) { copyrec(x, 0)->buf_len = 16; }
static void lie_block_outside(struct fixture *x) { ((int32_t *)(copyrec(x, 2)))[0] = NBLK; }
static void lie_block_negative(struct fixture *x) { ((int32_t *)(copyrec(x, 2)))[1] = -4; }
static void lie_other_dtype(struct fixture *x) { kvrec(x)->dtype = 99; }
static void lie_other_layers(struct fixture *x) { kvrec(x)->layer_end += 5; }
static void lie_unknown_op(struct fixture *x) { kvrec(x)->op = 77; }
static void lie_other_stage(struct fixture *x) { x->msg->stage = 1; }
static void lie_too_many_words(struct fixture *x) { kvrec(x)->n_blocks = 1 << 20; }
static void lie_cut(struct fixture *x) { x->msg->total_len += 64; } /* longer than the descriptor says */
static void lie_magic(struct fixture *x) { x->msg->magic ^= 1; }
static void lie_stale_epoch(struct fixture *x) { x->msg->epoch = EPOCH - 1; }

static void every_lie_of_a_message_is_refused_and_writes_no_page(void **state)
{
	struct fixture *x = *state;
	static void (*const answered[])(struct fixture *) = {
		lie_no_copies, lie_more_copies_than_words, lie_copy_overruns, lie_copy_negative, lie_words_unused,
		lie_buffer_outside, lie_buffer_wraps, lie_buffer_short, lie_block_outside, lie_block_negative,
		lie_other_dtype, lie_other_layers, lie_unknown_op, lie_other_stage, lie_too_many_words, lie_cut,
		lie_magic,
	};

	const int32_t nb[2] = { 1, 1 }, slot[2] = { 0, 1 }, ids[2][NBLK] = { { 3 }, { 4 } };
	int32_t status = 1;

	/* unchanged, the message is good and writes blocks 3 and 4 */
	memset(x->pages, 0x5a, 2 * x->f.block_bytes);
	assert_int_equal(send(x, build(x, SHM_MB_KV_IMPORT_V, 2, nb, ids, slot, 3), &status), 1);
	assert_int_equal(status, 0);
	restore_pool(x);
	for (size_t i = 0; i < sizeof(answered) / sizeof(answered[0]); i++) {
		print_message("lie %zu\n", i);
		refused(x, answered[i], 0);
	}
	refused(x, lie_stale_epoch, 1); /* ctrld gave up on that epoch: dropped, unanswered */
}

static void random_mutations_never_crash_and_each_gets_at_most_one_answer(void **state)
{
	struct fixture *x = *state;
	const int32_t nb[3] = { 1, 2, 1 }, slot[3] = { 0, 1, 3 }, ids[3][NBLK] = { { 3 }, { 4, 6 }, { 8 } };
	unsigned seed = 12345;
	int answered = 0, ok = 0;

	for (int it = 0; it < 4000; it++) {
		size_t len = build(x, (it & 1) ? SHM_MB_KV_IMPORT_V : SHM_MB_KV_EXPORT_V, 3, nb, ids, slot,
				   (uint64_t)it + 10);
		uint8_t *b = (uint8_t *)x->msg;
		int32_t status = 0;
		int flips = 1 + (int)(rand_r(&seed) % 6);

		for (int k = 0; k < flips; k++) {
			/* header fields the checks read, the KV record, the copies, the ids */
			size_t at = (rand_r(&seed) & 3) == 0 ? (size_t)(rand_r(&seed) % 64)
				    : sizeof(struct shm_mb_hdr) + (size_t)(rand_r(&seed) % (len - sizeof(struct shm_mb_hdr)));

			size_t rec = at - (sizeof(struct shm_mb_hdr) + sizeof(struct shm_mb_kv));

			/* a buffer offset moved by 256 B .. 16 MiB would land on the
			 * side rings themselves (ctrld names only buffers of its own):
			 * its low byte moves it within the page area, its high ones
			 * out of the region */
			if (at >= sizeof(struct shm_mb_hdr) + sizeof(struct shm_mb_kv)
			    && rec < 3 * sizeof(struct shm_mb_kv_copy) && rec % sizeof(struct shm_mb_kv_copy) >= 1
			    && rec % sizeof(struct shm_mb_kv_copy) <= 3)
				at += 4;
			b[at] = (rand_r(&seed) & 1) ? (uint8_t)rand_r(&seed) : (uint8_t)(b[at] ^ (1u << (rand_r(&seed) & 7)));
		}
		if (rand_r(&seed) % 8 == 0)
			len = (size_t)(rand_r(&seed) % (unsigned)len);
		if (len < sizeof(struct shm_mb_hdr))
			len = sizeof(struct shm_mb_hdr);
		if (send(x, len, &status)) {
			answered++;
			ok += status == 0;
		}
	}
	print_message("4000 mutated messages: %d answered (%d of them done), the rest dropped\n", answered, ok);
	assert_true(answered > 1000);
	restore_pool(x);
}

/* ---- KV pages straight from the dataplane (worker_kvrx.c) ---- */

struct rx_fixture {
	struct dp_rxroute *route;
	struct shm_mb_kvrooms *rooms;
	struct shm_pool *rxs, *rxl;
	struct shm_ring *rx, *kvl;
};

/* A dataplane's receive pools and routes, ctrld's rooms, then the route. */
static void rx_setup(struct fixture *x, struct rx_fixture *r)
{
	char err[256];

	r->route = area(x, DP_AREA_RXROUTE, sizeof(*r->route));
	r->route->magic = DP_RXROUTE_MAGIC;
	r->route->version = DP_RXROUTE_VERSION;
	r->rooms = area(x, SHM_MB_KVROOMS_AREA, sizeof(*r->rooms));
	r->rooms->magic = SHM_MB_KVROOMS_MAGIC;
	r->rxs = shm_pool_create(x->reg, DP_POOL_RX_SMALL, 8, 256);
	r->rxl = shm_pool_create(x->reg, DP_POOL_RX_LARGE, 4, wk_kvpage_size(x->f.block_bytes, NBLK));
	if (r->rxs == NULL) /* an earlier test of the group made them */
		r->rxs = shm_pool_lookup(x->reg, DP_POOL_RX_SMALL);
	if (r->rxl == NULL)
		r->rxl = shm_pool_lookup(x->reg, DP_POOL_RX_LARGE);
	assert_non_null(r->rxs);
	assert_non_null(r->rxl);
	assert_int_equal(wk_kvrx_route(&x->w, 3, err, sizeof(err)), 0);
	r->rx = shm_ring_lookup(x->reg, "t.in.rx");
	r->kvl = shm_ring_lookup(x->reg, "t.in.kvl");
	assert_non_null(r->rx);
	assert_non_null(r->kvl);
}

/* Deliver a page message (blocks src -> dst of room/session) as the dataplane
 * does, let the stage take it; @return its report. */
static struct shm_desc rx_deliver(struct fixture *x, struct rx_fixture *r, uint64_t room, uint32_t session,
				  const int32_t *src, const uint32_t *dst, int32_t n, void (*lie)(void *buf))
{
	struct wk_kv_io io = wk_kv_io_stage(x->st);
	struct shm_desc d, rep;
	uint32_t idx;
	char err[256];
	int64_t len;

	assert_int_equal(shm_pool_get(r->rxl, &idx), 0);
	len = wk_kvpage_pack(&io, room, session, 0, 1, src, dst, n, shm_pool_buf(r->rxl, idx),
			     shm_pool_bufsize(r->rxl), err, sizeof(err));
	assert_true(len > 0);
	if (lie != NULL)
		lie(shm_pool_buf(r->rxl, idx));
	d = (struct shm_desc){ .off = shm_pool_buf_off(r->rxl, idx), .len = (uint32_t)len, .type = DP_MT_KVPAGE };
	assert_int_equal(shm_ring_enqueue_burst(r->rx, &d, 1), 1);
	assert_int_equal(wk_kvrx_poll(&x->w), 1);
	assert_int_equal(wk_kvrx_poll(&x->w), 0); /* taken once */
	assert_int_equal(shm_ring_dequeue_burst(r->kvl, &rep, 1), 1);
	/* its buffer is back in the dataplane's pool, and no import is in progress */
	assert_int_equal(shm_pool_available(r->rxl), shm_pool_count(r->rxl));
	assert_int_equal(r->rooms->busy[0].on, 0);
	assert_int_equal(rep.len, (uint32_t)len);
	assert_int_equal(rep.type, 0);
	return rep;
}

/* Blocks src[i] of the pool as it was now sit in blocks dst[i]; then the pool as it was. */
static void assert_landed(struct fixture *x, const int32_t *src, const uint32_t *dst, int n)
{
	uint8_t *now = pool_now(x);

	for (int i = 0; i < n; i++)
		assert_memory_equal(now + (size_t)dst[i] * x->f.block_bytes, x->pool0 + (size_t)src[i] * x->f.block_bytes,
				    x->f.block_bytes);
	free(now);
	restore_pool(x);
}

static void lie_other_layers_hdr(void *buf)
{
	struct dp_kvpage_fields f = { 0 };

	assert_int_equal(dp_kvpage_hdr_get(buf, sizeof(struct dp_kvpage_hdr) + 4096, &f), 0);
	f.layer_end += 3;
	dp_kvpage_hdr_put(buf, &f);
}

static void pages_routed_to_the_stage_land_only_for_open_rooms_and_each_is_reported(void **state)
{
	struct fixture *x = *state;
	struct rx_fixture r;
	const int32_t src[3] = { 0, 1, 2 };
	const uint32_t dst[3] = { 10, 11, 12 };
	struct shm_desc rep;
	uint8_t *now;

	rx_setup(x, &r);
	/* the stream routed to this process's ring, waking its input ring */
	assert_int_equal(r.route->ent[3].pid, (int32_t)getpid());
	assert_string_equal(r.route->ent[3].ring, "t.in.rx");
	assert_string_equal(r.route->ent[3].wake, "t.in");
	assert_int_equal(r.route->ent[3].gen % 2, 0);

	/* a room ctrld has not opened: refused, no page written */
	rep = rx_deliver(x, &r, 77, 5, src, dst, 3, NULL);
	assert_int_equal(rep.off, 77);
	assert_true(rep.flags & SHM_MB_KVL_REFUSED);
	now = pool_now(x);
	assert_memory_equal(now, x->pool0, NBLK * x->f.block_bytes);
	free(now);

	/* open (room 77, session 5): the pages land in the blocks the message names */
	r.rooms->slot[9] = (struct shm_mb_kvroom){ .room = 77, .session = 5, .open = 1 };
	rep = rx_deliver(x, &r, 77, 5, src, dst, 3, NULL);
	assert_int_equal(rep.flags, SHM_MB_KVL_LAST);
	assert_int_equal(rep.seq, 3);
	assert_int_equal(rep.aux, 5);
	assert_landed(x, src, dst, 3);

	/* another session of that room, another layer range, a closed room: refused, nothing written */
	rep = rx_deliver(x, &r, 77, 6, src, dst, 3, NULL);
	assert_true(rep.flags & SHM_MB_KVL_REFUSED);
	rep = rx_deliver(x, &r, 77, 5, src, dst, 3, lie_other_layers_hdr);
	assert_true(rep.flags & SHM_MB_KVL_REFUSED);
	r.rooms->slot[9].open = 0;
	rep = rx_deliver(x, &r, 77, 5, src, dst, 3, NULL);
	assert_true(rep.flags & SHM_MB_KVL_REFUSED);
	now = pool_now(x);
	assert_memory_equal(now, x->pool0, NBLK * x->f.block_bytes);
	free(now);

	/* closing gives the stream back: the dataplane routes it no longer */
	wk_kvrx_close(&x->w);
	assert_int_equal(r.route->ent[3].pid, 0);
	shm_ring_close(r.rx);
	shm_ring_close(r.kvl);
	shm_pool_close(r.rxs);
	shm_pool_close(r.rxl);
}

/* Deliver a page message as a dataplane receiving in place does: the list
 * of its "frames" (pieces of 5, 56, 939, 3 KiB ... bytes of the packed
 * message) in a small-pool buffer, stamped with dataplane epoch @p epoch;
 * let the stage take it; @return its report. */
static struct shm_desc rx_deliver_list(struct fixture *x, struct rx_fixture *r, uint64_t room, uint32_t session,
				       const int32_t *src, const uint32_t *dst, int32_t n, uint64_t epoch)
{
	static const uint32_t cuts[] = { 5, 56, 939, 3072, 1, 700, 4100 };
	struct wk_kv_io io = wk_kv_io_stage(x->st);
	struct dp_rx_seglist *sl;
	struct shm_desc d, rep;
	uint32_t big, small, at = 0;
	char err[256];
	int64_t len;

	assert_int_equal(shm_pool_get(r->rxl, &big), 0);
	assert_int_equal(shm_pool_get(r->rxs, &small), 0);
	len = wk_kvpage_pack(&io, room, session, 0, 1, src, dst, n, shm_pool_buf(r->rxl, big),
			     shm_pool_bufsize(r->rxl), err, sizeof(err));
	assert_true(len > 0);
	sl = shm_pool_buf(r->rxs, small);
	*sl = (struct dp_rx_seglist){ .magic = DP_RX_SEGLIST_MAGIC, .version = DP_RX_SEGLIST_VERSION,
				      .msg_len = (uint32_t)len, .epoch = epoch };
	for (int k = 0; at < (uint32_t)len; k++) {
		uint32_t m = k < 7 ? cuts[k] : (uint32_t)len - at;

		if (m > (uint32_t)len - at)
			m = (uint32_t)len - at;
		sl->seg[sl->n_segs++] = (struct dp_rx_seg){ .off = shm_pool_buf_off(r->rxl, big) + at, .len = m };
		at += m;
	}
	d = (struct shm_desc){ .off = shm_pool_buf_off(r->rxs, small), .len = (uint32_t)len, .type = DP_MT_KVPAGE,
			       .flags = DP_RX_SEGMENTS };
	assert_int_equal(shm_ring_enqueue_burst(r->rx, &d, 1), 1);
	assert_int_equal(wk_kvrx_poll(&x->w), 1);
	assert_int_equal(shm_ring_dequeue_burst(r->kvl, &rep, 1), 1);
	/* the list's buffer is back (the dataplane frees its frames then) */
	assert_int_equal(shm_pool_available(r->rxs), shm_pool_count(r->rxs));
	shm_pool_put(r->rxl, big);
	assert_int_equal(rep.len, (uint32_t)len);
	return rep;
}

static void pages_received_in_place_land_from_their_frames_and_not_across_a_dataplane_restart(void **state)
{
	struct fixture *x = *state;
	struct rx_fixture r;
	struct dp_stats_shm *st = area(x, DP_AREA_STATS, sizeof(*st));
	const int32_t src[3] = { 2, 0, 1 };
	const uint32_t dst[3] = { 13, 10, 12 };
	struct shm_desc rep;

	st->epoch = 42;
	rx_setup(x, &r);
	/* a CPU stage reads pieces: its route asks for segment lists */
	assert_true(r.route->segs & (1ull << 3));
	r.rooms->slot[4] = (struct shm_mb_kvroom){ .room = 78, .session = 5, .open = 1 };
	rep = rx_deliver_list(x, &r, 78, 5, src, dst, 3, 42);
	assert_int_equal(rep.flags, SHM_MB_KVL_LAST | SHM_MB_KVL_IN_PLACE);
	assert_landed(x, src, dst, 3);
	/* its dataplane started again while the stage read (another epoch): refused */
	rep = rx_deliver_list(x, &r, 78, 5, src, dst, 3, 41);
	assert_true(rep.flags & SHM_MB_KVL_REFUSED);
	assert_false(rep.flags & SHM_MB_KVL_IN_PLACE);
	restore_pool(x);
	/* the route given back clears its bit */
	wk_kvrx_close(&x->w);
	assert_int_equal(r.route->ent[3].pid, 0);
	assert_false(r.route->segs & (1ull << 3));
	shm_ring_close(r.rx);
	shm_ring_close(r.kvl);
	shm_pool_close(r.rxs);
	shm_pool_close(r.rxl);
}

/* Put a page message on the stage's ring as the dataplane passed it to @p to. */
static uint32_t rx_passed(struct fixture *x, struct rx_fixture *r, uint64_t room, const int32_t *src,
			  const uint32_t *dst, int32_t n, int32_t to)
{
	struct wk_kv_io io = wk_kv_io_stage(x->st);
	struct shm_desc d;
	uint32_t idx;
	char err[256];
	int64_t len;

	assert_int_equal(shm_pool_get(r->rxl, &idx), 0);
	len = wk_kvpage_pack(&io, room, 5, 0, 1, src, dst, n, shm_pool_buf(r->rxl, idx), shm_pool_bufsize(r->rxl),
			     err, sizeof(err));
	assert_true(len > 0);
	assert_int_equal(shm_pool_pass(r->rxl, idx, 0, to), 0);
	d = (struct shm_desc){ .off = shm_pool_buf_off(r->rxl, idx), .len = (uint32_t)len, .type = DP_MT_KVPAGE,
			       .aux = DP_AUX(1, 3) | (uint64_t)(uint32_t)to << 32 };
	assert_int_equal(shm_ring_enqueue_burst(r->rx, &d, 1), 1);
	return idx;
}

/* The dataplane passes each routed message's buffer to the route's pid
 * before the enqueue. A message it passed to a predecessor on this ring
 * that died lands while that pid still holds its buffer (taken over), and
 * is skipped once a reclaim gave the buffer back: not read, not given back
 * again, not reported (the buffer may be another message's by now). */
static void a_page_message_passed_to_a_dead_predecessor_lands_only_while_that_one_still_holds_its_buffer(void **state)
{
	struct fixture *x = *state;
	struct rx_fixture r;
	const int32_t src[2] = { 1, 2 };
	const uint32_t dst[2] = { 11, 14 };
	uint32_t idx, all[4];
	struct shm_desc rep;
	uint8_t *now;
	int st;
	pid_t dead = fork();

	if (dead == 0)
		_exit(0);
	assert_int_equal(waitpid(dead, &st, 0), dead);
	rx_setup(x, &r);
	r.rooms->slot[2] = (struct shm_mb_kvroom){ .room = 79, .session = 5, .open = 1 };
	/* passed to the dead pid, still held by it: taken over, landed, given back */
	rx_passed(x, &r, 79, src, dst, 2, dead);
	assert_int_equal(wk_kvrx_poll(&x->w), 1);
	assert_int_equal(shm_ring_dequeue_burst(r.kvl, &rep, 1), 1);
	assert_int_equal(rep.flags, SHM_MB_KVL_LAST);
	assert_int_equal(shm_pool_available(r.rxl), shm_pool_count(r.rxl));
	assert_landed(x, src, dst, 2);
	/* passed to it, then reclaimed (free): skipped */
	rx_passed(x, &r, 79, src, dst, 2, dead);
	assert_int_equal(shm_pool_reclaim(r.rxl, dead), 1);
	assert_int_equal(wk_kvrx_poll(&x->w), 1);
	assert_int_equal(wk_kvrx_poll(&x->w), 0);
	assert_int_equal(shm_ring_dequeue_burst(r.kvl, &rep, 1), 0);
	assert_int_equal(shm_pool_available(r.rxl), shm_pool_count(r.rxl));
	/* reclaimed and handed out again (every buffer held by the dataplane): skipped, left to its holder */
	idx = rx_passed(x, &r, 79, src, dst, 2, dead);
	assert_int_equal(shm_pool_reclaim(r.rxl, dead), 1);
	for (uint32_t i = 0; i < shm_pool_count(r.rxl); i++)
		assert_int_equal(shm_pool_get(r.rxl, &all[i]), 0);
	assert_int_equal(wk_kvrx_poll(&x->w), 1);
	assert_int_equal(shm_ring_dequeue_burst(r.kvl, &rep, 1), 0);
	assert_int_equal(shm_pool_available(r.rxl), 0);
	assert_int_equal(shm_pool_holder(r.rxl, idx), (int32_t)getpid());
	for (uint32_t i = 0; i < shm_pool_count(r.rxl); i++)
		assert_int_equal(shm_pool_put(r.rxl, all[i]), 0);
	now = pool_now(x);
	assert_memory_equal(now, x->pool0, NBLK * x->f.block_bytes);
	free(now);
	assert_int_equal(x->w.rx.stale, 2);
	wk_kvrx_close(&x->w);
	shm_ring_close(r.rx);
	shm_ring_close(r.kvl);
	shm_pool_close(r.rxs);
	shm_pool_close(r.rxl);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_batch_of_copies_moves_what_each_copy_alone_moves),
		cmocka_unit_test(every_lie_of_a_message_is_refused_and_writes_no_page),
		cmocka_unit_test(random_mutations_never_crash_and_each_gets_at_most_one_answer),
		cmocka_unit_test(pages_routed_to_the_stage_land_only_for_open_rooms_and_each_is_reported),
		cmocka_unit_test(pages_received_in_place_land_from_their_frames_and_not_across_a_dataplane_restart),
		cmocka_unit_test(a_page_message_passed_to_a_dead_predecessor_lands_only_while_that_one_still_holds_its_buffer),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
