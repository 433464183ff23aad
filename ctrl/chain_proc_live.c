/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker chain's failure handling: liveness (each stage's heartbeat
 * slot, this node's dataplane's, the dataplane's peer events, the group
 * timeout), a region its dataplane created again (re-attached), going down
 * (fail the groups in flight, bump the epoch, send a JOIN) and re-forming
 * (JOIN answered, then POOL; every slot touched before is tainted), and
 * whether the chain can compute meanwhile (pc_ready: the scheduler holds its
 * requests for a replay until it can).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "chain_proc_int.h"
#include "kvf_log.h"
#include "dp_ipc.h"
#include "shm_live.h"
#include "shm_mb.h"
#include "shm_ring.h"

static void go_down(struct proc_chain *c, const char *why)
{
	pc_fmt(c->down_why, sizeof(c->down_why), "%s", why);
	c->down_ns = kvf_mono_ns();
	pc_log(c, KVF_LOG_ERR, "chain: %s: failing the groups in flight; the chain re-forms when every stage "
	       "answers again", why);
	fflush(c->log);
	for (int32_t i = 0; i < c->o.max_groups; i++) {
		struct pc_grp *g = &c->g[i];

		if (g->busy && !g->done) {
			g->out.status = -EPIPE;
			pc_fmt(g->out.err, sizeof(g->out.err), "%s", why);
			pc_push_done(c, (uint32_t)i);
		}
	}
	c->epoch++;
	c->state = PC_JOINING;
	c->setup_sent_ns = 0;
	pc_send_setup(c, SHM_MB_JOIN);
}

/* This node's kvferry-dataplane: the live slot of role "dataplane" whose pid
 * is alive (a killed one's slot stays behind, dead, until it is reused). */
void pc_region_seen(struct proc_chain *c)
{
	c->dp_slot = -1;
	c->dp_pid = 0;
	if (c->ev == NULL)
		return; /* no dataplane on this region */
	c->dp_slot = shm_live_find_alive(c->reg, "dataplane", &c->dp_pid);
	if (c->dp_slot < 0)
		c->dp_slot = -1;
}

/* The dataplane that created our region made it again (it restarted): what
 * we map is an orphan nothing reads. Attach the new one, open its rings,
 * pools and buffers, and go down, so the JOIN leaves on the new first ring
 * (the stages' workers re-execute themselves when their region is re-created
 * and find it there). Before this ctrld kept the old mapping, and its chain
 * never re-formed after a restart of its own node's dataplane (the fault
 * drill's local-dataplane-kill: every request failed until ctrld restarted).
 * The new region may still be filling (its creator renames it into place
 * before it adds its rings): a failed attempt keeps the old one and is
 * retried at the next check. */
static void reattach(struct proc_chain *c)
{
	char err[CTRL_CHAIN_ERRLEN], why[CTRL_CHAIN_ERRLEN];
	struct shm_region *old = c->reg;
	struct shm_ring *first = c->first, *ret = c->ret, *ev = c->ev;
	struct shm_pool *rxs = c->rx_small, *rxl = c->rx_large;
	uint64_t out_off = c->out_off;
	int rc;

	c->reg = shm_region_attach(c->o.region, err, sizeof(err));
	if (c->reg != NULL) {
		c->first = c->ret = c->ev = NULL;
		c->rx_small = c->rx_large = NULL;
		rc = pc_open_shm(c, err, sizeof(err));
		if (rc == 0)
			goto swapped;
		pc_close_shm(c);
		shm_region_detach(c->reg);
	}
	pc_log(c, KVF_LOG_WARNING, "chain: region %s was re-created; not attached yet: %s (retrying)", c->o.region,
	       err);
	c->reg = old;
	c->first = first;
	c->ret = ret;
	c->ev = ev;
	c->rx_small = rxs;
	c->rx_large = rxl;
	c->out_off = out_off;
	return;
swapped:
	shm_ring_close(first);
	shm_ring_close(ret);
	shm_ring_close(ev);
	shm_pool_close(rxs);
	shm_pool_close(rxl);
	if (old != c->lent)
		shm_region_detach(old);
	pc_region_seen(c);
	pc_fmt(why, sizeof(why), "region %s was re-created (this node's kvferry-dataplane restarted): ctrld "
	       "attached the new one", c->o.region);
	go_down(c, why);
}

