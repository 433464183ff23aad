/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-worker: one pipeline stage in its own process. It maps the node's
 * region, opens the model, and turns each micro-batch message (shm_mb.h)
 * from its input hop into one stage step whose output goes to its output
 * hop, forwarding the in-band ops with it so the next stage applies the same
 * ops in the same order.
 *
 * Life of a worker:
 *  1. attach the region (a region of another ABI version is refused, naming
 *     both), claim a liveness slot (role = --role), open the model;
 *  2. JOIN (from ctrld, through every stage before it): check the chain
 *     protocol and the model fingerprint, load the assigned layer range
 *     (progress in the log), report what the KV pool can hold;
 *  3. POOL: size the KV pool to the negotiated block count;
 *  4. micro-batches of the joined epoch: apply ops, step, forward.
 *
 * Invariants:
 *  - Ops are applied for every message of the joined epoch, even when an
 *    earlier stage failed its step: every stage validates ops identically, so
 *    block tables stay the same on every stage whatever failed.
 *  - Messages of another epoch are dropped unread: after a restart, or while
 *    the chain re-forms, what sat in the rings belongs to groups ctrld has
 *    already failed.
 *  - Output for group g goes to buffer g of this worker's output area; ctrld
 *    keeps one micro-batch per group in flight, so buffer g is free again
 *    when group g comes back (over the dataplane, once its send completed).
 *  - Up to `depth` micro-batches are in flight at once (the CUDA engine runs
 *    step k+1 queued behind step k, so the GPU never idles while the host
 *    forwards k); they are forwarded strictly in arrival order, ops-only
 *    messages included, so the next stage applies the ops in the order this
 *    one did. An input buffer is released only after its step read it.
 *    Setup and KV messages wait until every micro-batch before them is out.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "kn_model.h"
#include "kn_stage.h"
#include "kvf_config.h"
#include "shm_live.h"
#include "shm_mb.h"
#include "shm_region.h"
#include "worker_cfg.h"
#include "worker_hop.h"
#include "worker_int.h"

static_assert(sizeof(struct kn_column) == SHM_MB_COL_BYTES, "column record size");
static_assert(sizeof(struct kn_op) == SHM_MB_OP_BYTES, "op record size");

volatile sig_atomic_t g_stop;
static volatile sig_atomic_t g_report;

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		g_report = 1;
	else
		g_stop = 1;
}

/* Messages are cut to their buffer on purpose (the wire's error field is
 * fixed): vsnprintf keeps that intent out of -Wformat-truncation. */
void wk_fmt(char *b, size_t n, const char *f, ...)
{
	va_list ap;

	va_start(ap, f);
	vsnprintf(b, n, f, ap);
	va_end(ap);
}

void wk_log(const struct worker *w, int pri, const char *fmt, ...)
{
	char who[SHM_ROLE_MAX + 24];
	va_list ap;

	snprintf(who, sizeof(who), "kvferry-worker[%s]", w->o.role);
	va_start(ap, fmt);
	kvf_vlog(pri, who, fmt, ap);
	va_end(ap);
}

