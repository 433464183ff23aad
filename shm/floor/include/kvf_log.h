/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kvf_log.h
 * How every kvferry daemon writes its log: one message on stderr at a
 * syslog priority. Under systemd (JOURNAL_STREAM set, i.e. stderr is a
 * journal stream) each line starts with "<N>", which journald takes as the
 * entry's priority, so `journalctl -p err` shows the errors and `-p warning`
 * the warnings too; anywhere else (a terminal, a test's log file) the lines
 * stay plain, byte for byte what they were before priorities existed.
 *
 * Levels, the same rule in every daemon:
 *  - KVF_LOG_ERR: the process cannot do what was asked: a refusal, a failed
 *    call, a dropped malformed message whose work is lost;
 *  - KVF_LOG_WARNING: degraded but going on (a retry, a fallback, a restart);
 *  - KVF_LOG_INFO: progress (started, loaded, joined, stopping, reports).
 *
 * Threading: any thread. A message is formatted first and written with one
 * fwrite(), so the lines of messages from concurrent threads do not mix.
 */
#ifndef KVF_LOG_H
#define KVF_LOG_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

/** syslog priorities (sd-daemon.h's SD_ERR, SD_WARNING, SD_INFO). */
enum kvf_log_pri {
	KVF_LOG_ERR = 3,
	KVF_LOG_WARNING = 4,
	KVF_LOG_INFO = 6,
};

/**
 * Whether log lines carry a priority prefix: JOURNAL_STREAM is set and not
 * empty. Read once, at the first call.
 * @return 1 or 0
 */
int kvf_log_journal(void);

/**
 * Write one message on stderr: "[<pri>]WHO: TEXT\n". A message of several
 * lines (TEXT holding '\n') gives each line its own "<pri>" under the
 * journal; only the first carries WHO. A newline ending TEXT is dropped (the
 * helper ends the message).
 * @param pri  a syslog priority (enum kvf_log_pri; clamped to 0..7)
 * @param who  the program's name as the line starts with it
 *             ("kvferry-ctrld", "kvferry-worker[stage0]"), or NULL for none
 * @param fmt  printf format of TEXT
 */
void kvf_log(int pri, const char *who, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/**
 * Whether each line starts with the time, "[SECONDS.MICROS] " on the
 * system's monotonic clock (one clock for every process of a host, so the
 * logs of several daemons interleave by it): KVFERRY_LOG_TIME=1 in the
 * environment, never under the journal (which stamps every entry). For
 * reading a test's or a drill's logs side by side. Read once.
 * @return 1 or 0
 */
int kvf_log_time(void);

/** kvf_log() with a va_list. */
void kvf_vlog(int pri, const char *who, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));

/**
 * On a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) write
 * "WHO: fatal signal N (NAME); backtrace:" and the thread's frames
 * (glibc's backtrace_symbols_fd, on an alternate stack) on stderr at
 * KVF_LOG_ERR, then die of the signal as before (core dump, exit status),
 * so a crash in the field leaves where it happened in the journal.
 * @param who  the program's name (kept: a string literal or static)
 */
void kvf_log_crash_trace(const char *who);

#ifdef __cplusplus
}
#endif
#endif /* KVF_LOG_H */
