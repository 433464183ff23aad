/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Test helper: make sure @n free 2 MiB hugepages and a hugetlbfs mount exist,
 * reserving and mounting them when running as root (after a mount the test
 * re-executes itself, since libhugetlbfs scans mounts only at load). Returns 0 when the
 * hugepage path can be tested, -1 when it cannot (the caller skips, exit 77).
 */
#ifndef TEST_HUGEPAGES_H
#define TEST_HUGEPAGES_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hugetlbfs.h>

static inline long test_read_long(const char *path)
{
	FILE *f = fopen(path, "r");
	long v = -1;

	if (f == NULL)
		return -1;
	if (fscanf(f, "%ld", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

static inline int test_hugepages_ensure(long n, char **argv)
{
	const char *nr = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
	const char *fr = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";
	long total = test_read_long(nr), free_ = test_read_long(fr);

	if (total < 0)
		return -1;
	if (free_ < n && geteuid() == 0) {
		FILE *f = fopen(nr, "w");

		if (f != NULL) {
			fprintf(f, "%ld", total + (n - free_));
			fclose(f);
		}
		free_ = test_read_long(fr);
	}
	if (free_ < n)
		return -1;
	if (hugetlbfs_find_path_for_size(2L << 20) == NULL) {
		if (geteuid() != 0)
			return -1;
		mkdir("/dev/hugepages", 0755);
		if (mount("nodev", "/dev/hugepages", "hugetlbfs", 0, "pagesize=2M") != 0)
			return -1;
		/* libhugetlbfs scans mounts once, at load: run again to see the new one. */
		if (argv != NULL)
			execv("/proc/self/exe", argv);
		return -1;
	}
	return 0;
}

#endif
