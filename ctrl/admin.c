/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Admin socket server and client. One thread polls the listening socket
 * and a wake-up pipe; each accepted connection is served to EOF, line by
 * line, before the next is accepted. Admin traffic is a person or a script
 * at a time, so serialising it keeps command functions simple (they never
 * run concurrently with each other). A client that stalls mid-line is
 * dropped after ADMIN_IO_MS so that it cannot hold the socket.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ctrl_admin.h"

#define ADMIN_IO_MS 2000
#define ADMIN_LINE_MAX (1 << 20)

struct admin_cmd {
	char name[CTRL_ADMIN_CMDLEN];
	char *help;
	ctrl_admin_fn fn;
	void *arg;
};

struct ctrl_admin {
	int fd;
	int wake[2];
	char *path;
	pthread_t th;
	pthread_mutex_t mu;
	struct admin_cmd cmds[CTRL_ADMIN_MAX_CMDS];
	int n_cmds;
};

static int fill_addr(const char *path, struct sockaddr_un *sa, char *err, size_t errlen)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sa->sun_path)) {
		snprintf(err, errlen, "admin socket path '%s' is longer than %zu bytes; choose a shorter admin_socket",
			 path, sizeof(sa->sun_path) - 1);
		return -ENAMETOOLONG;
	}
	memcpy(sa->sun_path, path, strlen(path) + 1);
	return 0;
}

static int cmd_help(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	struct ctrl_admin *a = arg;
	json_t *arr = json_array();

	(void)cmd;
	(void)params;
	(void)err;
	(void)errlen;
	/* Called from dispatch() with a->mu held. */
	for (int i = 0; i < a->n_cmds; i++)
		json_array_append_new(arr, json_pack("{s:s, s:s}", "cmd", a->cmds[i].name, "help", a->cmds[i].help));
	*data = arr;
	return 0;
}

/* Find the command for a full name or a bare verb. Caller holds mu. */
static const struct admin_cmd *resolve(struct ctrl_admin *a, const char *name, char *err, size_t errlen)
{
	const struct admin_cmd *hit = NULL;
	int n = 0;
	char list[512] = "";

	for (int i = 0; i < a->n_cmds; i++)
		if (!strcmp(a->cmds[i].name, name))
			return &a->cmds[i];
	if (!strchr(name, '/')) {
		for (int i = 0; i < a->n_cmds; i++) {
			const char *verb = strrchr(a->cmds[i].name, '/') + 1;
			if (!strcmp(verb, name)) {
				hit = &a->cmds[i];
				n++;
				snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", n > 1 ? ", " : "",
					 a->cmds[i].name);
			}
		}
		if (n == 1)
			return hit;
		if (n > 1) {
			snprintf(err, errlen, "'%s' is ambiguous: say one of %s", name, list);
			return NULL;
		}
	}
	snprintf(err, errlen, "unknown command '%s' (ctrlctl help lists the commands)", name);
	return NULL;
}

