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
 * carry 512 prompt positions (3 x the decode step on an H200, 1B); narrow
 * enough for 64, it starves prefill at 256. The cap here is by time.
 *
 * Model: the chain reports each group's step time (the slowest stage's;
 * a GPU worker measures it on its device). An exponentially weighted least
 * squares fit t = a + b n over the columns n of recent launches (weight
 * SCHED_FIT_DECAY per launch, about fifty launches' memory) predicts a
 * launch's time; prompt positions get (budget - 1) (a + b n_dec) / b. The
 * fit is refreshed only while the launches' widths differ enough to tell
 * a from b; until then, or while b <= 0 (a step whose cost does not grow
 * with its width), nothing is capped.
 */
#include <math.h>

#include "ctrl_sched.h"
#include "sched_int.h"

#define SCHED_FIT_DECAY 0.98
#define SCHED_FIT_MIN_N 8
/* weighted variance of the widths (columns^2) below which a and b are not refit */
#define SCHED_FIT_MIN_VAR 16.0

void sched_fit_add(struct sched_fit *f, int32_t n_cols, uint64_t step_ns)
{
	double n = (double)n_cols, t = (double)step_ns, var, cov, m_n, m_t;

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

int32_t sched_fit_prefill_cap(const struct sched_fit *f, double budget, int32_t n_dec, int32_t floor_cols)
{
	double t_dec, cap;

	if (!(budget > 1.0) || !f->fitted || !(f->b > 0.0))
		return INT32_MAX;
	t_dec = f->a + f->b * (double)n_dec;
	if (!(t_dec > 0.0))
		return INT32_MAX;
	cap = (budget - 1.0) * t_dec / f->b;
	if (!(cap < (double)INT32_MAX))
		return INT32_MAX;
	return cap > (double)floor_cols ? (int32_t)cap : floor_cols;
}
