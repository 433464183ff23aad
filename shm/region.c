/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Named regions. The creator maps a file on hugetlbfs (found through
 * libhugetlbfs for the requested page size) or, when no hugepages are
 * reserved, a file in /dev/shm, writes the header, and publishes the magic
 * last (release), so an attacher that sees the magic sees a whole header.
 *
 * KVFERRY_SHM_DIR, when set, replaces /dev/shm for fallback regions.
 */
#include <errno.h>
#include <fcntl.h>
#include <hugetlbfs.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvf_cfg.h"
#include "region_abi.h"
#include "shm_region.h"

#define FALLBACK_DIR "/dev/shm"
#define FALLBACK_PAGE 4096u

struct shm_region {
	struct shm_region_hdr *hdr;
	size_t size;
	size_t page_size;
	int huge;
	char path[256];
	char name[SHM_NAME_MAX];
	dev_t dev;  /* the file mapped: shm_region_replaced() compares the name's file now */
	ino_t ino;
};

static int name_ok(const char *name)
{
	size_t n;

	if (name == NULL)
		return 0;
	n = strlen(name);
	if (n == 0 || n >= SHM_NAME_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '-' || c == '.'))
			return 0;
	}
	return name[0] != '.';
}

static const char *huge_dir(size_t page_size)
{
	return hugetlbfs_find_path_for_size((long)page_size);
}

static const char *fallback_dir(void)
{
	const char *dir = getenv("KVFERRY_SHM_DIR");

	return (dir != NULL && *dir != '\0') ? dir : FALLBACK_DIR;
}

void shm_region_opts_init(struct shm_region_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->page_size = 2u << 20;
	o->allow_fallback = 1;
}

static uint64_t new_epoch(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^
	       ((uint64_t)getpid() << 40);
}

/* Map a new file of @size bytes at @path. Returns the mapping or MAP_FAILED
 * with errno. The caller creates it under a temporary name and renames it
 * into place once the header is published (see shm_region_create()). */
static void *map_new(const char *path, size_t size, int huge, char *err, size_t errlen)
{
	void *p;
	int fd;

	(void)unlink(path);
	fd = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0660);
	if (fd < 0) {
		int e = errno;

		cfg_errf(err, errlen, "open(%s) failed: %s", path, strerror(e));
		errno = e;
		return MAP_FAILED;
	}
	if (ftruncate(fd, (off_t)size) != 0) {
		int e = errno;

		cfg_errf(err, errlen, "ftruncate(%s, %zu) failed: %s", path, size, strerror(e));
		close(fd);
		unlink(path);
		errno = e;
		return MAP_FAILED;
	}
	/* On hugetlbfs a shared mapping reserves its pages at mmap time, so a
	 * shortage shows here as ENOMEM rather than as SIGBUS on first touch. */
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | (huge ? MAP_POPULATE : 0), fd, 0);
	if (p == MAP_FAILED) {
		int e = errno;

		cfg_errf(err, errlen, "mmap(%s, %zu) failed: %s", path, size, strerror(e));
		close(fd);
		unlink(path);
		errno = e;
		return MAP_FAILED;
	}
	close(fd);
	return p;
}

/* Where a region of a name may be, in the order attachers look:
 * hugetlbfs of 2 MiB, of 1 GiB, then the fallback directory. */
static int region_dirs(const char *dirs[3])
{
	int n = 0;

	dirs[n++] = huge_dir(2u << 20);
	dirs[n++] = huge_dir(1u << 30);
	dirs[n++] = fallback_dir();
	return n;
}

/* A region created at @p keep replaces one of the same name anywhere else: a
 * predecessor on hugetlbfs when this one fell back (no hugepages free), or in
 * the fallback directory when this one got hugepages. Left there, the stale
 * file would be found first by attachers (a restarted dataplane that fell
 * back was never reached: every process attached its predecessor's). */
static void unlink_elsewhere(const char *name, const char *keep)
{
	const char *dirs[3];
	char path[300];
	int n = region_dirs(dirs);

	for (int i = 0; i < n; i++) {
		if (dirs[i] == NULL)
			continue;
		snprintf(path, sizeof(path), "%s/kvferry-%s", dirs[i], name);
		if (strcmp(path, keep) != 0)
			(void)unlink(path);
	}
}

struct shm_region *shm_region_create(const struct shm_region_opts *o, char *err, size_t errlen)
{
	struct shm_region *r;
	const char *dir = NULL;
	size_t page, size;
	void *p = MAP_FAILED;
	char tmp[300];