static json_t *dispatch(struct ctrl_admin *a, const char *line)
{
	json_error_t je;
	json_t *req = json_loads(line, 0, &je), *params, *data = NULL, *reply;
	const char *name;
	const struct admin_cmd *c;
	char err[512] = "";
	int rc;

	if (!req || !json_is_object(req) || !json_is_string(json_object_get(req, "cmd"))) {
		json_decref(req);
		return json_pack("{s:b, s:s}", "ok", 0, "error",
				 "malformed request: send one JSON line {\"cmd\": \"/module/verb\", \"params\": {...}}");
	}
	name = json_string_value(json_object_get(req, "cmd"));
	params = json_object_get(req, "params");
	if (params && !json_is_object(params)) {
		reply = json_pack("{s:b, s:s, s:s}", "ok", 0, "cmd", name, "error", "'params' must be an object");
		json_decref(req);
		return reply;
	}
	params = params ? json_incref(params) : json_object();
	pthread_mutex_lock(&a->mu);
	c = resolve(a, name, err, sizeof(err));
	if (c) {
		struct admin_cmd copy = *c;
		if (copy.fn == cmd_help) {
			rc = cmd_help(a, copy.name, params, &data, err, sizeof(err));
			pthread_mutex_unlock(&a->mu);
		} else {
			pthread_mutex_unlock(&a->mu);
			rc = copy.fn(copy.arg, copy.name, params, &data, err, sizeof(err));
		}
		if (rc == 0)
			reply = json_pack("{s:b, s:s, s:o}", "ok", 1, "cmd", copy.name, "data", data ? data : json_null());
		else
			reply = json_pack("{s:b, s:s, s:s}", "ok", 0, "cmd", copy.name, "error",
					  err[0] ? err : strerror(-rc));
	} else {
		pthread_mutex_unlock(&a->mu);
		reply = json_pack("{s:b, s:s, s:s}", "ok", 0, "cmd", name, "error", err);
	}
	json_decref(params);
	json_decref(req);
	return reply;
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Answer every whole line at the front of buf[0..*len) (NUL at [*len]):
 * each reply goes to @p out as one JSON text, and the partial line left
 * moves to the front. @return 0, or -1 when a reply could not be built or
 * @p out failed (then drop the connection). */
static int answer_lines(struct ctrl_admin *a, char *buf, size_t *len,
			int (*out)(void *ctx, const char *reply), void *ctx)
{
	char *nl;

	while ((nl = memchr(buf, '\n', *len))) {
		json_t *reply;
		char *text;
		int rc;

		*nl = 0;
		reply = dispatch(a, buf);
		text = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
		json_decref(reply);
		rc = text ? out(ctx, text) : -1;
		free(text);
		if (rc)
			return -1;
		*len -= (size_t)(nl + 1 - buf);
		memmove(buf, nl + 1, *len);
		buf[*len] = 0;
	}
	return 0;
}

/* answer_lines()'s sink on a connection: the reply and its newline. */
static int send_reply(void *ctx, const char *reply)
{
	int fd = *(int *)ctx;

	return write_all(fd, reply, strlen(reply)) || write_all(fd, "\n", 1) ? -1 : 0;
}

static void serve(struct ctrl_admin *a, int fd)
{
	char *buf = NULL;
	size_t len = 0, cap = 0;

	for (;;) {
		struct pollfd p[2] = {{fd, POLLIN, 0}, {a->wake[0], POLLIN, 0}};
		ssize_t r;

		if (poll(p, 2, ADMIN_IO_MS) <= 0 || (p[1].revents & POLLIN))
			break;
		if (len + 4096 > cap) {
			char *nb;
			if (cap >= ADMIN_LINE_MAX)
				break;
			nb = realloc(buf, cap ? cap * 2 : 8192);
			if (!nb)
				break;
			buf = nb;
			cap = cap ? cap * 2 : 8192;
		}
		r = recv(fd, buf + len, cap - len - 1, 0);
		if (r <= 0)
			break;
		len += (size_t)r;
		buf[len] = 0;
		if (answer_lines(a, buf, &len, send_reply, &fd))
			break;
	}
	free(buf);
}

static void *admin_thread(void *arg)
{
	struct ctrl_admin *a = arg;

	for (;;) {
		struct pollfd p[2] = {{a->fd, POLLIN, 0}, {a->wake[0], POLLIN, 0}};
		int c;

		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[1].revents & POLLIN)
			break;
		c = accept4(a->fd, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0)
			continue;
		serve(a, c);
		close(c);
	}
	return NULL;
}

/* The command table holding /help alone, and its lock. */
static void cmds_init(struct ctrl_admin *a)
{
	pthread_mutex_init(&a->mu, NULL);
	snprintf(a->cmds[0].name, CTRL_ADMIN_CMDLEN, "/help");
	a->cmds[0].help = strdup("list every command with its help");
	a->cmds[0].fn = cmd_help;
	a->cmds[0].arg = a;
	a->n_cmds = 1;
}

static void cmds_fini(struct ctrl_admin *a)
{
	for (int i = 0; i < a->n_cmds; i++)
		free(a->cmds[i].help);
	pthread_mutex_destroy(&a->mu);
}

struct ctrl_admin *ctrl_admin_start(const char *path, unsigned mode, char *err, size_t errlen)
{
	struct ctrl_admin *a;
	struct sockaddr_un sa;
	int rc, probe;

	rc = fill_addr(path, &sa, err, errlen);
	if (rc) {
		errno = -rc;
		return NULL;
	}
	/* Someone answering there is another daemon: never steal its socket. */
	probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		close(probe);
		snprintf(err, errlen, "another kvferry-ctrld already answers on %s: stop it first (systemctl stop kvferry-ctrld) or set admin_socket",
			 path);
		errno = EADDRINUSE;
		return NULL;
	}
	if (probe >= 0)
		close(probe);
	a = calloc(1, sizeof(*a));
	if (!a)
		goto nomem;
	a->path = strdup(path);
	if (!a->path)
		goto nomem_free;
	a->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (a->fd < 0) {
		rc = errno;
		snprintf(err, errlen, "socket(AF_UNIX) failed: %s", strerror(rc));
		goto fail_path;
	}
	unlink(path);
	if (bind(a->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		rc = errno;
		snprintf(err, errlen, "bind(%s) failed: %s%s", path, strerror(rc),
			 rc == ENOENT ? " (create the directory, or let systemd's RuntimeDirectory=kvferry do it)"
			 : rc == EACCES ? " (run as the kvferry user, or choose another admin_socket)" : "");
		goto fail_fd;
	}
	if (chmod(path, mode) < 0) {
		rc = errno;
		snprintf(err, errlen, "chmod(%s, %o) failed: %s", path, mode, strerror(rc));
		goto fail_unlink;
	}
	if (listen(a->fd, 16) < 0) {
		rc = errno;
		snprintf(err, errlen, "listen(%s) failed: %s", path, strerror(rc));
		goto fail_unlink;
	}
	if (pipe2(a->wake, O_CLOEXEC) < 0) {
		rc = errno;
		snprintf(err, errlen, "pipe2 failed: %s", strerror(rc));
		goto fail_unlink;
	}
	cmds_init(a);
	rc = pthread_create(&a->th, NULL, admin_thread, a);
	if (rc == 0)
		pthread_setname_np(a->th, "admin");
	if (rc) {
		snprintf(err, errlen, "pthread_create(admin) failed: %s", strerror(rc));
		goto fail_pipe;
	}
	return a;
fail_pipe:
	cmds_fini(a);
	close(a->wake[0]);
	close(a->wake[1]);
fail_unlink:
	unlink(path);
fail_fd:
	close(a->fd);
fail_path:
	free(a->path);
	free(a);
	errno = rc;
	return NULL;
nomem_free:
	free(a);
nomem:
	snprintf(err, errlen, "ctrl_admin_start: out of memory");
	errno = ENOMEM;
	return NULL;
}

