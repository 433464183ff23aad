/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker chain's join protocol: the JOIN and POOL setup messages ctrld
 * sends down the chain, the stage table it prints, the checks on what comes
 * back (protocol, message version, fingerprint, KV block count), and the
 * synchronous round ctrl_proc_chain_create() runs.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "chain_proc_int.h"
#include "kn_model.h"
#include "shm_mb.h"
#include "shm_region.h"
#include "shm_ring.h"

int pc_send_setup(struct proc_chain *c, enum shm_mb_kind kind)
{
	struct shm_mb_hdr *h;
	struct shm_mb_setup *s;
	struct shm_desc d;

	c->setup_flip ^= 1;
	h = pc_buf_at(c, c->o.max_groups + c->setup_flip);
	memset(h, 0, shm_mb_size(SHM_MB_JOIN, 0, 0, 0));
	h->magic = SHM_MB_MAGIC;
	/* The setup layout is the same in every version: the oldest one lets
	 * a stage of any version we read answer the join with its version. */
	h->version = SHM_MB_VERSION_MIN;
	h->kind = (uint16_t)kind;
	h->epoch = c->epoch;
	h->seq = ++c->seq;
	h->n_stages = c->o.n_stages;
	h->total_len = (uint32_t)shm_mb_size(SHM_MB_JOIN, 0, 0, 0);
	s = shm_mb_payload(h);
	s->proto = SHM_MB_PROTO;
	s->n_stages = c->o.n_stages;
	s->fingerprint = c->fp;
	s->n_slots = c->o.stage.n_slots;
	s->max_blocks_per_slot = c->o.stage.max_blocks_per_slot;
	s->n_blocks = kind == SHM_MB_POOL ? c->n_blocks : (c->n_blocks > 0 ? -1 : c->o.stage.n_blocks);
	s->max_groups = c->o.max_groups;
	s->max_cols = c->max_cols;
	s->max_ops = c->max_ops;
	for (int32_t p = 0; p < c->o.stage.n_plans && p < SHM_MB_MAX_PLANS; p++)
		shm_mb_setup_set_plan(s, p, c->o.stage.plan_widths[p]);
	s->n_plans = c->o.stage.n_plans;
	s->n_threads = c->o.stage.n_threads;
	s->kv_budget_bytes = c->o.stage.kv_budget_bytes;
	s->kv_mem_fraction = c->o.stage.kv_mem_fraction;
	for (int32_t k = 0; k < c->o.n_stages; k++) {
		if (kind == SHM_MB_POOL)
			s->stage[k] = c->st[k]; /* the joined reports; each stage updates its own */
		s->stage[k].status = 0;
		s->stage[k].err[0] = '\0';
		s->stage[k].layer_start = k == 0 ? 0 : c->ends[k - 1];
		s->stage[k].layer_end = c->ends[k];
		if (kind == SHM_MB_JOIN) {
			s->stage[k].node = -1;
			s->stage[k].live_slot = -1;
		}
	}
	d = (struct shm_desc){ .off = shm_off(c->reg, h), .len = h->total_len, .type = h->kind,
			       .seq = h->seq };
	if (shm_ring_enqueue_burst(c->first, &d, 1) != 1)
		return -EBUSY;
	c->setup_sent_ns = kvf_mono_ns();
	return 0;
}

void pc_print_table(struct proc_chain *c, const char *what)
{
	const struct kn_model_config *cfg = kn_model_config(c->m);

	fprintf(c->log, "chain: %s: %d stages of %s (%s, %d layers, fingerprint %016" PRIx64 "), epoch %llu\n",
		what, c->o.n_stages, kn_model_dir(c->m), kn_arch_name(cfg->arch), cfg->n_layers, c->fp,
		(unsigned long long)c->epoch);
	fprintf(c->log, "  %-5s %-10s %-4s %-8s %-9s %-7s %-11s %-10s %-9s %s\n", "stage", "role", "node",
		"pid", "layers", "backend", "weights", "KV blocks", "load", "status");
	for (int32_t k = 0; k < c->o.n_stages; k++) {
		const struct shm_mb_stage *s = &c->st[k];
		char node[8], layers[24];

		snprintf(node, sizeof(node), s->node < 0 ? "-" : "%d", s->node);
		snprintf(layers, sizeof(layers), "%d..%d", s->layer_start, s->layer_end);
		fprintf(c->log, "  %-5d %-10s %-4s %-8d %-9s %-7s %7.1f MiB %-10d %6.0f ms %s\n", k,
			s->role[0] ? s->role : "?", node, s->pid, layers, s->backend[0] ? s->backend : "?",
			s->weight_bytes / 1048576.0, s->n_blocks, s->load_ns / 1e6,
			s->pid == 0 ? "no answer" : s->status == 0 ? "ok" : s->err);
	}
	fflush(c->log);
}

