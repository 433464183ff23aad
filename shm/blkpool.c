/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Block-id pool: a LIFO free stack plus a refcount per id. LIFO hands back
 * the most recently freed block first, which keeps a small working set of
 * KV blocks hot in the GPU's L2 and the CPU's caches.
 */
#include <errno.h>
#include <stdlib.h>

#include "shm_blkpool.h"

struct shm_blkpool {
	int32_t capacity;
	int32_t n_free;   /* entries on the stack */
	int32_t *stack;   /* [capacity] free ids, top at n_free - 1 */
	int32_t *refs;    /* [capacity] refcount per id */
};

struct shm_blkpool *shm_blkpool_create(int32_t capacity)
{
	struct shm_blkpool *p;

	if (capacity < 1) {
		errno = EINVAL;
		return NULL;
	}
	p = calloc(1, sizeof(*p));
	if (p == NULL)
		goto fail;
	p->stack = malloc(sizeof(*p->stack) * (size_t)capacity);
	if (p->stack == NULL)
		goto fail_pool;
	p->refs = calloc((size_t)capacity, sizeof(*p->refs));
	if (p->refs == NULL)
		goto fail_stack;
	p->capacity = capacity;
	/* Lowest ids on top, so a fresh pool hands out 0, 1, 2, ... */
	for (int32_t i = 0; i < capacity; i++)
		p->stack[i] = capacity - 1 - i;
	p->n_free = capacity;
	return p;

fail_stack:
	free(p->stack);
fail_pool:
	free(p);
fail:
	errno = ENOMEM;
	return NULL;
}

void shm_blkpool_destroy(struct shm_blkpool *p)
{
	if (p == NULL)
		return;
	free(p->refs);
	free(p->stack);
	free(p);
}

int32_t shm_blkpool_capacity(const struct shm_blkpool *p)
{
	return p->capacity;
}

int32_t shm_blkpool_available(const struct shm_blkpool *p)
{
	return p->n_free;
}

int shm_blkpool_alloc(struct shm_blkpool *p, int32_t n, int32_t *out)
{
	if (n < 0 || (n > 0 && out == NULL))
		return -EINVAL;
	if (n > p->n_free)
		return -ENOSPC;
	for (int32_t i = 0; i < n; i++) {
		int32_t id = p->stack[--p->n_free];

		p->refs[id] = 1;
		out[i] = id;
	}
	return 0;
}

int shm_blkpool_ref(struct shm_blkpool *p, int32_t id)
{
	if (id < 0 || id >= p->capacity)
		return -EINVAL;
	if (p->refs[id] == 0)
		return -EALREADY;
	p->refs[id]++;
	return 0;
}

int shm_blkpool_unref(struct shm_blkpool *p, int32_t id)
{
	if (id < 0 || id >= p->capacity)
		return -EINVAL;
	if (p->refs[id] == 0)
		return -EALREADY;
	if (--p->refs[id] == 0)
		p->stack[p->n_free++] = id;
	return p->refs[id];
}

int shm_blkpool_release(struct shm_blkpool *p, const int32_t *ids, int32_t n)
{
	for (int32_t i = 0; i < n; i++) {
		int rc = shm_blkpool_unref(p, ids[i]);

		if (rc < 0)
			return rc;
	}
	return 0;
}

int shm_blkpool_refcount(const struct shm_blkpool *p, int32_t id)
{
	if (id < 0 || id >= p->capacity)
		return -EINVAL;
	return p->refs[id];
}
