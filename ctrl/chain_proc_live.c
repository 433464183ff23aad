/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker chain's failure handling: liveness (each stage's heartbeat
 * slot, the dataplane's peer events, the group timeout), going down (fail
 * the groups in flight, bump the epoch, send a JOIN) and re-forming (JOIN
 * answered, then POOL; every slot touched before is tainted), and whether
 * the chain can compute meanwhile (pc_ready: the scheduler holds its
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

void pc_check_live(struct proc_chain *c, uint64_t now)
{
	struct shm_desc ev;

	if (now - c->last_live_ns < PC_LIVE_EVERY_NS)
		return;
	c->last_live_ns = now;
	for (int32_t k = 0; k < c->o.n_stages && c->state == PC_UP; k++) {
		const struct shm_mb_stage *s = &c->st[k];
		struct shm_live_info li;
		int rc;

		if (s->live_slot < 0)
			continue;
		rc = shm_live_check(c->reg, s->live_slot, c->o.stale_ms * 1000000ull, &li);
		/* A slot of this region with the stage's role: the stage is on this node. */
		if (strncmp(li.role, s->role, sizeof(li.role)) != 0)
			continue;
		if (rc == SHM_LIVE_DEAD || rc == SHM_LIVE_EMPTY || (rc >= 0 && li.pid != s->pid)) {
			char why[CTRL_CHAIN_ERRLEN];

			pc_fmt(why, sizeof(why), "stage %d (%s, pid %d, layers %d..%d) died", k, s->role, s->pid,
			       s->layer_start, s->layer_end);
			c->stage_up[k] = 0;
			go_down(c, why);
		}
	}
	while (c->ev != NULL && shm_ring_dequeue_burst(c->ev, &ev, 1) == 1) {
		uint16_t peer = DP_AUX_PEER(ev.aux);

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
		pc_log(c, KVF_LOG_WARNING, "chain: re-forming refused: %s (retrying)", err);
		c->state = PC_JOINING;
		c->setup_sent_ns = now; /* retry after the interval */
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
		pc_print_table(c, "re-formed");
		return;
	}
	if (c->setup_sent_ns == 0 || (now - c->setup_sent_ns > PC_REJOIN_NS && shm_ring_count(c->first) == 0)) {
		if (c->state == PC_POOLING)
			c->state = PC_JOINING;
		if (pc_send_setup(c, SHM_MB_JOIN) < 0)
			c->setup_sent_ns = now;
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