/* A setup message came back. @return 1 done (ok), 0 ignored, -errno refused. */
int pc_setup_reply(struct proc_chain *c, struct shm_mb_hdr *h, char *err, size_t errlen)
{
	struct shm_mb_setup *s = shm_mb_payload(h);
	int32_t least = -1;
	uint32_t wire = SHM_MB_VERSION;

	if (h->epoch != c->epoch || h->stage != c->o.n_stages)
		return 0;
	if ((c->state == PC_JOINING && h->kind != SHM_MB_JOIN)
	    || (c->state == PC_POOLING && h->kind != SHM_MB_POOL))
		return 0;
	memcpy(c->st, s->stage, sizeof(c->st));
	for (int32_t k = 0; k < c->o.n_stages; k++) {
		const struct shm_mb_stage *e = &s->stage[k];

		if (e->pid != 0 && e->fingerprint != c->fp) {
			pc_fmt(err, errlen, "stage %d (%s, pid %d) refused the join: it %s; ctrld serves %s "
			       "(fingerprint %016" PRIx64 "): give every worker the same model directory", k, e->role,
			       e->pid, e->err[0] ? e->err : "holds another model", kn_model_dir(c->m), c->fp);
			return -EPROTO;
		}
		if (e->status < 0) {
			pc_fmt(err, errlen, "stage %d (%s, pid %d) refused the %s: %s", k, e->role, e->pid,
			       h->kind == SHM_MB_JOIN ? "join" : "pool", e->err);
			return e->status;
		}
		if (e->proto != SHM_MB_PROTO || !shm_mb_version_ok(e->mb_version)) {
			pc_fmt(err, errlen, "stage %d (%s, pid %d) speaks chain protocol %u / message version %u, "
			       "ctrld %u / %u..%u: run the same kvferry version on every node", k, e->role, e->pid,
			       e->proto, e->mb_version, SHM_MB_PROTO, SHM_MB_VERSION_MIN, SHM_MB_VERSION);
			return -EPROTO;
		}
		if (e->mb_version < wire)
			wire = e->mb_version;
		if (e->fingerprint != c->fp) {
			pc_fmt(err, errlen, "stage %d (%s, pid %d) holds model fingerprint %016" PRIx64 ", ctrld "
			       "serves %s (fingerprint %016" PRIx64 "): give every worker the same model directory",
			       k, e->role, e->pid, e->fingerprint, kn_model_dir(c->m), c->fp);
			return -EPROTO;
		}
		if (least < 0 || e->n_blocks < least)
			least = e->n_blocks;
	}
	if (h->status < 0) {
		pc_fmt(err, errlen, "%s", h->err);
		return h->status;
	}
	if (h->kind == SHM_MB_JOIN) {
		if (wire < SHM_MB_VERSION && c->wire_version != wire)
			fprintf(c->log, "chain: a stage speaks message version %u: micro-batches go out in "
				"version %u, without top logprobs, until every worker runs version %u\n", wire,
				wire, SHM_MB_VERSION);
		c->wire_version = (uint16_t)wire;
		if (c->n_blocks > 0 && least < c->n_blocks) {
			pc_fmt(err, errlen, "a re-joined stage holds only %d KV blocks, the chain runs with %d: give "
			       "it the same KV budget as before", least, c->n_blocks);
			return -ENOSPC;
		}
		if (c->n_blocks <= 0)
			c->n_blocks = least;
		if (c->n_blocks < 1) {
			pc_fmt(err, errlen, "the stages hold no KV block: raise kv_memory (CPU) or kv_mem_fraction");
			return -ENOSPC;
		}
		return 1;
	}
	for (int32_t k = 0; k < c->o.n_stages; k++)
		if (s->stage[k].n_blocks != c->n_blocks) {
			pc_fmt(err, errlen, "stage %d (%s) holds %d KV blocks after the pool message, not %d", k,
			       s->stage[k].role, s->stage[k].n_blocks, c->n_blocks);
			return -EPROTO;
		}
	return 1;
}

/* Run one setup round synchronously (create()). @return 0 or -errno with @p err. */
int pc_setup_sync(struct proc_chain *c, enum shm_mb_kind kind, char *err, size_t errlen)
{
	uint64_t t0 = kvf_mono_ns(), deadline = t0 + c->o.join_timeout_ms * 1000000ull;
	int rc;

	c->state = kind == SHM_MB_JOIN ? PC_JOINING : PC_POOLING;
	while ((rc = pc_send_setup(c, kind)) == -EBUSY && kvf_mono_ns() < deadline)
		pc_sleep_us(1000);
	if (rc < 0) {
		pc_fmt(err, errlen, "ring %s stays full: is stage 0's worker running on region %s?",
		       c->o.first_ring, c->o.region);
		return -ETIMEDOUT;
	}
	while (kvf_mono_ns() < deadline) {
		rc = pc_drain(c, err, errlen);
		if (rc != 0)
			return rc < 0 ? rc : 0;
		/* A message the dataplane took before its peer was up can be lost
		 * with no completion we see here: ask again (stages answer a
		 * repeated setup message the same way; extra answers are ignored). */
		if (kvf_mono_ns() - c->setup_sent_ns > PC_RESEND_NS && shm_ring_count(c->first) == 0)
			pc_send_setup(c, kind);
		/* Idle wait: the ring's futex when we own the return ring. */
		shm_ring_wait(c->ret, 50 * 1000000ll);
	}
	pc_print_table(c, "no answer");
	pc_fmt(err, errlen, "no %s answer from the chain within %llu ms: start a kvferry-worker for each of "
	       "the %d stages (stage 0 reads ring %s of region %s), or raise join_timeout",
	       kind == SHM_MB_JOIN ? "join" : "pool", (unsigned long long)c->o.join_timeout_ms, c->o.n_stages,
	       c->o.first_ring, c->o.region);
	return -ETIMEDOUT;
}
