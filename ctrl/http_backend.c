/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The scheduler (ctrl_sched.h) behind the HTTP layer's backend interface.
 * submit/cancel are the dispatcher's thread-safe entry points; the token
 * callback the HTTP layer passes runs on the scheduler thread and only
 * queues (http_openai.c), so nothing here blocks that thread.
 */
#include "ctrl_http.h"

static int64_t be_submit(void *ctx, const struct ctrl_request *r)
{
	return ctrl_dispatch_submit(ctx, r);
}

static int be_cancel(void *ctx, uint64_t id)
{
	return ctrl_dispatch_cancel(ctx, id);
}

static int be_flush(void *ctx)
{
	return ctrl_dispatch_flush_prefix(ctx);
}

static json_t *be_stats(void *ctx)
{
	return ctrl_http_sched_stats_json(ctx);
}

static int32_t be_admissible(void *ctx, int32_t n_prompt, int32_t max_tokens, char *err, size_t errlen)
{
	return ctrl_dispatch_admissible(ctx, n_prompt, max_tokens, err, errlen);
}

void ctrl_http_backend_sched(struct ctrl_http_backend *be, struct ctrl_dispatch *d)
{
	be->submit = be_submit;
	be->submit_pd = NULL;
	be->cancel = be_cancel;
	be->stats = be_stats;
	be->ctx = d;
	be->ready = NULL;
	be->ready_ctx = NULL;
	be->admissible = be_admissible;
	be->admit_ctx = d;
	be->node_stats = NULL;
	be->node_ctx = NULL;
	be->flush = be_flush;
	be->flush_ctx = d;
}

static json_t *replica_json(const struct ctrl_sched_stats *st)
{
	json_t *stages = json_array(), *plans, *r;

	for (int i = 0; i < st->n_stages && i < CTRL_CHAIN_MAX_STAGES; i++)
		json_array_append_new(stages, json_pack("{s:I, s:I, s:f, s:f}",
			"steps_total", (json_int_t)st->stage[i].steps, "cols_total", (json_int_t)st->stage[i].cols,
			"mean_step_us", st->stage[i].mean_step_us, "busy_frac", st->stage[i].busy_frac));
	r = json_pack("{s:i, s:i, s:f, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
		"n_stages", st->n_stages, "n_groups", st->n_groups,
		"occupancy", st->occupancy, "ideal_occupancy", st->ideal_occupancy,
		"mean_round_trip_us", st->mean_round_trip_us,
		"launches_total", (json_int_t)st->launches, "launched_cols_total", (json_int_t)st->launched_cols,
		"prefill_cols_total", (json_int_t)st->prefill_cols, "submitted_total", (json_int_t)st->submitted,
		"admitted_total", (json_int_t)st->admitted, "rejected_total", (json_int_t)st->rejected,
		"finished_total", (json_int_t)st->finished, "cancelled_total", (json_int_t)st->cancelled,
		"errors_total", (json_int_t)st->errors, "tokens_total", (json_int_t)st->tokens);
	json_object_update_new(r, json_pack("{s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:I, s:o}",
		"queued", st->queued, "live", st->live, "blocks_total", st->blocks_total,
		"blocks_in_use", st->blocks_in_use, "blocks_reserved", st->blocks_reserved,
		"spec_rounds_total", (json_int_t)st->spec_rounds, "spec_drafted_total", (json_int_t)st->spec_drafted,
		"spec_acceptance", st->spec_acceptance, "lookup_hits_total", (json_int_t)st->lookup_hits,
		"max_ready_wait", (json_int_t)st->max_ready_wait, "queued_bytes", (json_int_t)st->queued_bytes,
		"live_bytes", (json_int_t)st->live_bytes, "lookup_tries_total", (json_int_t)st->lookup_tries,
		"stages", stages));
	json_object_set_new(r, "prefill_shared_tokens_total", json_integer((json_int_t)st->prefill_shared_tokens));
	json_object_update_new(r, json_pack("{s:i, s:I, s:I}", "blocks_cached", st->blocks_cached,
		"prefix_hit_tokens_total", (json_int_t)st->prefix_hit_tokens,
		"prefix_flushes_total", (json_int_t)st->prefix_flushes));
	plans = json_array();
	for (int32_t k = 0; k < st->n_plans; k++)
		json_array_append_new(plans, json_pack("{s:i, s:f, s:I}", "width", st->plan_width[k],
			"mean_step_us", st->plan_step_us[k], "steps_total", (json_int_t)st->plan_steps[k]));
	json_object_update_new(r, json_pack("{s:I, s:I, s:i}",
		"requests_replayed_total", (json_int_t)st->replayed,
		"replay_failures_total", (json_int_t)st->replay_failures, "replaying", st->replaying));
	json_object_set_new(r, "prefill_pipelined_total", json_integer((json_int_t)st->prefill_pipelined));
	json_object_set_new(r, "requests_moved_out_total", json_integer((json_int_t)st->moved_out));
	json_object_update_new(r, json_pack("{s:I, s:f, s:f, s:o}",
		"prefill_capped_total", (json_int_t)st->prefill_capped,
		"step_fixed_us", st->step_fixed_us, "step_col_us", st->step_col_us, "plans", plans));
	return r;
}

json_t *ctrl_http_sched_stats_json(struct ctrl_dispatch *d)
{
	json_t *reps = json_array();
	int n = ctrl_dispatch_count(d);
	int64_t live = 0, queued = 0, replaying = 0, replayed = 0, moved = 0;

	for (int i = 0; i < n; i++) {
		struct ctrl_sched_stats st;
		if (ctrl_sched_stats(ctrl_dispatch_replica(d, i), &st))
			continue;
		live += st.live;
		queued += st.queued;
		replaying += st.replaying;
		replayed += (int64_t)st.replayed;
		moved += (int64_t)st.moved_out;
		json_array_append_new(reps, replica_json(&st));
	}
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:o}", "live", (json_int_t)live, "queued", (json_int_t)queued,
			 "replaying", (json_int_t)replaying, "requests_replayed_total", (json_int_t)replayed,
			 "requests_moved_total", (json_int_t)moved, "replicas", reps);
}
