/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The log line (kvf_log.h): plain by default, byte for byte; with
 * KVFERRY_LOG_TIME=1 every line of a message starts with the monotonic
 * time, so several daemons' logs of one run can be read side by side.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvf_log.h"

/* What kvf_log() writes for "who" / "first\nsecond", in a child whose
 * environment has KVFERRY_LOG_TIME = @p time (NULL: unset), into @p out. */
static void log_in_child(const char *time, char *out, size_t cap)
{
	FILE *f = tmpfile();
	assert_non_null(f);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		unsetenv("JOURNAL_STREAM");
		if (time != NULL)
			setenv("KVFERRY_LOG_TIME", time, 1);
		else
			unsetenv("KVFERRY_LOG_TIME");
		if (dup2(fileno(f), STDERR_FILENO) < 0)
			_exit(2);
		kvf_log(KVF_LOG_INFO, "who", "first\nsecond");
		fflush(stderr);
		_exit(0);
	}
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	rewind(f);
	size_t n = fread(out, 1, cap - 1, f);
	out[n] = '\0';
	fclose(f);
}

static void a_line_is_plain_unless_the_time_is_asked_for(void **state)
{
	char out[256];

	(void)state;
	log_in_child(NULL, out, sizeof(out));
	assert_string_equal(out, "who: first\nsecond\n");
	log_in_child("0", out, sizeof(out));
	assert_string_equal(out, "who: first\nsecond\n");
}

static void with_kvferry_log_time_every_line_starts_with_the_monotonic_time(void **state)
{
	char out[256];
	struct timespec a, b;

	(void)state;
	clock_gettime(CLOCK_MONOTONIC, &a);
	log_in_child("1", out, sizeof(out));
	clock_gettime(CLOCK_MONOTONIC, &b);
	long long s1, s2;
	long u1, u2;
	int e1 = 0, e2 = 0;
	char rest1[64], rest2[64];
	assert_int_equal(sscanf(out, "[%lld.%6ld] %n", &s1, &u1, &e1), 2);
	assert_true(e1 > 0);
	assert_true(sscanf(out + e1, "%63[^\n]", rest1) == 1);
	assert_string_equal(rest1, "who: first");
	const char *l2 = strchr(out, '\n') + 1;
	assert_int_equal(sscanf(l2, "[%lld.%6ld] %n", &s2, &u2, &e2), 2);
	assert_true(e2 > 0);
	assert_true(sscanf(l2 + e2, "%63[^\n]", rest2) == 1);
	assert_string_equal(rest2, "second");
	/* one message, one time; and it is the clock the test reads */
	assert_true(s1 == s2 && u1 == u2);
	const double t = (double)s1 + u1 / 1e6;
	assert_true(t >= (double)a.tv_sec + a.tv_nsec / 1e9 - 1e-6);
	assert_true(t <= (double)b.tv_sec + b.tv_nsec / 1e9 + 1e-6);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_line_is_plain_unless_the_time_is_asked_for),
		cmocka_unit_test(with_kvferry_log_time_every_line_starts_with_the_monotonic_time),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
