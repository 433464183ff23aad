/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fallback_region.h"
#include "shm_live.h"
#include "shm_region.h"

static char g_name[SHM_NAME_MAX];

static void another_process_tells_alive_slow_and_dead_apart(void **state)
{
	struct shm_live_info info;
	struct shm_region *r;
	char err[256];
	int up[2], down[2], slot, st;
	pid_t pid;
	char c;

	(void)state;
	r = test_fallback_region(g_name, 1 << 20);
	assert_non_null(r);
	/* one pipe each way: a single pipe lets the child read its own byte */
	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down), 0);
	pid = fork();
	if (pid == 0) {
		struct shm_region *a = shm_region_attach(g_name, err, sizeof(err));
		int s = shm_live_register(a, "worker0");

		for (int i = 0; i < 5; i++)
			shm_live_beat(a, s);
		if (write(up[1], "x", 1) != 1)
			_exit(1);
		/* then stop beating, and exit when told */
		if (read(down[0], &c, 1) != 1)
			_exit(1);
		_exit(0);
	}
	assert_int_equal(read(up[0], &c, 1), 1);
	slot = shm_live_find(r, "worker0");
	assert_true(slot >= 0);
	assert_int_equal(shm_live_check(r, slot, 10000000000ull, &info), SHM_LIVE_ALIVE);
	assert_int_equal(info.pid, pid);
	assert_int_equal(info.beats, 5);
	assert_string_equal(info.role, "worker0");
	usleep(30000);
	assert_int_equal(shm_live_check(r, slot, 10000000ull, NULL), SHM_LIVE_SLOW);
	assert_int_equal(write(down[1], "x", 1), 1);
	waitpid(pid, &st, 0);
	assert_int_equal(shm_live_check(r, slot, 10000000000ull, NULL), SHM_LIVE_DEAD);
	/* a dead owner's slot is reclaimed by the next process */
	assert_int_equal(shm_live_register(r, "worker0-restarted"), slot);
	assert_int_equal(shm_live_check(r, slot, 10000000000ull, NULL), SHM_LIVE_ALIVE);
	shm_live_release(r, slot);
	assert_int_equal(shm_live_check(r, slot, 1, NULL), SHM_LIVE_EMPTY);
	assert_int_equal(shm_live_check(r, -1, 1, NULL), -EINVAL);
	close(up[0]);
	close(up[1]);
	close(down[0]);
	close(down[1]);
	shm_region_detach(r);
	shm_region_unlink(g_name);
}

/* Killed and not yet reaped (its parent a shell or an init that reaps late):
 * kill(pid, 0) still finds the zombie, and its slot must read dead. */
static void a_killed_owner_its_parent_has_not_reaped_is_dead(void **state)
{
	struct shm_region *r;
	char err[256], path[64], buf[512], c, *p;
	int up[2], slot, st, zombie = 0;
	pid_t pid;

	(void)state;
	r = test_fallback_region(g_name, 1 << 20);
	assert_non_null(r);
	assert_int_equal(pipe(up), 0);
	pid = fork();
	if (pid == 0) {
		struct shm_region *a = shm_region_attach(g_name, err, sizeof(err));

		shm_live_register(a, "stage1");
		if (write(up[1], "x", 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	assert_int_equal(read(up[0], &c, 1), 1);
	slot = shm_live_find(r, "stage1");
	assert_true(slot >= 0);
	assert_int_equal(shm_live_check(r, slot, 10000000000ull, NULL), SHM_LIVE_ALIVE);
	kill(pid, SIGKILL);
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	for (int i = 0; i < 2000 && !zombie; i++) {
		FILE *f = fopen(path, "r");
		size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

		if (f)
			fclose(f);
		buf[n] = '\0';
		p = strrchr(buf, ')');
		zombie = p != NULL && p[1] == ' ' && p[2] == 'Z';
		if (!zombie)
			usleep(1000);
	}
	assert_true(zombie);
	assert_int_equal(shm_live_check(r, slot, 10000000000ull, NULL), SHM_LIVE_DEAD);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_int_equal(shm_live_check(r, slot, 10000000000ull, NULL), SHM_LIVE_DEAD);
	close(up[0]);
	close(up[1]);
	shm_region_detach(r);
	shm_region_unlink(g_name);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(another_process_tells_alive_slow_and_dead_apart),
		cmocka_unit_test(a_killed_owner_its_parent_has_not_reaped_is_dead),
	};

	snprintf(g_name, sizeof(g_name), "t-live-%d", (int)getpid());
	return cmocka_run_group_tests(tests, NULL, NULL);
}
