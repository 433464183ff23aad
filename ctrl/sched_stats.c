/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The scheduler's counters: the scheduler thread keeps them in s->st and
 * publishes a copy (with the chain's stage counters and the step model) at
 * the end of every poll that did work; ctrl_sched_stats() reads that copy
 * from any thread.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "ctrl_sched.h"
#include "sched_int.h"
#include "shm_blkpool.h"

void sched_publish(struct ctrl_sched *s)
{
	struct ctrl_chain_stats cs;
	struct ctrl_sched_stats *st = &s->st;
	double busy = 0.0;

	st->n_groups = s->n_groups;
	st->queued = s->n_queued;
	st->replaying = s->n_replaying;
	st->live = s->n_live;
	st->blocks_total = s->n_blocks;
	/* idle cached blocks are not in use: any allocation takes them back */
	st->blocks_in_use = s->n_blocks - shm_blkpool_available(s->pool) - s->pfx.n_idle;
	st->blocks_reserved = s->reserved;
	st->blocks_cached = s->pfx.n_idle;
	st->queued_bytes = s->queued_bytes;
	st->live_bytes = s->live_bytes;
	st->mean_round_trip_us = s->rt_n ? (double)s->rt_ns / (double)s->rt_n / 1000.0 : 0.0;
	st->kv_held_blocks = s->n_held_blocks;
	st->step_fixed_us = s->fit.fitted ? s->fit.a / 1000.0 : 0.0;
	st->step_col_us = s->fit.fitted ? s->fit.b / 1000.0 : 0.0;
	st->n_plans = s->fit.n_plans;
	for (int32_t k = 0; k < s->fit.n_plans; k++) {
		st->plan_width[k] = s->fit.plan[k];
		st->plan_step_us[k] = s->fit.plan_ns[k] / 1000.0;
		st->plan_steps[k] = s->fit.plan_n[k];
	}
	st->spec_acceptance = st->spec_drafted ? (double)st->spec_accepted / (double)st->spec_drafted : 0.0;
	if (ctrl_chain_stats(s->chain, &cs) == 0) {
		st->n_stages = cs.n_stages;
		for (int32_t k = 0; k < cs.n_stages && k < CTRL_CHAIN_MAX_STAGES; k++) {
			const struct ctrl_chain_stage_stats *c = &cs.stage[k];

			st->stage[k].steps = c->steps;
			st->stage[k].cols = c->cols;
			st->stage[k].mean_step_us = c->steps ? (double)c->busy_ns / (double)c->steps / 1000.0 : 0.0;
			st->stage[k].busy_frac = cs.elapsed_ns ? (double)c->busy_ns / (double)cs.elapsed_ns : 0.0;
			busy += (double)c->busy_ns;
		}
		st->occupancy = cs.elapsed_ns && cs.n_stages
			? busy / ((double)cs.n_stages * (double)cs.elapsed_ns) : 0.0;
		st->ideal_occupancy = st->launches
			? (double)st->launches / (double)(st->launches + (uint64_t)cs.n_stages - 1) : 0.0;
	}
	pthread_mutex_lock(&s->st_lock);
	s->pub = *st;
	pthread_mutex_unlock(&s->st_lock);
}

int ctrl_sched_stats(struct ctrl_sched *s, struct ctrl_sched_stats *st)
{
	pthread_mutex_lock(&s->st_lock);
	*st = s->pub;
	pthread_mutex_unlock(&s->st_lock);
	return 0;
}

double ctrl_sched_load(struct ctrl_sched *s)
{
	return (double)atomic_load_explicit(&s->load, memory_order_relaxed) / (double)s->n_blocks;
}
