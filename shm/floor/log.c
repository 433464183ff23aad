/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Log lines at syslog priorities (kvf_log.h). Priorities travel as the
 * "<N>" line prefix journald's stream reader understands rather than
 * through sd_journal_print(): the daemons' stderr already is the journal
 * under systemd (StandardError=journal), the prefix keeps every message in
 * order with whatever else the process writes there (DPDK's EAL, a crash
 * message), and no daemon but ctrld links libsystemd.
 */
#include <execinfo.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvf_log.h"

static atomic_int g_journal = -1;

int kvf_log_journal(void)
{
	int j = atomic_load_explicit(&g_journal, memory_order_relaxed);

	if (j < 0) {
		const char *js = getenv("JOURNAL_STREAM");

		/* two threads racing here compute the same answer */
		j = js != NULL && *js != '\0';
		atomic_store_explicit(&g_journal, j, memory_order_relaxed);
	}
	return j;
}

static atomic_int g_time = -1;

int kvf_log_time(void)
{
	int t = atomic_load_explicit(&g_time, memory_order_relaxed);

	if (t < 0) {
		const char *e = getenv("KVFERRY_LOG_TIME");

		t = e != NULL && strcmp(e, "1") == 0 && !kvf_log_journal();
		atomic_store_explicit(&g_time, t, memory_order_relaxed);
	}
	return t;
}

/* The time prefix of every line of a message, or "" (kvf_log_time()). */
#define STAMP_MAX 24
static void stamp(char st[STAMP_MAX])
{
	struct timespec ts;

	st[0] = '\0';
	if (kvf_log_time() && clock_gettime(CLOCK_MONOTONIC, &ts) == 0)
		snprintf(st, STAMP_MAX, "[%lld.%06ld] ", (long long)ts.tv_sec, ts.tv_nsec / 1000);
}

/* Lay out @p msg (@p ml bytes, no final newline) into @p out, which holds
 * at least ml + strlen(who) + 2 + (4 + STAMP_MAX) * lines + 1 bytes.
 * @return bytes. */
static size_t lay_out(char *out, int pri, const char *who, const char *msg, size_t ml, int journal)
{
	size_t n = 0;
	const char *p = msg, *end = msg + ml;
	char st[STAMP_MAX];
	size_t sl;

	stamp(st);
	sl = strlen(st);

	for (int first = 1;; first = 0) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t len = nl != NULL ? (size_t)(nl - p) : (size_t)(end - p);

		if (journal) {
			out[n++] = '<';
			out[n++] = (char)('0' + pri);
			out[n++] = '>';
		}
		memcpy(out + n, st, sl);
		n += sl;
		if (first && who != NULL) {
			size_t wl = strlen(who);

			memcpy(out + n, who, wl);
			n += wl;
			out[n++] = ':';
			out[n++] = ' ';
		}
		memcpy(out + n, p, len);
		n += len;
		out[n++] = '\n';
		if (nl == NULL)
			return n;
		p = nl + 1;
	}
}

void kvf_vlog(int pri, const char *who, const char *fmt, va_list ap)
{
	char sbuf[1024], obuf[1536];
	char *msg = sbuf, *out = obuf;
	size_t ml, lines = 1, cap;
	va_list aq;
	int len;

	if (pri < 0)
		pri = 0;
	if (pri > 7)
		pri = 7;
	va_copy(aq, ap);
	len = vsnprintf(sbuf, sizeof(sbuf), fmt, aq);
	va_end(aq);
	if (len < 0)
		return;
	if ((size_t)len >= sizeof(sbuf)) {
		msg = malloc((size_t)len + 1);
		if (msg == NULL) {
			msg = sbuf; /* out of memory: the message cut to the buffer */
			len = (int)sizeof(sbuf) - 1;
		} else {
			vsnprintf(msg, (size_t)len + 1, fmt, ap);
		}
	}
	ml = (size_t)len;
	if (ml > 0 && msg[ml - 1] == '\n')
		ml--;
	for (size_t i = 0; i < ml; i++)
		lines += msg[i] == '\n';
	cap = ml + (who != NULL ? strlen(who) + 2 : 0) + (4 + STAMP_MAX) * lines + 1;
	if (cap > sizeof(obuf)) {
		out = malloc(cap);
		if (out == NULL) {
			/* out of memory: the same lines, written one by one */
			for (const char *p = msg, *end = msg + ml, *nl;; p = nl + 1) {
				nl = memchr(p, '\n', (size_t)(end - p));
				if (kvf_log_journal())
					fprintf(stderr, "<%d>", pri);
				if (p == msg && who != NULL)
					fprintf(stderr, "%s: ", who);
				fwrite(p, 1, (size_t)((nl != NULL ? nl : end) - p), stderr);
				fputc('\n', stderr);
				if (nl == NULL)
					break;
			}
			goto out;
		}
	}
	fwrite(out, 1, lay_out(out, pri, who, msg, ml, kvf_log_journal()), stderr);
	if (out != obuf)
		free(out);
out:
	if (msg != sbuf)
		free(msg);
}

void kvf_log(int pri, const char *who, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	kvf_vlog(pri, who, fmt, ap);
	va_end(ap);
}

/* ---- fatal signals: a backtrace in the log (kvf_log_crash_trace) ---- */

static const char *crash_who = "kvferry";

static void put(const char *s)
{
	if (write(2, s, strlen(s)) < 0)
		return; /* nothing to do about it here */
}

static void crash_handler(int sig)
{
	void *frames[64];
	int n = backtrace(frames, 64);

	/* async-signal-safe calls only: write(2), strlen and backtrace_symbols_fd */
	put(kvf_log_journal() ? "<3>" : "");
	put(crash_who);
	put(sig == SIGSEGV ? ": fatal signal SIGSEGV" : sig == SIGBUS ? ": fatal signal SIGBUS"
	    : sig == SIGFPE ? ": fatal signal SIGFPE" : sig == SIGILL ? ": fatal signal SIGILL" : ": fatal signal SIGABRT");
	put("; backtrace:\n");
	backtrace_symbols_fd(frames, n, 2);
	raise(sig); /* SA_RESETHAND: the default action now */
}

void kvf_log_crash_trace(const char *who)
{
	static const int sigs[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT };
	static char alt[64 * 1024]; /* a stack overflow leaves the thread's own stack unusable */
	stack_t ss = { .ss_sp = alt, .ss_size = sizeof(alt) };
	struct sigaction sa;
	void *warm[1];

	crash_who = who;
	kvf_log_journal(); /* read JOURNAL_STREAM now, not inside the handler */
	backtrace(warm, 1); /* loads libgcc now, likewise */
	sigaltstack(&ss, NULL);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = crash_handler;
	sa.sa_flags = SA_RESETHAND | SA_ONSTACK;
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigaction(sigs[i], &sa, NULL);
}
