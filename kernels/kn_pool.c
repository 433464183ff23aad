/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fixed thread pool. Wake-up: workers spin briefly on the generation counter,
 * then sleep on a condition variable. A decode step issues ~7 parallel
 * regions per layer; a sleeping wake-up costs tens of microseconds, so a
 * short spin (the next region usually follows within microseconds) keeps the
 * per-region cost low without burning a core while the engine is idle.
 *
 * Invariant: `gen` only increases; a worker runs each generation exactly once
 * (it remembers the last one it ran). `pending` counts workers still inside
 * the current generation; the caller returns only once it reaches 0, so fn
 * and arg stay valid for the whole region.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kn_pool.h"

#define SPIN 20000

struct kn_worker {
	struct kn_pool *p;
	int tid;
	pthread_t th;
};

struct kn_pool {
	int n;
	struct kn_worker *w;
	pthread_mutex_t mu;
	pthread_cond_t wake, done;
	atomic_uint gen;
	atomic_int pending;
	atomic_int stop;
	kn_pool_fn fn;
	void *arg;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static void *worker_main(void *a)
{
	struct kn_worker *w = a;
	struct kn_pool *p = w->p;
	unsigned seen = 0;

	for (;;) {
		unsigned g;
		int spins = 0;
		while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && spins < SPIN) {
			cpu_relax();
			spins++;
		}
		if (g == seen) {
			pthread_mutex_lock(&p->mu);
			while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && !p->stop)
				pthread_cond_wait(&p->wake, &p->mu);
			int stop = p->stop;
			pthread_mutex_unlock(&p->mu);
			if (stop && g == seen)
				return NULL;
		}
		seen = g;
		if (p->stop)
			return NULL;
		p->fn(p->arg, w->tid, p->n);
		if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
			pthread_mutex_lock(&p->mu);
			pthread_cond_signal(&p->done);
			pthread_mutex_unlock(&p->mu);
		}
	}
}

struct kn_pool *kn_pool_create(int n)
{
	struct kn_pool *p;
	if (n < 1)
		n = 1;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->n = n;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->wake, NULL);
	pthread_cond_init(&p->done, NULL);
	p->w = calloc((size_t)n, sizeof(*p->w));
	if (!p->w)
		goto fail;
	for (int i = 1; i < n; i++) {
		p->w[i].p = p;
		p->w[i].tid = i;
		int rc = pthread_create(&p->w[i].th, NULL, worker_main, &p->w[i]);
		if (rc) {
			p->n = i; /* join only those started */
			kn_pool_destroy(p);
			errno = rc;
			return NULL;
		}
	}
	return p;
fail:
	pthread_cond_destroy(&p->done);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->mu);
	free(p);
	errno = ENOMEM;
	return NULL;
}

int kn_pool_size(const struct kn_pool *p)
{
	return p->n;
}

void kn_pool_run(struct kn_pool *p, kn_pool_fn fn, void *arg)
{
	if (p->n == 1) {
		fn(arg, 0, 1);
		return;
	}
	p->fn = fn;
	p->arg = arg;
	atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
	pthread_mutex_lock(&p->mu);
	atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	fn(arg, 0, p->n);
	int spins = 0;
	while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0 && spins < SPIN) {
		cpu_relax();
		spins++;
	}
	if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
		pthread_mutex_lock(&p->mu);
		while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
			pthread_cond_wait(&p->done, &p->mu);
		pthread_mutex_unlock(&p->mu);
	}
}

void kn_pool_destroy(struct kn_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	pthread_cond_broadcast(&p->wake);
	pthread_mutex_unlock(&p->mu);
	for (int i = 1; i < p->n; i++)
		pthread_join(p->w[i].th, NULL);
	free(p->w);
	pthread_cond_destroy(&p->done);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->mu);
	free(p);
}
