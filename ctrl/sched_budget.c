/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The step budget: how many prompt positions may ride with a launch's
 * decodes so that the launch stays within step_budget times what the
 * decodes alone would take.
 *
 * Every decoding sequence waits for the whole launch it rides in, so the
 * prompt positions beside it are what its inter-token latency pays for.
 * A fixed column cap cannot serve every load: wide enough for 256 decodes
 * and the prompts arriving beside them, it lets a launch with 64 decodes
 * carry 512 prompt positions (2.5 x the decode step on an H200, 1B);
 * narrow enough for 64, it starves prefill at 256. The cap here is by time.
 *
 * Model: the chain reports each group's step time (the slowest stage's;
 * a GPU worker measures it on its device). A launch runs in the narrowest
 * plan that holds it, so its time is that plan's: each plan keeps a moving
 * average of its step times, and a launch may grow to the widest plan
 * whose time is within the budget of the decodes' own plan — filling the
 * padding of that plan with prompt positions, which costs nothing. A plan
 * not measured yet is predicted by an exponentially weighted least-squares
 * line t = a + b n over recent launches (weight SCHED_FIT_DECAY each); with
 * no line either it is tried (the only way to measure it). A chain whose
 * plans are not known gets the line alone.
 *
 * Measured on the H200 (1B, 64 clients): plans 64 / 128 / 256 / 512 took
 * 1.57 / 1.78 / 2.28 / 3.92 ms. A straight line through them capped a
 * launch at ~140 columns, which then padded to 256: prefill crawled (TTFT
 * p50 117 ms) for time the GPU spent anyway.
 */
#include <math.h>

#include "ctrl_sched.h"
#include "sched_int.h"

#define SCHED_FIT_DECAY 0.98
#define SCHED_FIT_MIN_N 8
/* weighted variance of the widths (columns^2) below which a and b are not refit */
#define SCHED_FIT_MIN_VAR 16.0
/* a plan's own average is trusted after this many steps */
#define SCHED_PLAN_MIN_N 2
#define SCHED_PLAN_WINDOW 8
/* A plan's first step is left out (it includes the plan's graph capture:
 * 56 ms for plan 256 of the 1B on the H200, against 2.4 ms a step after),
 * and its time is the least of its last SCHED_PLAN_WINDOW steps: a step is
 * slowed by what else the machine does, never sped up, so one slow step
 * (a second capture, a host stall: 10 ms for plan 256 in one H200 run)
 * must not stand for the plan. An EWMA kept that 10 ms long enough that the
 * plan was never chosen again, so never measured again. */

void sched_fit_plans(struct sched_fit *f, const int32_t *plans, int32_t n)
{
	f->n_plans = 0;
	for (int32_t i = 0; plans != NULL && i < n && f->n_plans < CTRL_SCHED_MAX_PLANS; i++)
		if (plans[i] > 0 && (f->n_plans == 0 || plans[i] > f->plan[f->n_plans - 1]))
			f->plan[f->n_plans++] = plans[i];
}

/* Index of the narrowest plan that holds @p n columns, -1 if none does. */
static int32_t plan_of(const struct sched_fit *f, int32_t n)
{
	for (int32_t i = 0; i < f->n_plans; i++)
		if (f->plan[i] >= n)
			return i;
	return -1;
}

void sched_fit_add(struct sched_fit *f, int32_t n_cols, uint64_t step_ns)
{
	double n = (double)n_cols, t = (double)step_ns, var, cov, m_n, m_t;
	int32_t p = plan_of(f, n_cols);

	if (p >= 0) {
		uint32_t k, n_win;

		if (f->plan_seen[p] == 0) {
			f->plan_seen[p] = 1;
			return;
		}
		f->plan_recent[p][f->plan_n[p] % SCHED_PLAN_WINDOW] = t;
		f->plan_n[p]++;
		n_win = f->plan_n[p] < SCHED_PLAN_WINDOW ? f->plan_n[p] : SCHED_PLAN_WINDOW;
		f->plan_ns[p] = f->plan_recent[p][0];
		for (k = 1; k < n_win; k++)
			if (f->plan_recent[p][k] < f->plan_ns[p])
				f->plan_ns[p] = f->plan_recent[p][k];
		n = (double)f->plan[p]; /* the line is fit to the widths the steps ran at */
	}
	f->w = f->w * SCHED_FIT_DECAY + 1.0;
	f->sn = f->sn * SCHED_FIT_DECAY + n;
	f->snn = f->snn * SCHED_FIT_DECAY + n * n;
	f->st = f->st * SCHED_FIT_DECAY + t;
	f->snt = f->snt * SCHED_FIT_DECAY + n * t;
	f->samples++;
	if (f->samples < SCHED_FIT_MIN_N)
		return;
	m_n = f->sn / f->w;
	m_t = f->st / f->w;
	var = f->snn / f->w - m_n * m_n;
	if (!(var >= SCHED_FIT_MIN_VAR))
		return;
	cov = f->snt / f->w - m_n * m_t;
	f->b = cov / var;
	f->a = m_t - f->b * m_n;
	f->fitted = 1;
}