	if (o == NULL || !name_ok(o->name) || o->size == 0) {
		cfg_errf(err, errlen, "shm_region_create: bad name '%s' or size %zu (names are 1-%d "
		       "characters of [A-Za-z0-9_.-])", o && o->name ? o->name : "(null)",
		       o ? o->size : 0, SHM_NAME_MAX - 1);
		errno = EINVAL;
		return NULL;
	}
	page = o->page_size ? o->page_size : (2u << 20);
	r = calloc(1, sizeof(*r));
	if (r == NULL) {
		cfg_errf(err, errlen, "shm_region_create: out of memory");
		errno = ENOMEM;
		return NULL;
	}

	if (!o->force_fallback)
		dir = huge_dir(page);
	if (dir != NULL) {
		size = (o->size + SHM_HDR_BYTES + page - 1) / page * page;
		snprintf(r->path, sizeof(r->path), "%s/kvferry-%s", dir, o->name);
		snprintf(tmp, sizeof(tmp), "%s.new-%d", r->path, (int)getpid());
		p = map_new(tmp, size, 1, err, errlen);
		if (p != MAP_FAILED) {
			r->huge = 1;
			r->page_size = page;
		}
	}
	if (p == MAP_FAILED) {
		if (!o->allow_fallback) {
			if (dir == NULL)
				cfg_errf(err, errlen, "no hugetlbfs mount for %zu KiB pages: reserve "
				       "hugepages (echo 512 > /proc/sys/vm/nr_hugepages) and mount "
				       "hugetlbfs (mount -t hugetlbfs none /dev/hugepages)", page >> 10);
			free(r);
			errno = ENOMEM;
			return NULL;
		}
		if (!o->quiet && !o->force_fallback)
			fprintf(stderr, "kvferry: warning: region '%s' (%zu MiB) is not on hugepages "
				"(%s); falling back to an ordinary shared mapping, which is slower "
				"for DMA and cannot be registered with DPDK. To reserve hugepages: "
				"echo %zu > /proc/sys/vm/nr_hugepages (and mount -t hugetlbfs none "
				"/dev/hugepages if nothing is mounted)\n", o->name, o->size >> 20,
				dir == NULL ? "no hugetlbfs mount with free pages" :
				(err && *err ? err : "not enough free hugepages"),
				(o->size + SHM_HDR_BYTES) / (2u << 20) + 1);
		page = FALLBACK_PAGE;
		size = (o->size + SHM_HDR_BYTES + page - 1) / page * page;
		snprintf(r->path, sizeof(r->path), "%s/kvferry-%s", fallback_dir(), o->name);
		snprintf(tmp, sizeof(tmp), "%s.new-%d", r->path, (int)getpid());
		p = map_new(tmp, size, 0, err, errlen);
		if (p == MAP_FAILED) {
			int e = errno;

			free(r);
			errno = e;
			return NULL;
		}
		r->huge = 0;
		r->page_size = page;
	}
	r->hdr = p;
	r->size = size;
	snprintf(r->name, sizeof(r->name), "%s", o->name);

	memset(r->hdr, 0, sizeof(*r->hdr));
	r->hdr->abi_version = SHM_ABI_VERSION;
	r->hdr->hdr_bytes = SHM_HDR_BYTES;
	r->hdr->size = size;
	r->hdr->page_size = r->page_size;
	r->hdr->creator_pid = getpid();
	r->hdr->epoch = new_epoch();
	r->hdr->huge = (uint32_t)r->huge;
	r->hdr->next_free = SHM_HDR_BYTES;
	atomic_store_explicit(&r->hdr->lock, 0, memory_order_relaxed);
	/* R0: publish the header; pairs with A0 in shm_region_attach(). */
	__atomic_store_n(&r->hdr->magic, SHM_REGION_MAGIC, __ATOMIC_RELEASE);
	/* Only now does the region appear under its name, replacing any stale
	 * one in one step: an attacher never opens a half-written header (one
	 * did, in the serving tests: magic 0 while the creator was mid-way). */
	{
		struct stat st;

		if (stat(tmp, &st) == 0) {
			r->dev = st.st_dev;
			r->ino = st.st_ino;
		}
	}
	if (rename(tmp, r->path) != 0) {
		int e = errno;

		cfg_errf(err, errlen, "rename(%s, %s) failed: %s", tmp, r->path, strerror(e));
		munmap(p, size);
		unlink(tmp);
		free(r);
		errno = e;
		return NULL;
	}
	unlink_elsewhere(o->name, r->path);
	if (err && errlen)
		err[0] = '\0';
	return r;
}

