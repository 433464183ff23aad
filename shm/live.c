/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Liveness table: SHM_LIVE_SLOTS slots in one area named ".live" created on
 * first use. A slot is claimed by CAS on its pid word (0 → pid); the owner
 * alone writes the rest. Dead vs slow: kill(pid, 0) says whether the pid
 * exists; the start time from /proc/<pid>/stat says whether it is still the
 * same process (pids are reused), its state whether it is a zombie (killed,
 * not yet reaped: dead); the heartbeat age says slow.
 */
#include <errno.h>
#include <signal.h>
#include <assert.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shm_live.h"

struct live_slot {
	_Atomic int32_t pid;
	uint32_t reserved0;
	uint64_t start_time;          /* /proc/<pid>/stat field 22 */
	uint64_t epoch;
	_Atomic uint64_t beats;
	_Atomic uint64_t last_beat_ns;
	char role[SHM_ROLE_MAX];
	uint8_t reserved[8];
};
static_assert(sizeof(struct live_slot) == 72, "live slot layout");
static_assert(offsetof(struct live_slot, beats) == 24, "beats at 24");

#define LIVE_AREA "live"

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* /proc/<pid>/stat's start time (field 22), 0 when it cannot be read, and
 * in @p state its state letter (field 3). */
static uint64_t proc_start_time(int32_t pid, char *state)
{
	char path[64], buf[1024];
	unsigned long long st = 0;
	const char *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (f == NULL)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* comm may hold spaces and parentheses: fields restart after the last ')'. */
	p = strrchr(buf, ')');
	if (p == NULL)
		return 0;
	/* after ')' come fields 3.. ; start_time is field 22 */
	if (sscanf(p + 2, "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
		   "%*d %*d %llu", state, &st) != 2)
		return 0;
	return st;
}

static struct live_slot *table(struct shm_region *r)
{
	uint64_t off;
	int rc = shm_region_add_area(r, LIVE_AREA, sizeof(struct live_slot) * SHM_LIVE_SLOTS, 64,
				     SHM_AREA_LIVE, &off);

	if (rc < 0 && rc != -EEXIST)
		return NULL;
	/* A fresh area is zero (regions are created zero-filled). */
	return shm_ptr(r, off);
}

int shm_live_register(struct shm_region *r, const char *role)
{
	struct live_slot *t = table(r);
	int32_t me = getpid();

	if (t == NULL || role == NULL)
		return t == NULL ? -ENOSPC : -EINVAL;
	for (int i = 0; i < SHM_LIVE_SLOTS; i++) {
		int32_t expect = 0;

		if (!atomic_compare_exchange_strong(&t[i].pid, &expect, me)) {
			/* Reclaim a slot whose owner is dead. */
			if (expect != me && kill(expect, 0) != 0 && errno == ESRCH &&
			    atomic_compare_exchange_strong(&t[i].pid, &expect, me))
				goto claimed;
			continue;
		}
claimed:
		t[i].start_time = proc_start_time(me, &(char){0});
		t[i].epoch = shm_region_epoch(r) ^ ((uint64_t)me << 32) ^ now_ns();
		snprintf(t[i].role, sizeof(t[i].role), "%s", role);
		atomic_store(&t[i].beats, 0);
		atomic_store(&t[i].last_beat_ns, now_ns());
		return i;
	}
	return -ENOSPC;
}

void shm_live_beat(struct shm_region *r, int slot)
{
	uint64_t off;
	struct live_slot *t;

	if (slot < 0 || slot >= SHM_LIVE_SLOTS || shm_region_find_area(r, LIVE_AREA, &off, NULL))
		return;
	t = shm_ptr(r, off);
	atomic_fetch_add_explicit(&t[slot].beats, 1, memory_order_relaxed);
	atomic_store_explicit(&t[slot].last_beat_ns, now_ns(), memory_order_relaxed);
}

void shm_live_release(struct shm_region *r, int slot)
{
	uint64_t off;
	struct live_slot *t;

	if (slot < 0 || slot >= SHM_LIVE_SLOTS || shm_region_find_area(r, LIVE_AREA, &off, NULL))
		return;
	t = shm_ptr(r, off);
	t[slot].role[0] = '\0';
	atomic_store(&t[slot].pid, 0);
}

int shm_live_check(struct shm_region *r, int slot, uint64_t stale_ns, struct shm_live_info *info)
{
	struct live_slot *t;
	uint64_t off, last;
	int32_t pid;

	if (slot < 0 || slot >= SHM_LIVE_SLOTS)
		return -EINVAL;
	if (shm_region_find_area(r, LIVE_AREA, &off, NULL) < 0)
		return SHM_LIVE_EMPTY;
	t = shm_ptr(r, off);
	pid = atomic_load(&t[slot].pid);
	last = atomic_load_explicit(&t[slot].last_beat_ns, memory_order_relaxed);
	if (info) {
		info->pid = pid;
		info->epoch = t[slot].epoch;
		info->beats = atomic_load_explicit(&t[slot].beats, memory_order_relaxed);
		info->last_beat_ns = last;
		snprintf(info->role, sizeof(info->role), "%s", t[slot].role);
	}
	if (pid == 0)
		return SHM_LIVE_EMPTY;
	if (kill(pid, 0) != 0 && errno == ESRCH)
		return SHM_LIVE_DEAD;
	{
		char state = 0;
		uint64_t st = proc_start_time(pid, &state);

		if (t[slot].start_time != 0 && st != t[slot].start_time)
			return SHM_LIVE_DEAD; /* the pid now belongs to another process */
		/* Killed, not yet reaped by its parent (a shell, a container's
		 * init that reaps late): kill(pid, 0) still finds a zombie. */
		if (state == 'Z' || state == 'X')
			return SHM_LIVE_DEAD;
	}
	{
		uint64_t now = now_ns();

		if (now > last && now - last > stale_ns)
			return SHM_LIVE_SLOW;
	}
	return SHM_LIVE_ALIVE;
}

int shm_live_find_alive(struct shm_region *r, const char *role, int32_t *pid)
{
	for (int i = 0; i < SHM_LIVE_SLOTS; i++) {
		struct shm_live_info li;

		if (shm_live_check(r, i, UINT64_MAX, &li) == SHM_LIVE_ALIVE && strcmp(li.role, role) == 0) {
			*pid = li.pid;
			return i;
		}
	}
	return -ENOENT;
}

int shm_live_gone(struct shm_region *r, int slot, int32_t pid)
{
	struct shm_live_info li;
	int rc = shm_live_check(r, slot, UINT64_MAX, &li);

	return rc == SHM_LIVE_DEAD || rc == SHM_LIVE_EMPTY || (rc >= 0 && li.pid != pid);
}

int shm_live_find(struct shm_region *r, const char *role)
{
	struct live_slot *t;
	uint64_t off;

	if (shm_region_find_area(r, LIVE_AREA, &off, NULL) < 0)
		return -ENOENT;
	t = shm_ptr(r, off);
	for (int i = 0; i < SHM_LIVE_SLOTS; i++)
		if (atomic_load(&t[i].pid) != 0 && strcmp(t[i].role, role) == 0)
			return i;
	return -ENOENT;
}
