/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tensor-parallel ranks as threads of one test or benchmark: their meeting
 * point, a kn_stage_opts.tp_reduce that adds the ranks' partials pairwise
 * in rank order (((r0 + r1) + (r2 + r3)) + ...: the order kn_stage.h asks
 * for) and a tp_share that hands rank 0's bytes to the others. A user's
 * rank record starts with a struct kt_tp_rank, which is the tp_arg.
 */
#ifndef KT_TP_H
#define KT_TP_H

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KT_TP_MAX 8

struct kt_tp_group {
	int T;
	pthread_barrier_t bar;
	float *part[KT_TP_MAX];
	void *share;
};

struct kt_tp_rank {
	struct kt_tp_group *g;
	int rank;
	float *sum;     /* scratch: the sum, until every rank has read the partials */
	size_t sum_cap; /* its floats */
};

static inline int kt_tp_reduce(void *arg, float *buf, int32_t n, int32_t ld, int32_t dim)
{
	struct kt_tp_rank *r = (struct kt_tp_rank *)arg;
	struct kt_tp_group *g = r->g;

	if ((size_t)n * ld > r->sum_cap)
		return -ENOMEM;
	g->part[r->rank] = buf;
	pthread_barrier_wait(&g->bar);
	for (int32_t j = 0; j < n; j++)
		for (int32_t i = 0; i < dim; i++) {
			float v[KT_TP_MAX] = { 0 };

			for (int k = 0; k < g->T; k++)
				v[k] = g->part[k][(size_t)j * ld + i];
			for (int step = 1; step < g->T; step *= 2)
				for (int k = 0; k + step < g->T; k += 2 * step)
					v[k] += v[k + step];
			r->sum[(size_t)j * ld + i] = v[0];
		}
	pthread_barrier_wait(&g->bar); /* every rank has read every partial */
	for (int32_t j = 0; j < n; j++)
		memcpy(buf + (size_t)j * ld, r->sum + (size_t)j * ld, (size_t)dim * sizeof(float));
	return 0;
}

static inline int kt_tp_share(void *arg, void *buf, size_t len)
{
	struct kt_tp_rank *r = (struct kt_tp_rank *)arg;

	if (r->rank == 0)
		r->g->share = buf;
	pthread_barrier_wait(&r->g->bar);
	if (r->rank != 0)
		memcpy(buf, r->g->share, len);
	pthread_barrier_wait(&r->g->bar);
	return 0;
}

#endif /* KT_TP_H */