void pc_check_live(struct proc_chain *c, uint64_t now)
{
	struct shm_desc ev;

	if (now - c->last_live_ns < PC_LIVE_EVERY_NS)
		return;
	c->last_live_ns = now;
	if (!c->created && now - c->last_region_ns >= PC_REGION_EVERY_NS) {
		c->last_region_ns = now;
		if (shm_region_replaced(c->reg))
			reattach(c);
	}
	/* a region the dataplane re-created may have had no event ring yet when
	 * ctrld attached it (its creator adds the rings after the rename): look
	 * again, or its events (a peer's process died, a peer restarted) would
	 * pile up unread and their news be lost (the PD drill's decode-dataplane-kill
	 * row then left "dp.ev 1" on the ring, and every later row too) */
	if (c->ev == NULL)
		c->ev = shm_ring_lookup(c->reg, DP_RING_EV);
	if (c->dp_slot < 0 && c->ev != NULL)
		pc_region_seen(c);
	if (c->dp_slot >= 0) {
		if (shm_live_gone(c->reg, c->dp_slot, c->dp_pid)) {
			char why[CTRL_CHAIN_ERRLEN];

			pc_fmt(why, sizeof(why), "this node's kvferry-dataplane (pid %d) died: every stage is "
			       "unreachable until it is back", c->dp_pid);
			c->dp_slot = -1;
			if (c->state == PC_UP)
				go_down(c, why);
		}
	}
	for (int32_t k = 0; k < c->o.n_stages && c->state == PC_UP; k++) {
		const struct shm_mb_stage *s = &c->st[k];
		struct shm_live_info li;
		int rc;

		if (s->live_slot < 0)
			continue;
		rc = shm_live_check(c->reg, s->live_slot, c->o.stale_ms * 1000000ull, &li);
		/* Known to be this node's since the chain came up (pc_note_live()):
		 * its slot released or taken by another role means it is gone. (A
		 * worker that starts again releases its slot and may register in
		 * another one, and another process may take the old one: skipping
		 * a slot whose role no longer matched left that restart to the
		 * group timeout, 30 s.) Else a slot of this region with the
		 * stage's role: the stage is on this node. */
		int ours = c->live_epoch[k] != 0;
		int same_role = strncmp(li.role, s->role, sizeof(li.role)) == 0;

		if (!ours && !same_role)
			continue;
		if (rc == SHM_LIVE_DEAD || rc == SHM_LIVE_EMPTY || !same_role || (rc >= 0 && li.pid != s->pid)
		    || (ours && li.epoch != c->live_epoch[k])) {
			char why[CTRL_CHAIN_ERRLEN];
			const char *what = "died";

			if (rc == SHM_LIVE_EMPTY || (!same_role && rc != SHM_LIVE_DEAD))
				what = "left (it exited, or started again under a new registration)";
			else if (rc >= 0 && rc != SHM_LIVE_DEAD && li.pid == s->pid)
				/* the same pid registered anew: it started again (execv), e.g. a
				 * tensor-parallel group that lost a rank; what it had in flight is lost */
				what = "started again";
			pc_fmt(why, sizeof(why), "stage %d (%s, pid %d, layers %d..%d) %s", k, s->role, s->pid,
			       s->layer_start, s->layer_end, what);
			c->stage_up[k] = 0;
			go_down(c, why);
		}
	}
	while (c->ev != NULL && shm_ring_dequeue_burst(c->ev, &ev, 1) == 1) {
		uint16_t peer = DP_AUX_PEER(ev.aux);

		if (ev.type == DP_EV_PEER_PROC_DEAD) {
			/* a process of that node died: the stage whose worker it was is lost
			 * (found in ~0.1 s where the group timeout took 30 s) */
			for (int32_t k = 0; k < c->o.n_stages; k++)
				if (c->st[k].node == (int32_t)peer && c->st[k].pid == (int32_t)ev.len
				    && c->state == PC_UP) {
					char why[CTRL_CHAIN_ERRLEN];

					pc_fmt(why, sizeof(why), "stage %d (%s, pid %d on node %u, layers %d..%d) died, "
					       "as the dataplane of its node reports", k, c->st[k].role, c->st[k].pid, peer,
					       c->st[k].layer_start, c->st[k].layer_end);
					c->stage_up[k] = 0;
					go_down(c, why);
				}
			continue;
		}
		if (ev.type != DP_EV_PEER_DEAD && ev.type != DP_EV_PEER_RESTART && ev.type != DP_EV_PEER_SILENT)
			continue;
		for (int32_t k = 0; k < c->o.n_stages; k++)
			if (c->st[k].node == (int32_t)peer && c->state == PC_UP) {
				char why[CTRL_CHAIN_ERRLEN];

				pc_fmt(why, sizeof(why), "the dataplane reports node %u %s: stage %d (%s, layers %d..%d) "
				       "lost", peer, ev.type == DP_EV_PEER_DEAD ? "dead" : ev.type == DP_EV_PEER_SILENT ? "silent"
				       : "restarted", k, c->st[k].role,
				       c->st[k].layer_start, c->st[k].layer_end);
				c->stage_up[k] = 0;
				go_down(c, why);
			}
	}
	if (c->state == PC_UP && c->o.group_timeout_ms > 0)
		for (int32_t i = 0; i < c->o.max_groups; i++) {
			struct pc_grp *g = &c->g[i];

			if (g->busy && !g->done && now - g->t_submit > c->o.group_timeout_ms * 1000000ull) {
				char why[CTRL_CHAIN_ERRLEN];

				pc_fmt(why, sizeof(why), "group %d got no result within group_timeout %llu ms: a stage "
				       "is dead or wedged", i, (unsigned long long)c->o.group_timeout_ms);
				go_down(c, why);
				break;
			}
		}
}