/* @return 1 if a queued micro-batch now owns @p d, else 0 (release it). */
static int handle(struct worker *w, const struct shm_desc *d)
{
	struct shm_mb_hdr *h;

	if (d->off + d->len > shm_region_size(w->reg) || d->len < sizeof(struct shm_mb_hdr)) {
		WK_ERR(w, "dropping a descriptor outside the region (offset %llu, %u bytes)",
		       (unsigned long long)d->off, d->len);
		return 0;
	}
	h = shm_ptr(w->reg, d->off);
	if (h->magic != SHM_MB_MAGIC || !shm_mb_version_ok(h->version)) {
		/* magic, version, status and err sit at frozen offsets: say so in
		 * the message itself when it can still travel on. */
		WK_ERR(w, "refusing a micro-batch message of version %u (magic %08x): this worker speaks "
		       "versions %u..%u: run the same kvferry version on every node", h->version, h->magic,
		       SHM_MB_VERSION_MIN, SHM_MB_VERSION);
		return 0;
	}
	if (h->total_len > d->len) {
		WK_ERR(w, "dropping a truncated message (%u of %u bytes)", d->len, h->total_len);
		return 0;
	}
	if (w->tp.size > 1) {
		/* tensor parallelism: the leader hands every message on, a join
		 * after the group's area is ready for it (worker_tp.c) */
		if (h->kind == SHM_MB_JOIN || h->kind == SHM_MB_POOL) {
			wk_drain(w);
			if (wk_tp_begin(w, h, w->tp.err, sizeof(w->tp.err)) < 0)
				WK_ERR(w, "tensor parallelism: %s", w->tp.err); /* the join answers it */
		}
		wk_tp_forward(w, d);
		if (w->tp.rank > 0 && (h->kind == SHM_MB_JOIN || h->kind == SHM_MB_POOL)) {
			/* a follower answers in the group's area, never in the
			 * message, which the leader fills in and hands on */
			struct shm_mb_hdr *copy = malloc(h->total_len);

			if (copy == NULL) {
				WK_ERR(w, "out of memory for a setup message of %u bytes", h->total_len);
				return 0;
			}
			memcpy(copy, h, h->total_len);
			wk_handle_setup(w, copy, h->total_len);
			free(copy);
			return 0;
		}
	}
	switch (h->kind) {
	case SHM_MB_JOIN:
	case SHM_MB_POOL:
		wk_drain(w); /* the pool may move: nothing may be in flight */
		wk_handle_setup(w, h, d->len);
		return 0;
	case SHM_MB_TOKENS:
	case SHM_MB_HIDDEN:
		return wk_handle_batch(w, h, d->len, d);
	case SHM_MB_KV:
		wk_drain(w); /* an export reads what the steps before it wrote */
		wk_handle_kv(w, h, d->len);
		return 0;
	default:
		WK_ERR(w, "dropping a message of kind %u", h->kind);
		return 0;
	}
}

/* The region file now on disk is not the one we mapped: its owner
 * re-created it, and nothing will ever arrive on our old mapping. */
static int region_replaced(struct worker *w)
{
	uint64_t t = kvf_mono_ns();

	if (t - w->last_stat_ns < 1000000000ull)
		return 0;
	w->last_stat_ns = t;
	/* none under the name: unlinked while its owner shuts down (SIGTERM follows) */
	return shm_region_replaced(w->reg);
}

/* What the worker holds now (SIGUSR1, and at exit): memory and queues, so a
 * test or an operator can tell a leak from a working set. */
static void report(struct worker *w, const char *when)
{
	char hops[160], line[256];
	long rss_kb = -1;
	FILE *f = fopen("/proc/self/status", "r");

	if (f != NULL) {
		while (fgets(line, sizeof(line), f) != NULL)
			if (sscanf(line, "VmRSS: %ld", &rss_kb) == 1)
				break;
		fclose(f);
	}
	wk_hop_report(w->in, w->out, hops, sizeof(hops));
	if (w->trace != NULL)
		fflush(w->trace);
	WK_INFO(w, "report (%s): steps=%llu cols=%llu host_ns=%llu busy_ns=%llu idle_ns=%llu idle_long_ns=%llu "
	        "vmrss_kb=%ld host_us_per_step=%.1f busy_us_per_step=%.1f %s", when, (unsigned long long)w->steps,
	        (unsigned long long)w->cols, (unsigned long long)w->host_ns, (unsigned long long)w->busy_ns,
	        (unsigned long long)w->idle_ns, (unsigned long long)w->idle_long_ns, rss_kb,
	        w->steps ? (double)w->host_ns / 1e3 / (double)w->steps : 0.0,
	        w->steps ? (double)w->busy_ns / 1e3 / (double)w->steps : 0.0, hops);
}

/* --backend cuda: pin the whole region (cudaHostRegister) so hidden rows
 * move by copy-engine DMA straight from the hugepages the rings point into,
 * instead of through the engine's pinned bounce buffer (one extra host copy
 * of every row each step; kernels/cuda/NOTES.md). Registering costs once at
 * start, proportional to the region (page-table walk). @return 0 or -errno. */
static int pin_region(struct worker *w)
{
	char err[512];
	uint64_t t0 = kvf_mono_ns();
	int rc = kn_stage_pin(shm_region_base(w->reg), shm_region_size(w->reg), w->o.cuda_module, err, sizeof(err));

	if (rc == -EIO) {
		WK_ERR(w, "pinning region %s (%zu bytes) failed: %s: check the CUDA driver (nvidia-smi) and "
		       "that the region fits the pinned-memory limit (ulimit -l, LimitMEMLOCK=)", w->o.region,
		       shm_region_size(w->reg), err);
		return rc;
	}
	if (rc < 0) {
		WK_ERR(w, "%s", err);
		return rc;
	}
	w->pinned = 1;
	WK_INFO(w, "pinned region %s for CUDA DMA: %.1f MiB (%s) in %.1f ms", w->o.region,
	        shm_region_size(w->reg) / 1048576.0, shm_region_is_huge(w->reg) ? "hugepages" : "4 KiB pages",
	        (double)(kvf_mono_ns() - t0) / 1e6);
	return 0;
}