int ctrl_admin_register(struct ctrl_admin *a, const char *cmd, const char *help, ctrl_admin_fn fn, void *arg)
{
	const char *slash2;
	int rc = 0;

	if (!a || !cmd || !fn || cmd[0] != '/' || strlen(cmd) >= CTRL_ADMIN_CMDLEN)
		return -EINVAL;
	slash2 = strchr(cmd + 1, '/');
	if (!slash2 || slash2 == cmd + 1 || !slash2[1] || strchr(slash2 + 1, '/'))
		return -EINVAL;
	pthread_mutex_lock(&a->mu);
	for (int i = 0; i < a->n_cmds; i++)
		if (!strcmp(a->cmds[i].name, cmd))
			rc = -EEXIST;
	if (!rc && a->n_cmds == CTRL_ADMIN_MAX_CMDS)
		rc = -ENOSPC;
	if (!rc) {
		struct admin_cmd *c = &a->cmds[a->n_cmds];
		snprintf(c->name, sizeof(c->name), "%s", cmd);
		c->help = strdup(help ? help : "");
		c->fn = fn;
		c->arg = arg;
		if (!c->help)
			rc = -ENOMEM;
		else
			a->n_cmds++;
	}
	pthread_mutex_unlock(&a->mu);
	return rc;
}

void ctrl_admin_stop(struct ctrl_admin *a)
{
	if (!a)
		return;
	if (write(a->wake[1], "x", 1) < 0) {
		/* The pipe is ours and empty; a failed write cannot happen
		 * short of a closed descriptor, and then the join would hang:
		 * say so rather than hang silently. */
		perror("ctrl_admin_stop: write(wake pipe)");
	}
	pthread_join(a->th, NULL);
	close(a->fd);
	unlink(a->path);
	close(a->wake[0]);
	close(a->wake[1]);
	cmds_fini(a);
	free(a->path);
	free(a);
}

int ctrl_admin_call(const char *path, const char *cmd, json_t *params, json_t **reply, int timeout_ms,
		    char *err, size_t errlen)
{
	struct sockaddr_un sa;
	json_t *req;
	char *line, *buf = NULL;
	size_t len = 0, cap = 0;
	int fd, rc;

	*reply = NULL;
	rc = fill_addr(path, &sa, err, errlen);
	if (rc)
		return rc;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "socket(AF_UNIX) failed: %s", strerror(-rc));
		return rc;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		rc = -errno;
		snprintf(err, errlen, "connect(%s) failed: %s", path, strerror(-rc));
		close(fd);
		return rc;
	}
	req = json_pack("{s:s, s:o}", "cmd", cmd, "params", params ? json_incref(params) : json_object());
	line = json_dumps(req, JSON_COMPACT);
	json_decref(req);
	if (!line || write_all(fd, line, strlen(line)) || write_all(fd, "\n", 1)) {
		rc = -EIO;
		snprintf(err, errlen, "send to %s failed: %s", path, strerror(errno));
		goto out;
	}
	for (;;) {
		struct pollfd p = {fd, POLLIN, 0};
		ssize_t r;
		if (poll(&p, 1, timeout_ms) <= 0) {
			rc = -ETIMEDOUT;
			snprintf(err, errlen, "no reply from %s within %d ms", path, timeout_ms);
			goto out;
		}
		if (len + 4096 > cap) {
			char *nb = realloc(buf, cap ? cap * 2 : 8192);
			if (!nb) {
				rc = -ENOMEM;
				goto out;
			}
			buf = nb;
			cap = cap ? cap * 2 : 8192;
		}
		r = recv(fd, buf + len, cap - len - 1, 0);
		if (r <= 0) {
			rc = -EPROTO;
			snprintf(err, errlen, "%s closed the connection before replying", path);
			goto out;
		}
		len += (size_t)r;
		buf[len] = 0;
		if (memchr(buf, '\n', len))
			break;
	}
	*reply = json_loads(buf, JSON_DISABLE_EOF_CHECK, NULL);
	rc = *reply && json_is_object(*reply) ? 0 : -EPROTO;
	if (rc)
		snprintf(err, errlen, "malformed reply from %s", path);
out:
	free(line);
	free(buf);
	close(fd);
	return rc;
}