/* Re-forming after a death: resend JOIN when it got lost, then POOL. */
void pc_rejoin_step(struct proc_chain *c, uint64_t now)
{
	char err[CTRL_CHAIN_ERRLEN];
	int rc = pc_drain(c, err, sizeof(err));

	if (rc < 0) {
		/* A refusal is often a straggler: the POOL meant for a worker that
		 * joined and was killed, reaching its successor, which had not
		 * joined. A fresh epoch makes the next attempt's replies its own
		 * (what is still in flight of this one is ignored), and the retry
		 * comes soon, backing off towards PC_REJOIN_NS for a refusal that
		 * stays (another model, say). */
		c->rejoin_wait_ns = c->rejoin_wait_ns ? c->rejoin_wait_ns * 2 : PC_REJOIN_FIRST_NS;
		if (c->rejoin_wait_ns > PC_REJOIN_NS)
			c->rejoin_wait_ns = PC_REJOIN_NS;
		pc_log(c, KVF_LOG_WARNING, "chain: re-forming refused: %s (retrying in %.1f s)", err,
		       c->rejoin_wait_ns / 1e9);
		c->epoch++;
		c->state = PC_JOINING;
		c->setup_sent_ns = now;
		return;
	}
	if (rc > 0) {
		if (c->state == PC_JOINING) {
			c->state = PC_POOLING;
			pc_send_setup(c, SHM_MB_POOL);
			return;
		}
		/* Every stage cleared its tables: every slot used before is tainted. */
		for (int32_t i = 0; i < c->info.n_slots; i++) {
			c->tainted[i] |= c->touched[i];
			c->touched[i] = 0;
		}
		for (int32_t k = 0; k < c->o.n_stages; k++)
			c->stage_up[k] = 1;
		c->state = PC_UP;
		pc_note_live(c);
		c->rejoin_wait_ns = 0;
		pc_print_table(c, "re-formed");
		return;
	}
	/* a JOIN again when the last got lost (after the wait, once stage 0
	 * took everything queued to it) or was refused (after its back-off);
	 * a stage 0 that takes nothing for PC_REJOIN_FORCE_NS is sent one anyway */
	uint64_t wait = c->rejoin_wait_ns ? c->rejoin_wait_ns : PC_REJOIN_NS;
	if (c->setup_sent_ns == 0 || (now - c->setup_sent_ns > wait && shm_ring_count(c->first) == 0)
	    || now - c->setup_sent_ns > PC_REJOIN_FORCE_NS) {
		if (c->state == PC_POOLING)
			c->state = PC_JOINING;
		if (pc_send_setup(c, SHM_MB_JOIN) < 0)
			c->setup_sent_ns = now;
	}
}

void pc_note_live(struct proc_chain *c)
{
	for (int32_t k = 0; k < c->o.n_stages; k++) {
		const struct shm_mb_stage *s = &c->st[k];
		struct shm_live_info li;

		c->live_epoch[k] = 0;
		if (s->live_slot < 0 || shm_live_check(c->reg, s->live_slot, UINT64_MAX, &li) < 0)
			continue;
		/* a slot of this region with the stage's role and pid: the stage is on this node */
		if (strncmp(li.role, s->role, sizeof(li.role)) == 0 && li.pid == s->pid)
			c->live_epoch[k] = li.epoch;
	}
}

int pc_ready(struct ctrl_chain *cc, char *why, size_t whylen)
{
	struct proc_chain *c = (struct proc_chain *)cc;
	int up;

	pthread_mutex_lock(&c->mu);
	up = c->state == PC_UP;
	if (!up && why != NULL && whylen > 0)
		pc_fmt(why, whylen, "%s", c->down_why);
	pthread_mutex_unlock(&c->mu);
	return up;
}