static void unpin_region(struct worker *w)
{
	if (w->pinned)
		kn_stage_unpin(shm_region_base(w->reg));
	w->pinned = 0;
}

int main(int argc, char **argv)
{
	struct worker w;
	struct sigaction sa;
	char err[512], tpin[CFG_STRLEN + 16];
	const struct kn_model_config *cfg;
	uint64_t t0;
	int rc = 1, reexec = 0;

	memset(&w, 0, sizeof(w));
	w.idx = -1;
	rc = wk_load_opts(argc, argv, WK_MAX_DEPTH, &w.o, &w.cfg, err, sizeof(err));
	if (rc != 0) {
		cfg_free(w.cfg);
		if (rc > 0)
			return 0;
		kvf_log(KVF_LOG_ERR, "kvferry-worker", "%s", err);
		return 2;
	}
	rc = 1;
	w.depth = w.o.depth;
	if (w.o.trace[0]) {
		/* a diagnostic: each step's times, for lining the device up with a
		 * load generator's clock (scripts/gpu-serve-check TRACE=1) */
		w.trace = fopen(w.o.trace, "w");
		if (w.trace == NULL)
			kvf_log(KVF_LOG_WARNING, "kvferry-worker", "trace %s: %s (no trace)", w.o.trace, strerror(errno));
	}
	/* 1 us timer slack: the futex sleep's wake-up is otherwise late by up to 50 us */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGUSR1, &sa, NULL);
	kvf_log_crash_trace("kvferry-worker"); /* a crash leaves its frames in the journal */
	/* Whoever creates the region (the dataplane, or ctrld on a node without
	 * one) may start after us: wait for it rather than fail. */
	t0 = kvf_mono_ns();
	while ((w.reg = shm_region_attach(w.o.region, err, sizeof(err))) == NULL && errno == ENOENT
	       && !g_stop && kvf_mono_ns() - t0 < (uint64_t)w.o.wait_s * 1000000000ull) {
		struct timespec ts = { 0, 100000000 };

		nanosleep(&ts, NULL);
	}
	if (w.reg == NULL) {
		WK_ERR(&w, "shm_region_attach(%s) failed: %s", w.o.region, err);
		if (w.trace != NULL)
			fclose(w.trace);
		cfg_free(w.cfg);
		return 1;
	}
	w.live = shm_live_register(w.reg, w.o.role);
	if (w.live < 0) {
		WK_ERR(&w, "shm_live_register(%s, %s) failed: %s: too many processes on this region",
		       w.o.region, w.o.role, strerror(-w.live));
		goto out_region;
	}
	if (w.o.backend == KN_BACKEND_CUDA && pin_region(&w) < 0)
		goto out_live;
	t0 = kvf_mono_ns();
	w.m = kn_model_open(w.o.model, err, sizeof(err));
	if (w.m == NULL) {
		WK_ERR(&w, "kn_model_open(%s) failed: %s", w.o.model, err);
		goto out_live;
	}
	cfg = kn_model_config(w.m);
	w.fp = kn_model_fingerprint(w.m);
	WK_INFO(&w, "model %s: %s, %d layers, hidden %d, vocab %d, fingerprint %016" PRIx64 ", opened in %.0f ms",
	        w.o.model, kn_arch_name(cfg->arch), cfg->n_layers, cfg->hidden_size, cfg->vocab_size, w.fp,
	        (double)(kvf_mono_ns() - t0) / 1e6);
	if (wk_tp_init(&w, err, sizeof(err)) < 0) {
		WK_ERR(&w, "tensor parallelism: %s", err);
		wk_tp_close(&w);
		goto out_model;
	}
	w.in = wk_in_open(w.reg, wk_tp_input(&w, tpin, sizeof(tpin)), err, sizeof(err));
	if (w.in == NULL) {
		WK_ERR(&w, "input hop %s: %s", wk_tp_input(&w, tpin, sizeof(tpin)), err);
		goto out_model;
	}
	if (wk_kv_side_open(&w, err, sizeof(err)) < 0) {
		WK_ERR(&w, "KV side rings of %s: %s", w.o.in, err);
		goto out_in;
	}
	w.out = wk_out_open(w.reg, w.o.out, err, sizeof(err));
	if (w.out == NULL) {
		WK_ERR(&w, "output hop %s: %s", w.o.out, err);
		goto out_in;
	}
	WK_INFO(&w, "ready: region %s (%s), in %s, out %s, pid %d, waiting for ctrld's join", w.o.region,
	        shm_region_is_huge(w.reg) ? "hugepages" : "not hugepages", w.o.in, w.o.out, (int)getpid());
	while (!g_stop) {
		struct shm_desc d;
		int got;

		shm_live_beat(w.reg, w.live);
		wk_out_poll(w.out);
		if (w.tp.broken || wk_tp_gone(&w)) {
			WK_WARN(&w, "tensor parallelism: a rank of the stage is gone or did not keep up: starting again "
			        "so that the group rejoins whole");
			reexec = 1;
			break;
		}
		if (g_report) {
			g_report = 0;
			report(&w, "SIGUSR1");
		}
		/* 1. forward every finished micro-batch, oldest first; a KV
		 * message on the side ring goes ahead of the queued ones */
		while (wk_head_ready(&w))
			wk_finish_head(&w);
		if (wk_kv_side_poll(&w) || wk_kvrx_poll(&w) || wk_tp_kv_poll(&w))
			continue;
		/* 2. take the next one while there is room: sleep in the ring's futex
		 * only when nothing is in flight (no spinning on a small machine; the
		 * 200 ms bound keeps the heartbeat fresh and SIGTERM prompt), else
		 * poll, so a message that arrives while the device runs is queued
		 * behind the running step at once */
		if (w.j_n < w.depth) {
			int spin = w.j_n > 0 || kvf_mono_ns() - w.last_done_ns < (uint64_t)w.o.spin_us * 1000u;

			/* the KV rings wake the sleep too: the dataplane, which fills
			 * the stage's own receive route, does not know its input ring */
			struct shm_ring *also[] = { w.kvq, w.rx.q, w.tp.kin };

			got = wk_in_get(w.in, &d, spin ? 0 : 200 * 1000000ll, also, 3);
			if (got > 0) {
				if (!handle(&w, &d))
					wk_in_done(w.in, &d);
				wk_tp_handled(&w);
				continue;
			}
			if (w.j_n == 0) {
				if (spin)
					continue;
				if (region_replaced(&w)) {
					WK_WARN(&w, "region %s was re-created (its owner restarted): restarting to "
					        "attach the new one", w.o.region);
					reexec = 1;
					break;
				}
				continue;
			}
		}
		/* 3. full: wait for the oldest. With KV rings, by polling: a
		 * page copy asked meanwhile runs at once on its own stream beside
		 * the steps (a prefill node's chunks ship while the next ones
		 * run; waiting for a step first made every ship wait a step,
		 * and a prompt's last pages wait for the backlog) */
		if (w.j_n >= w.depth && (w.kvq == NULL && w.rx.q == NULL && w.tp.kin == NULL))
			wk_finish_head(&w);
	}
	wk_drain(&w);
	report(&w, "stopping");
	WK_INFO(&w, "stopping: %llu steps, %llu columns, %.1f ms busy, %.1f us host CPU per step, %llu stale "
	        "messages dropped", (unsigned long long)w.steps, (unsigned long long)w.cols, (double)w.busy_ns / 1e6,
	        w.steps ? (double)w.host_ns / 1e3 / (double)w.steps : 0.0, (unsigned long long)w.dropped);
	rc = 0;
	wk_out_close(w.out);
out_in:
	wk_tp_close(&w);
	wk_kvrx_close(&w);
	shm_ring_close(w.kvq);
	shm_ring_close(w.kvr);
	wk_in_close(w.in);
out_model:
	kn_stage_destroy(w.st);
	kn_model_close(w.m);
	unpin_region(&w);
out_live:
	shm_live_release(w.reg, w.live);
out_region:
	shm_region_detach(w.reg);
	if (w.trace != NULL)
		fclose(w.trace);
	if (reexec) {
		execv("/proc/self/exe", argv);
		WK_ERR(&w, "execv(/proc/self/exe) failed: %s", strerror(errno));
		rc = 1;
	}
	cfg_free(w.cfg);
	return rc;
}