/* Predicted time of a step @p n columns wide: < 0 when nothing predicts it. */
static double line(const struct sched_fit *f, double n)
{
	double t = f->a + f->b * n;

	return f->fitted && t > 0.0 ? t : -1.0;
}

/* A plan's predicted step time, < 0 when unknown: its own (or the line's
 * prediction), never more than a wider plan's, and never more than the
 * straight line between the nearest measured plans on either side (step
 * time grows with width no faster than linearly between two widths on the
 * H200: 128 / 256 / 512 at 1.80 / 2.26 / 3.90 ms). The bounds free a plan
 * whose own figure is wrong: no launch would run in it again to mend it. */
static double plan_cost(const struct sched_fit *f, int32_t p)
{
	double c = f->plan_n[p] >= SCHED_PLAN_MIN_N ? f->plan_ns[p] : line(f, (double)f->plan[p]);
	int32_t lo = -1, hi = -1;

	for (int32_t q = p - 1; q >= 0 && lo < 0; q--)
		if (f->plan_n[q] >= SCHED_PLAN_MIN_N)
			lo = q;
	for (int32_t q = p + 1; q < f->n_plans; q++)
		if (f->plan_n[q] >= SCHED_PLAN_MIN_N) {
			if (hi < 0)
				hi = q;
			if (c < 0.0 || f->plan_ns[q] < c)
				c = f->plan_ns[q];
		}
	if (lo >= 0 && hi >= 0) {
		double t = f->plan_ns[lo] + (f->plan_ns[hi] - f->plan_ns[lo]) * (double)(f->plan[p] - f->plan[lo])
					   / (double)(f->plan[hi] - f->plan[lo]);

		if (c < 0.0 || t < c)
			c = t;
	}
	return c;
}

static int32_t clamp_width(int32_t w, int32_t n_dec, int32_t max_cols, int32_t floor_cols)
{
	if (w - n_dec < floor_cols)
		w = n_dec + floor_cols;
	return w < max_cols ? w : max_cols;
}

int32_t sched_fit_width(const struct sched_fit *f, double budget, int32_t n_dec, int32_t max_cols,
			int32_t floor_cols)
{
	double base, cap;
	int32_t p0, best;

	if (!(budget > 1.0))
		return max_cols;
	p0 = plan_of(f, n_dec);
	if (p0 >= 0) {
		base = plan_cost(f, p0);
		if (!(base > 0.0))
			return max_cols;
		best = f->plan[p0];
		for (int32_t p = p0 + 1; p < f->n_plans && f->plan[p] <= max_cols; p++) {
			double c = plan_cost(f, p);

			if (c >= 0.0 && c > budget * base)
				break;
			best = f->plan[p];
			if (c < 0.0)
				break; /* not measured, not predicted: try it once */
		}
		return clamp_width(best, n_dec, max_cols, floor_cols);
	}
	if (f->n_plans > 0)
		return max_cols; /* wider than every plan: the chain's own limit applies */
	/* no plans known: the line alone */
	if (!f->fitted || !(f->b > 0.0))
		return max_cols;
	base = line(f, (double)n_dec);
	if (!(base > 0.0))
		return max_cols;
	cap = (budget - 1.0) * base / f->b;
	if (!(cap < (double)max_cols))
		return max_cols;
	return clamp_width(n_dec + (int32_t)cap, n_dec, max_cols, floor_cols);
}