static int open_existing(const char *name, char *path, size_t pathlen)
{
	const char *dirs[3];
	int n = region_dirs(dirs), fd;

	for (int i = 0; i < n; i++) {
		if (dirs[i] == NULL)
			continue;
		snprintf(path, pathlen, "%s/kvferry-%s", dirs[i], name);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd >= 0)
			return fd;
	}
	return -ENOENT;
}

struct shm_region *shm_region_attach(const char *name, char *err, size_t errlen)
{
	struct shm_region *r;
	struct stat st;
	uint64_t magic;
	void *p;
	int fd, e;

	if (!name_ok(name)) {
		cfg_errf(err, errlen, "shm_region_attach: bad region name '%s'", name ? name : "(null)");
		errno = EINVAL;
		return NULL;
	}
	r = calloc(1, sizeof(*r));
	if (r == NULL) {
		errno = ENOMEM;
		return NULL;
	}
	fd = open_existing(name, r->path, sizeof(r->path));
	if (fd < 0) {
		cfg_errf(err, errlen, "no region named '%s' (looked on hugetlbfs and in %s): start the "
		       "process that creates it first", name, fallback_dir());
		free(r);
		errno = ENOENT;
		return NULL;
	}
	if (fstat(fd, &st) != 0 || (size_t)st.st_size < SHM_HDR_BYTES) {
		cfg_errf(err, errlen, "region '%s' at %s is truncated (%lld bytes, header needs %u)",
		       name, r->path, (long long)st.st_size, SHM_HDR_BYTES);
		e = EPROTO;
		goto fail_fd;
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		e = errno;
		cfg_errf(err, errlen, "mmap(%s, %lld) failed: %s", r->path, (long long)st.st_size,
		       strerror(e));
		goto fail_fd;
	}
	close(fd);
	r->hdr = p;
	r->size = (size_t)st.st_size;
	r->dev = st.st_dev;
	r->ino = st.st_ino;
	snprintf(r->name, sizeof(r->name), "%s", name);
	/* A0: pairs with R0 in shm_region_create(). */
	magic = __atomic_load_n(&r->hdr->magic, __ATOMIC_ACQUIRE);
	if (magic != SHM_REGION_MAGIC || r->hdr->abi_version != SHM_ABI_VERSION) {
		cfg_errf(err, errlen, "region '%s' (%s) has magic 0x%016llx ABI version %u; this "
		       "program speaks magic 0x%016llx ABI version %u: restart every kvferry "
		       "process from the same release", name, r->path, (unsigned long long)magic,
		       r->hdr->abi_version, (unsigned long long)SHM_REGION_MAGIC, SHM_ABI_VERSION);
		munmap(p, r->size);
		free(r);
		errno = EPROTO;
		return NULL;
	}
	r->page_size = r->hdr->page_size;
	r->huge = (int)r->hdr->huge;
	return r;

fail_fd:
	close(fd);
	free(r);
	errno = e;
	return NULL;
}

int shm_region_replaced(const struct shm_region *r)
{
	const char *dirs[3];
	char path[300];
	struct stat st;
	int n = region_dirs(dirs);

	if (r == NULL)
		return 0;
	for (int i = 0; i < n; i++) {
		if (dirs[i] == NULL)
			continue;
		snprintf(path, sizeof(path), "%s/kvferry-%s", dirs[i], r->name);
		if (stat(path, &st) == 0)
			return st.st_dev != r->dev || st.st_ino != r->ino;
	}
	return 0;
}

void shm_region_detach(struct shm_region *r)
{
	if (r == NULL)
		return;
	munmap(r->hdr, r->size);
	free(r);
}

int shm_region_unlink(const char *name)
{
	char path[256];
	int fd;

	if (!name_ok(name))
		return -EINVAL;
	fd = open_existing(name, path, sizeof(path));
	if (fd < 0)
		return fd;
	close(fd);
	return unlink(path) == 0 ? 0 : -errno;
}

void *shm_region_base(const struct shm_region *r)
{
	return r->hdr;
}

size_t shm_region_size(const struct shm_region *r)
{
	return r->size;
}

