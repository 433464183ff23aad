/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Test helper: a region in ordinary shared memory (never hugepages), so the
 * unit tests run anywhere and do not compete for reserved pages.
 */
#ifndef TEST_FALLBACK_REGION_H
#define TEST_FALLBACK_REGION_H

#include <stddef.h>

#include "shm_region.h"

static inline struct shm_region *test_fallback_region(const char *name, size_t size)
{
	struct shm_region_opts o;
	char err[256];

	shm_region_opts_init(&o);
	o.name = name;
	o.size = size;
	o.force_fallback = 1;
	return shm_region_create(&o, err, sizeof(err));
}

#endif
