/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_admin.h
 * The admin socket of kvferry-ctrld (/run/kvferry/ctrl.sock, mode 0660):
 * JSON lines over a Unix stream socket. Modules register commands named
 * "/module/verb" with help text (modelled on DPDK lib/telemetry); ctrlctl
 * and scripts call them.
 *
 * Wire format, one line each way per call:
 *   request  {"cmd": "/sched/pool", "params": {...}}      (params optional)
 *   reply    {"ok": true,  "cmd": "/sched/pool", "data": ...}
 *            {"ok": false, "cmd": "...", "error": "what went wrong and what to do"}
 * A bare verb ("pool") names the one command ending in "/pool". "/help"
 * lists every command with its help.
 *
 * Threading: the server answers on its own thread, one call at a time, so
 * command functions run there and must be thread-safe with respect to the
 * rest of the daemon. Registration is thread-safe.
 */
#ifndef CTRL_ADMIN_H
#define CTRL_ADMIN_H

#include <stddef.h>

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Longest command name, NUL included. */
#define CTRL_ADMIN_CMDLEN 64
/** Most registered commands. */
#define CTRL_ADMIN_MAX_CMDS 64

/**
 * A command. Runs on the admin thread.
 * @param arg     the registration's argument
 * @param cmd     the full command name
 * @param params  the request's params object (never NULL: {} when absent)
 * @param data    receives the reply data (a new reference) on success
 * @param err     receives the message on failure
 * @return 0, or -errno (the reply carries @p err).
 */
typedef int (*ctrl_admin_fn)(void *arg, const char *cmd, json_t *params, json_t **data,
			     char *err, size_t errlen);

struct ctrl_admin;

/**
 * Listen on @p path and start answering on a thread. A stale socket file
 * (nobody listening) is replaced; a live one is not.
 * @param path  the socket path (its directory must exist)
 * @param mode  permissions of the socket file (0660)
 * @param err   receives a message naming the failing call and the fix
 * @return the server, or NULL with errno: EADDRINUSE (a daemon already
 *         answers there), ENAMETOOLONG, EACCES, ENOENT (no directory), ENOMEM.
 */
struct ctrl_admin *ctrl_admin_start(const char *path, unsigned mode, char *err, size_t errlen);

/**
 * Register a command.
 * @param cmd   "/module/verb"
 * @param help  one line for /help
 * @return 0, -EINVAL (name not of the form /module/verb or too long),
 *         -EEXIST (already registered), -ENOSPC (table full).
 */
int ctrl_admin_register(struct ctrl_admin *a, const char *cmd, const char *help, ctrl_admin_fn fn,
			void *arg);

/** Stop answering, close and unlink the socket. NULL is a no-op. */
void ctrl_admin_stop(struct ctrl_admin *a);

/**
 * Client side (ctrlctl, tests): one call.
 * @param path    the socket
 * @param cmd     a command or bare verb
 * @param params  an object, or NULL
 * @param reply   receives the whole reply object (a new reference)
 * @param timeout_ms  how long to wait for the reply
 * @param err     receives a message when no reply came
 * @return 0 (a reply came, ok or not), -ENOENT/-ECONNREFUSED (no daemon at
 *         @p path), -ETIMEDOUT, -EPROTO (malformed reply), -errno.
 */
int ctrl_admin_call(const char *path, const char *cmd, json_t *params, json_t **reply,
		    int timeout_ms, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* CTRL_ADMIN_H */
