/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file shm_region.h
 * A named shared-memory region, on hugetlbfs when hugepages are reserved,
 * else an ordinary shared mapping (with a warning that says how to reserve
 * them). The region starts with a header (magic, ABI version, size, page
 * size, creator pid, epoch) and a table of named areas at fixed offsets, so
 * every process finds the same ring, pool or buffer by name. Everything
 * inside a region refers to other things by offset, never by pointer: each
 * process maps it at its own address.
 *
 * Threading: a handle may be used from any thread; adding areas is
 * serialised by a lock word in the header (any attached process may add).
 */
#ifndef SHM_REGION_H
#define SHM_REGION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHM_NAME_MAX 32

struct shm_region;

struct shm_region_opts {
	const char *name;    /**< region name: [A-Za-z0-9_.-], < SHM_NAME_MAX */
	size_t size;         /**< bytes (rounded up to the page size) */
	size_t page_size;    /**< 2 MiB (default) or 1 GiB hugepages */
	int allow_fallback;  /**< 1 (default): no hugepages → shared mapping + warning */
	int force_fallback;  /**< 1: skip hugetlbfs (tests of the fallback path) */
	int quiet;           /**< 1: no warning on fallback */
};

/** Defaults: 2 MiB pages, fallback allowed. */
void shm_region_opts_init(struct shm_region_opts *o);

/**
 * Create a region (replacing a stale one of the same name).
 * @return the handle, or NULL with errno set (EINVAL bad name/size, ENOMEM
 *         no hugepages and no fallback allowed, or errors of open/ftruncate/mmap)
 *         and @p err filled with the failing call and what to do.
 */
struct shm_region *shm_region_create(const struct shm_region_opts *o, char *err, size_t errlen);

/**
 * Attach to an existing region by name.
 * @return the handle, or NULL with errno set: ENOENT (no such region),
 *         EPROTO (magic or ABI version differ: @p err names both versions), EIO.
 */
struct shm_region *shm_region_attach(const char *name, char *err, size_t errlen);

/**
 * Whether the region now under @p r's name (where shm_region_attach() would
 * find it) is another file than the one @p r maps: its creator made it again (a
 * restarted kvferry-dataplane), and nothing more will arrive on @p r's rings.
 * One stat() per place looked at; call it every second or so, not per message.
 * @return 1 replaced, 0 still the same, or no region of that name (its
 *         creator is shutting down and removed it).
 */
int shm_region_replaced(const struct shm_region *r);

/** Unmap (the region stays for other processes); NULL is a no-op. */
void shm_region_detach(struct shm_region *r);

/** Remove a region's backing file. @return 0 or -errno. */
int shm_region_unlink(const char *name);

/** @return the mapping's base address in this process. */
void *shm_region_base(const struct shm_region *r);
/** @return the mapped size in bytes. */
size_t shm_region_size(const struct shm_region *r);
/** @return the page size backing the region (4096 when it fell back). */
size_t shm_region_page_size(const struct shm_region *r);
/** @return 1 if backed by hugepages, 0 if it fell back. */
int shm_region_is_huge(const struct shm_region *r);
/** @return the epoch the creator stamped (changes on every create). */
uint64_t shm_region_epoch(const struct shm_region *r);
/** @return the path of the backing file. */
const char *shm_region_path(const struct shm_region *r);

/** Area kinds, recorded in the table for tools that list a region. */
enum shm_area_kind {
	SHM_AREA_RAW = 1,
	SHM_AREA_RING = 2,
	SHM_AREA_POOL = 3,
	SHM_AREA_LIVE = 4,
};

/**
 * Reserve a named area of @p size bytes, aligned to @p align (a power of two,
 * at least 64).
 * @param off receives the area's offset from the region base
 * @return 0, -EEXIST (name taken: @p off still receives it), -ENOSPC (region
 *         full or table full), -EINVAL (bad name/align).
 */
int shm_region_add_area(struct shm_region *r, const char *name, size_t size, size_t align,
			enum shm_area_kind kind, uint64_t *off);

/**
 * Find an area by name.
 * @return 0 with *off and *size (either may be NULL) filled, or -ENOENT.
 */
int shm_region_find_area(const struct shm_region *r, const char *name, uint64_t *off,
			 size_t *size);

/**
 * The @p i-th area of the region (0-based, in the order they were added):
 * its name (into @p name, SHM_AREA_NAME_MAX bytes), kind and offset, any of
 * which may be NULL. Lock-free: areas are only ever added.
 * @return 0, or -ENOENT past the last area.
 */
#define SHM_AREA_NAME_MAX 32
int shm_region_area_at(const struct shm_region *r, uint32_t i, char *name, enum shm_area_kind *kind,
		       uint64_t *off);

/** @return base + off. */
static inline void *shm_ptr(const struct shm_region *r, uint64_t off)
{
	return (char *)shm_region_base(r) + off;
}

/** @return ptr - base (ptr must lie inside the region). */
static inline uint64_t shm_off(const struct shm_region *r, const void *ptr)
{
	return (uint64_t)((const char *)ptr - (const char *)shm_region_base(r));
}

#ifdef __cplusplus
}
#endif
#endif /* SHM_REGION_H */
