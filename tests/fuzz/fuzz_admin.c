/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: what a client writes on the admin socket, as the
 * server takes it: bytes arriving in pieces, cut into lines, each line
 * parsed as {"cmd": ..., "params": {...}}, resolved by full name or bare
 * verb (ambiguous, unknown), run, and answered with one JSON line. The
 * commands are /help and stand-ins under kvferry-ctrld's names (two
 * modules sharing the verb "status"; one failing without a message, the
 * others answering their params back). The real commands' views are
 * other targets' (/ctrl/config's is fuzz_ini's): one of them makes a reply
 * of ~15 KB, which would cut this target's speed tenfold.
 *
 * Input: byte 0 sets the size of the pieces the bytes arrive in (1..256);
 * the rest is what the client sends.
 *
 * Beyond the sanitizers: every whole line gets exactly one reply, and each
 * reply is a JSON object whose "ok" is a boolean, with an "error" string
 * when it is false.
 *
 * The line reader is static: the target includes admin.c (as unit tests
 * may) and the ctrl library's copy is never linked.
 */
#include <stdint.h>

#include "admin.c"

struct sink {
	size_t replies;
};

static struct ctrl_admin g_a;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A stand-in: its params back, or (with an arg) a failure with no message. */
static int cmd_stub(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	(void)cmd;
	(void)err;
	(void)errlen;
	if (arg)
		return -EBUSY;
	*data = json_deep_copy(params);
	return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	static const char *const echo[] = {"/ctrl/status", "/pd/status", "/sched/stages", "/http/requests",
					   "/pd/rooms", NULL};

	cmds_init(&g_a);
	for (int i = 0; echo[i]; i++)
		if (ctrl_admin_register(&g_a, echo[i], "params back", cmd_stub, NULL))
			abort();
	if (ctrl_admin_register(&g_a, "/ctrl/drain", "fails without a message", cmd_stub, &g_a))
		abort();
	return 0;
}

static int check_reply(void *ctx, const char *reply)
{
	struct sink *s = ctx;
	json_t *j = json_loads(reply, 0, NULL), *ok = json_object_get(j, "ok");

	if (!json_is_object(j) || !json_is_boolean(ok) ||
	    (json_is_false(ok) && !json_is_string(json_object_get(j, "error"))))
		abort();
	json_decref(j);
	s->replies++;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sink s = {0};
	size_t piece, len = 0, lines = 0;
	char *buf;

	if (size < 1)
		return 0;
	piece = (size_t)data[0] + 1;
	data++;
	size--;
	buf = malloc(size + 1);
	if (!buf)
		return 0;
	buf[0] = 0;
	for (size_t off = 0; off < size; off += piece) {
		size_t n = size - off < piece ? size - off : piece;

		memcpy(buf + len, data + off, n);
		len += n;
		buf[len] = 0;
		if (answer_lines(&g_a, buf, &len, check_reply, &s))
			abort();
	}
	for (size_t i = 0; i < size; i++)
		lines += data[i] == '\n';
	if (s.replies != lines)
		abort();
	free(buf);
	return 0;
}