size_t shm_region_page_size(const struct shm_region *r)
{
	return r->page_size;
}

int shm_region_is_huge(const struct shm_region *r)
{
	return r->huge;
}

uint64_t shm_region_epoch(const struct shm_region *r)
{
	return r->hdr->epoch;
}

const char *shm_region_path(const struct shm_region *r)
{
	return r->path;
}

/* The table lock word holds its holder's pid, so that a process killed
 * inside add_area (a restarted ctrld creating its pools, say) does not
 * leave it held for ever: a waiter that finds the holder dead takes it
 * over. The dead holder's work is harmless: an entry is published by the
 * n_areas store alone (R2), so at worst its reserved space is lost. */
static void hdr_lock(struct shm_region_hdr *h)
{
	uint32_t me = (uint32_t)getpid(), expect = 0;

	/* A1: acquire the table; pairs with R1 in hdr_unlock(). */
	while (!atomic_compare_exchange_weak_explicit(&h->lock, &expect, me, memory_order_acquire,
						      memory_order_relaxed)) {
		if (expect != 0 && expect != me && kill((pid_t)expect, 0) < 0 && errno == ESRCH
		    && atomic_compare_exchange_strong_explicit(&h->lock, &expect, me, memory_order_acquire,
							       memory_order_relaxed))
			return;
		expect = 0;
		sched_yield();
	}
}

static void hdr_unlock(struct shm_region_hdr *h)
{
	/* R1 */
	atomic_store_explicit(&h->lock, 0, memory_order_release);
}

static int find_locked(const struct shm_region_hdr *h, const char *name)
{
	/* A2: pairs with R2 in shm_region_add_area(). */
	uint32_t n = __atomic_load_n(&h->n_areas, __ATOMIC_ACQUIRE);

	for (uint32_t i = 0; i < n; i++)
		if (strncmp(h->areas[i].name, name, sizeof(h->areas[i].name)) == 0)
			return (int)i;
	return -1;
}

int shm_region_add_area(struct shm_region *r, const char *name, size_t size, size_t align,
			enum shm_area_kind kind, uint64_t *off)
{
	struct shm_region_hdr *h = r->hdr;
	struct shm_area_ent *e;
	uint64_t start;
	int i, rc = 0;

	if (!name_ok(name) || size == 0 || align < 64 || (align & (align - 1)) != 0)
		return -EINVAL;
	hdr_lock(h);
	i = find_locked(h, name);
	if (i >= 0) {
		if (off)
			*off = h->areas[i].off;
		rc = -EEXIST;
		goto out;
	}
	if (h->n_areas >= SHM_MAX_AREAS) {
		rc = -ENOSPC;
		goto out;
	}
	start = (h->next_free + align - 1) & ~((uint64_t)align - 1);
	if (start + size > h->size) {
		rc = -ENOSPC;
		goto out;
	}
	e = &h->areas[h->n_areas];
	memset(e, 0, sizeof(*e));
	snprintf(e->name, sizeof(e->name), "%s", name);
	e->off = start;
	e->size = size;
	e->kind = (uint32_t)kind;
	h->next_free = start + size;
	/* R2: publish the entry. */
	__atomic_store_n(&h->n_areas, h->n_areas + 1, __ATOMIC_RELEASE);
	if (off)
		*off = start;
out:
	hdr_unlock(h);
	return rc;
}

int shm_region_find_area(const struct shm_region *r, const char *name, uint64_t *off, size_t *size)
{
	int i = find_locked(r->hdr, name);

	if (i < 0)
		return -ENOENT;
	if (off)
		*off = r->hdr->areas[i].off;
	if (size)
		*size = r->hdr->areas[i].size;
	return 0;
}

int shm_region_area_at(const struct shm_region *r, uint32_t i, char *name, enum shm_area_kind *kind,
		       uint64_t *off)
{
	const struct shm_region_hdr *h = r->hdr;

	/* A2 as in find_locked(): an entry counted is a published one */
	if (i >= __atomic_load_n(&h->n_areas, __ATOMIC_ACQUIRE))
		return -ENOENT;
	if (name != NULL)
		snprintf(name, SHM_AREA_NAME_MAX, "%.*s", SHM_AREA_NAME_MAX - 1, h->areas[i].name);
	if (kind != NULL)
		*kind = (enum shm_area_kind)h->areas[i].kind;
	if (off != NULL)
		*off = h->areas[i].off;
	return 0;
}
