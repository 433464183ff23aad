/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HTTP API against a fake backend that echoes the prompt back one token
 * at a time on its own thread (as the scheduler calls back on its thread).
 * The server runs on an ephemeral loopback port; requests go through libcurl.
 * argv[1]: a tokenizer directory (tests/kernels/data/tok_tiny).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "ctrl_http.h"

#include "http_fake.h"

static const char *text_of(json_t *j)
{
	json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
	json_t *m = json_object_get(ch, "message");

	return json_string_value(m ? json_object_get(m, "content") : json_object_get(ch, "text"));
}

static const char *finish_of(json_t *j)
{
	return json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "finish_reason"));
}

static int usage(json_t *j, const char *k)
{
	return (int)json_integer_value(json_object_get(json_object_get(j, "usage"), k));
}

static int count_tokens(const char *prompt)
{
	json_t *j = post("/tokenize", 200, "{\"model\":\"tiny\",\"prompt\":\"%s\"}", prompt);
	int n = (int)json_integer_value(json_object_get(j, "count"));

	assert_int_equal(json_array_size(json_object_get(j, "tokens")), n);
	json_decref(j);
	return n;
}

/* ---- tests ---- */

static void a_completion_comes_back_with_consistent_usage(void **state)
{
	int n = count_tokens("hello world");
	json_t *j;

	(void)state;
	fake_reset();
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"hello world\",\"max_tokens\":%d,\"temperature\":0}", n);
	assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
	assert_string_equal(text_of(j), "hello world");
	assert_string_equal(finish_of(j), "length");
	assert_int_equal(usage(j, "prompt_tokens"), n);
	assert_int_equal(usage(j, "completion_tokens"), n);
	assert_int_equal(usage(j, "total_tokens"), 2 * n);
	assert_string_equal(json_string_value(json_object_get(j, "model")), "tiny");
	json_decref(j);
	wait_idle();
	/* a node that is not a prefill node serves a request carrying a room like any other */
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"hello world\",\"max_tokens\":%d,"
		 "\"temperature\":0,\"bootstrap_room\":9223372036854775807,\"bootstrap_host\":\"10.0.0.1\","
		 "\"bootstrap_port\":8998}", n);
	assert_string_equal(text_of(j), "hello world");
	json_decref(j);
	wait_idle();
}

static void a_chat_completion_answers_as_the_assistant(void **state)
{
	json_t *j, *t;
	int n;

	(void)state;
	fake_reset();
	t = post("/tokenize", 200, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
	n = (int)json_integer_value(json_object_get(t, "count"));
	json_decref(t);
	j = post("/v1/chat/completions", 200,
		 "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3}");
	assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
	assert_string_equal(json_string_value(json_object_get(json_object_get(
				    json_array_get(json_object_get(j, "choices"), 0), "message"), "role")),
			    "assistant");
	assert_int_equal(usage(j, "prompt_tokens"), n);
	assert_int_equal(usage(j, "completion_tokens"), 3);
	assert_string_equal(finish_of(j), "length");
	json_decref(j);
	wait_idle();
}

static void the_stop_token_ends_with_finish_reason_stop(void **state)
{
	json_t *j;

	(void)state;
	fake_reset();
	atomic_store(&g_fake.eos_after, 2);
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"abcdef\",\"max_tokens\":50}");
	assert_string_equal(finish_of(j), "stop");
	assert_int_equal(usage(j, "completion_tokens"), 3);
	json_decref(j);
	wait_idle();
}

static void a_stop_string_ends_the_output_and_is_not_included(void **state)
{
	json_t *j;
	int cancels = atomic_load(&g_fake.cancels);

	(void)state;
	fake_reset();
	atomic_store(&g_fake.token_us, 2000);
	j = post("/v1/completions", 200,
		 "{\"model\":\"tiny\",\"prompt\":\"one two END three four five six\",\"max_tokens\":500,\"stop\":[\"xyz\",\"END\"]}");
	assert_string_equal(text_of(j), "one two ");
	assert_string_equal(finish_of(j), "stop");
	json_decref(j);
	/* The backend was told to stop rather than run to max_tokens. */
	assert_int_equal(atomic_load(&g_fake.cancels), cancels + 1);
	wait_idle();
}

/* Parse an SSE body: every event is "data: ...\n\n"; returns the text. */
static char *sse_text(const char *body, int chat, const char **finish, int *events, json_t **usage_out)
{
	static char text[4096];
	static char fin[32];
	const char *p = body;

	text[0] = fin[0] = 0;
	*events = 0;
	*finish = NULL;
	while (*p) {
		const char *end = strstr(p, "\n\n");
		json_t *j, *ch, *v;
		char buf[2048];

		assert_non_null(end);
		assert_memory_equal(p, "data: ", 6);
		snprintf(buf, sizeof(buf), "%.*s", (int)(end - p - 6), p + 6);
		p = end + 2;
		(*events)++;
		if (!strcmp(buf, "[DONE]")) {
			assert_int_equal(*p, 0);
			break;
		}
		j = json_loads(buf, 0, NULL);
		assert_non_null(j);
		assert_string_equal(json_string_value(json_object_get(j, "object")),
				    chat ? "chat.completion.chunk" : "text_completion");
		ch = json_array_get(json_object_get(j, "choices"), 0);
		if (!ch && usage_out)
			*usage_out = json_incref(json_object_get(j, "usage"));
		v = chat ? json_object_get(json_object_get(ch, "delta"), "content") : json_object_get(ch, "text");
		if (json_is_string(v))
			strcat(text, json_string_value(v));
		if (json_is_string(json_object_get(ch, "finish_reason"))) {
			snprintf(fin, sizeof(fin), "%s", json_string_value(json_object_get(ch, "finish_reason")));
			*finish = fin;
		}
		json_decref(j);
	}
	assert_true(strstr(body, "data: [DONE]\n\n") != NULL);
	return text;
}

static void a_stream_frames_sse_chunks_and_ends_with_done(void **state)
{
	struct resp r;
	const char *finish;
	int events;
	json_t *u = NULL, *j;
	char *text;

	(void)state;
	fake_reset();
	j = post("/v1/chat/completions", 200,
		 "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"stream me\"}],\"max_tokens\":12,\"temperature\":0}");
	assert_int_equal(request("POST", "/v1/chat/completions",
				 "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"stream me\"}],"
				 "\"max_tokens\":12,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
				 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	text = sse_text(r.body, 1, &finish, &events, &u);
	/* role chunk, at least one content chunk, finish, usage, [DONE] */
	assert_true(events >= 5);
	assert_string_equal(text, text_of(j));
	assert_string_equal(finish, "length");
	assert_non_null(u);
	assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 12);
	json_decref(u);
	json_decref(j);
	resp_free(&r);
	wait_idle();
}

static void a_streamed_stop_string_is_never_sent_even_in_part(void **state)
{
	struct resp r;
	const char *finish;
	int events;

	(void)state;
	fake_reset();
	assert_int_equal(request("POST", "/v1/completions",
				 "{\"model\":\"tiny\",\"prompt\":\"aaa bbSTOcc STOP dd\",\"max_tokens\":400,\"stream\":true,\"stop\":\"STOP\"}",
				 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_string_equal(sse_text(r.body, 0, &finish, &events, NULL), "aaa bbSTOcc ");
	assert_string_equal(finish, "stop");
	assert_null(strstr(r.body, "STOP\""));
	resp_free(&r);
	wait_idle();
}

static void assert_error(long status, const char *param, const char *code, const char *path, const char *body)
{
	struct resp r;
	json_t *e;

	assert_int_equal(request(body ? "POST" : "GET", path, body, 0, &r), CURLE_OK);
	if (r.status != status)
		fprintf(stderr, "%s %s -> %ld %s\n", path, body ? body : "", r.status, r.body ? r.body : "");
	assert_int_equal(r.status, status);
	assert_non_null(r.json);
	e = json_object_get(r.json, "error");
	assert_true(json_is_object(e));
	assert_true(json_string_length(json_object_get(e, "message")) > 10);
	assert_true(json_is_string(json_object_get(e, "type")));
	assert_non_null(json_object_get(e, "param"));
	assert_non_null(json_object_get(e, "code"));
	if (param)
		assert_string_equal(json_string_value(json_object_get(e, "param")), param);
	else
		assert_true(json_is_null(json_object_get(e, "param")));
	if (code)
		assert_string_equal(json_string_value(json_object_get(e, "code")), code);
	resp_free(&r);
}

static void bad_requests_get_openai_error_objects(void **state)
{
	(void)state;
	fake_reset();
	assert_error(400, NULL, "invalid_json", "/v1/completions", "{\"model\":\"tiny\",");
	assert_error(400, NULL, "invalid_json", "/v1/completions", "[1,2]");
	assert_error(404, "model", "model_not_found", "/v1/completions", "{\"model\":\"gpt-9\",\"prompt\":\"x\"}");
	assert_error(400, "model", "missing_required_parameter", "/v1/completions", "{\"prompt\":\"x\"}");
	assert_error(400, "prompt", "missing_required_parameter", "/v1/completions", "{\"model\":\"tiny\"}");
	assert_error(400, "prompt", "invalid_type", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":[\"a\",5]}");
	assert_error(400, "prompt", "invalid_value", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":[\"a\",\"\"]}");
	assert_error(400, "prompt", "invalid_value", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":[\"a\",\"b\",\"c\"],\"n\":50}");
	assert_error(400, "n", "invalid_value", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\",\"n\":129}");
	assert_error(400, "n", "invalid_value", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\",\"n\":0}");
	assert_error(400, "n", "unsupported_value", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"x\",\"n\":2,\"bootstrap_room\":7}");
	assert_error(400, "max_tokens", "invalid_type", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":\"5\"}");
	assert_error(400, "max_tokens", "invalid_value", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":0}");
	assert_error(400, "temperature", "invalid_value", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\",\"temperature\":3}");
	assert_error(400, "stream", "invalid_type", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\",\"stream\":\"yes\"}");
	assert_error(400, "stop", "invalid_type", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\",\"stop\":5}");
	assert_error(400, "messages", "missing_required_parameter", "/v1/chat/completions", "{\"model\":\"tiny\"}");
	assert_error(400, "messages", "invalid_type", "/v1/chat/completions", "{\"model\":\"tiny\",\"messages\":[]}");
	assert_error(400, "messages", "invalid_value", "/v1/chat/completions", "{\"model\":\"tiny\",\"messages\":[{\"content\":\"x\"}]}");
	assert_error(400, "prompt", "invalid_value", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":[1,99999]}");
	assert_error(400, "tokens", "invalid_value", "/detokenize", "{\"model\":\"tiny\",\"tokens\":[-1]}");
	/* SGLang's PD bootstrap fields are checked like any other */
	assert_error(400, "bootstrap_room", "invalid_type", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"x\",\"bootstrap_room\":\"7\"}");
	assert_error(400, "bootstrap_room", "invalid_value", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"x\",\"bootstrap_room\":-1}");
	assert_error(400, "bootstrap_port", "invalid_value", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"x\",\"bootstrap_room\":7,\"bootstrap_port\":70000}");
	assert_error(400, "bootstrap_host", "invalid_type", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"x\",\"bootstrap_room\":7,\"bootstrap_host\":5}");
	assert_error(404, NULL, "not_found", "/v1/nothing", NULL);
	assert_error(405, NULL, "method_not_allowed", "/v1/completions", NULL);
	/* Nothing reached the backend. */
	assert_int_equal(atomic_load(&g_fake.live), 0);
}

static void a_prompt_longer_than_the_context_is_refused(void **state)
{
	char body[8192];
	int n;

	(void)state;
	fake_reset();
	snprintf(body, sizeof(body), "{\"model\":\"tiny\",\"prompt\":\"");
	for (int i = 0; i < CTX / 2; i++)
		strcat(body, "a b ");
	strcat(body, "\"}");
	assert_error(400, "prompt", "context_length_exceeded", "/v1/completions", body);
	n = count_tokens("a b c d");
	snprintf(body, sizeof(body), "{\"model\":\"tiny\",\"prompt\":\"a b c d\",\"max_tokens\":%d}", CTX - n + 1);
	assert_error(400, "max_tokens", "context_length_exceeded", "/v1/completions", body);
	snprintf(body, sizeof(body), "{\"model\":\"tiny\",\"prompt\":\"a b c d\",\"max_tokens\":%d}", CTX - n);
	json_decref(post("/v1/completions", 200, "%s", body));
	wait_idle();
}

static void an_oversized_body_gets_413(void **state)
{
	size_t len = 200 * 1024;
	char *body = malloc(len + 64);

	(void)state;
	fake_reset();
	snprintf(body, 64, "{\"model\":\"tiny\",\"prompt\":\"");
	memset(body + strlen(body), 'a', len);
	strcpy(body + 26 + len, "\"}");
	assert_error(413, NULL, "request_too_large", "/v1/completions", body);
	free(body);
}

static void a_client_that_disconnects_cancels_its_request(void **state)
{
	struct resp r;
	int cancels = atomic_load(&g_fake.cancels);

	(void)state;
	fake_reset();
	atomic_store(&g_fake.token_us, 20000); /* 50 tokens/s: 500 tokens take 10 s */
	assert_int_equal(request("POST", "/v1/completions",
				 "{\"model\":\"tiny\",\"prompt\":\"slow\",\"max_tokens\":60}", 150, &r),
			 CURLE_OPERATION_TIMEDOUT);
	resp_free(&r);
	assert_int_equal(request("POST", "/v1/completions",
				 "{\"model\":\"tiny\",\"prompt\":\"slow\",\"max_tokens\":60,\"stream\":true}", 150, &r),
			 CURLE_OPERATION_TIMEDOUT);
	resp_free(&r);
	/* Both are cancelled long before 60 tokens (1.2 s) could finish them. */
	for (int i = 0; i < 100 && atomic_load(&g_fake.cancels) < cancels + 2; i++)
		usleep(10000);
	assert_int_equal(atomic_load(&g_fake.cancels), cancels + 2);
	wait_idle();
}

struct bg {
	pthread_t th;
	struct resp r;
};

static void *bg_post(void *arg)
{
	struct bg *b = arg;

	request("POST", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"in flight\",\"max_tokens\":40}", 0, &b->r);
	return NULL;
}

static void draining_refuses_new_work_and_finishes_what_is_in_flight(void **state)
{
	struct bg b;
	struct resp r;

	(void)state;
	fake_reset();
	atomic_store(&g_fake.token_us, 5000);
	pthread_create(&b.th, NULL, bg_post, &b);
	while (atomic_load(&g_fake.live) == 0)
		usleep(1000);
	ctrl_http_set_draining(g_http, 1);
	assert_error(503, NULL, "draining", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"late\"}");
	assert_int_equal(request("GET", "/health", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 503);
	resp_free(&r);
	assert_true(ctrl_http_active(g_http) >= 1);
	pthread_join(b.th, NULL);
	assert_int_equal(b.r.status, 200);
	assert_int_equal(usage(b.r.json, "completion_tokens"), 40);
	resp_free(&b.r);
	wait_idle();
	ctrl_http_set_draining(g_http, 0);
	assert_int_equal(request("GET", "/health", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	resp_free(&r);
}

static void backend_failures_and_a_full_queue_become_5xx(void **state)
{
	struct resp r;
	const char *finish;
	int events;

	(void)state;
	fake_reset();
	atomic_store(&g_fake.fail_after, 2);
	assert_error(500, NULL, "generation_failed", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"abc\",\"max_tokens\":9}");
	assert_int_equal(request("POST", "/v1/completions",
				 "{\"model\":\"tiny\",\"prompt\":\"abc\",\"max_tokens\":9,\"stream\":true}", 0, &r), CURLE_OK);
	assert_non_null(strstr(r.body, "stage 1 stopped answering"));
	assert_non_null(strstr(r.body, "data: [DONE]\n\n"));
	(void)finish;
	(void)events;
	resp_free(&r);
	wait_idle();
	fake_reset();
	atomic_store(&g_fake.refuse, 1);
	assert_error(503, NULL, "queue_full", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"abc\"}");
	fake_reset();
}

/* A stream of n choices: each one's text and finish by index, the usage
 * chunk and [DONE] (each must come once, [DONE] last). */
static void sse_choices(const char *body, int n, char text[][256], const char **finish, int *usages)
{
	static char fin[8][32];
	const char *p = body;
	int done = 0;

	*usages = 0;
	for (int i = 0; i < n; i++) {
		text[i][0] = 0;
		finish[i] = NULL;
	}
	while (*p) {
		const char *end = strstr(p, "\n\n");
		json_t *j, *chs;
		char buf[2048];

		assert_non_null(end);
		assert_memory_equal(p, "data: ", 6);
		assert_int_equal(done, 0);
		snprintf(buf, sizeof(buf), "%.*s", (int)(end - p - 6), p + 6);
		p = end + 2;
		if (!strcmp(buf, "[DONE]")) {
			done = 1;
			continue;
		}
		j = json_loads(buf, 0, NULL);
		assert_non_null(j);
		chs = json_object_get(j, "choices");
		if (json_array_size(chs) == 0) {
			assert_non_null(json_object_get(j, "usage"));
			(*usages)++;
		}
		for (size_t k = 0; k < json_array_size(chs); k++) {
			json_t *ch = json_array_get(chs, k), *v = json_object_get(ch, "text");
			int i = (int)json_integer_value(json_object_get(ch, "index"));

			assert_true(i >= 0 && i < n);
			assert_null(finish[i]); /* nothing of a choice after its finish */
			if (json_is_string(v))
				strcat(text[i], json_string_value(v));
			if (json_is_string(json_object_get(ch, "finish_reason"))) {
				snprintf(fin[i], sizeof(fin[i]), "%s", json_string_value(json_object_get(ch, "finish_reason")));
				finish[i] = fin[i];
			}
		}
		json_decref(j);
	}
	assert_int_equal(done, 1);
}

static void n_choices_answer_in_one_body_and_one_stream_and_end_together(void **state)
{
	json_t *one, *j, *chs;
	struct resp r;
	char text[3][256];
	const char *finish[3];
	int usages, submits, cancels;

	(void)state;
	fake_reset();
	one = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"abc\",\"max_tokens\":5}");
	submits = atomic_load(&g_fake.submits);
	/* one backend request a choice; the prompt counts once in usage */
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"abc\",\"max_tokens\":5,\"n\":3,\"seed\":4}");
	assert_int_equal(atomic_load(&g_fake.submits), submits + 3);
	chs = json_object_get(j, "choices");
	assert_int_equal(json_array_size(chs), 3);
	for (int i = 0; i < 3; i++) {
		json_t *ch = json_array_get(chs, (size_t)i);

		assert_int_equal(json_integer_value(json_object_get(ch, "index")), i);
		assert_string_equal(json_string_value(json_object_get(ch, "text")), text_of(one));
		assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
	}
	assert_int_equal(usage(j, "prompt_tokens"), usage(one, "prompt_tokens"));
	assert_int_equal(usage(j, "completion_tokens"), 15);
	assert_int_equal(usage(j, "total_tokens"), usage(one, "prompt_tokens") + 15);
	json_decref(j);
	wait_idle();

	/* streamed: each choice's chunks by index, one finish each, one usage,
	 * one [DONE] */
	assert_int_equal(request("POST", "/v1/completions",
				 "{\"model\":\"tiny\",\"prompt\":\"abc\",\"max_tokens\":5,\"n\":3,\"stream\":true,"
				 "\"stream_options\":{\"include_usage\":true}}", 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	sse_choices(r.body, 3, text, finish, &usages);
	for (int i = 0; i < 3; i++) {
		assert_string_equal(text[i], text_of(one));
		assert_non_null(finish[i]);
		assert_string_equal(finish[i], "length");
	}
	assert_int_equal(usages, 1);
	resp_free(&r);
	wait_idle();

	/* a choice the queue refuses: the ones taken are cancelled, a 503 */
	cancels = atomic_load(&g_fake.cancels);
	atomic_store(&g_fake.token_us, 20000);
	atomic_store(&g_fake.refuse_from, atomic_load(&g_fake.submits) + 2);
	assert_error(503, NULL, "queue_full", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"abc\",\"max_tokens\":50,\"n\":3}");
	assert_int_equal(atomic_load(&g_fake.cancels), cancels + 2);
	wait_idle();

	/* a choice that fails fails the request: 500, or the stream's error
	 * event and [DONE]; the other choices are cancelled */
	fake_reset();
	atomic_store(&g_fake.fail_after, 2);
	assert_error(500, NULL, "generation_failed", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"abc\",\"max_tokens\":9,\"n\":2}");
	assert_int_equal(request("POST", "/v1/chat/completions",
				 "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":9,"
				 "\"n\":2,\"stream\":true}", 0, &r), CURLE_OK);
	assert_non_null(strstr(r.body, "stage 1 stopped answering"));
	assert_non_null(strstr(r.body, "data: [DONE]\n\n"));
	assert_null(strstr(strstr(r.body, "data: [DONE]") + 1, "data: [DONE]"));
	resp_free(&r);
	wait_idle();

	/* a client that goes away cancels every choice */
	fake_reset();
	cancels = atomic_load(&g_fake.cancels);
	atomic_store(&g_fake.token_us, 20000);
	assert_int_equal(request("POST", "/v1/completions",
				 "{\"model\":\"tiny\",\"prompt\":\"slow\",\"max_tokens\":60,\"n\":3,\"stream\":true}", 150, &r),
			 CURLE_OPERATION_TIMEDOUT);
	resp_free(&r);
	for (int i = 0; i < 100 && atomic_load(&g_fake.cancels) < cancels + 3; i++)
		usleep(10000);
	assert_int_equal(atomic_load(&g_fake.cancels), cancels + 3);
	wait_idle();
	json_decref(one);
	fake_reset();
}

static void models_tokenize_and_detokenize_agree(void **state)
{
	struct resp r;
	json_t *t, *d;
	char body[1024];
	char *toks;

	(void)state;
	fake_reset();
	assert_int_equal(request("GET", "/v1/models", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(r.json, "data"), 0), "id")), "tiny");
	resp_free(&r);
	t = post("/tokenize", 200, "{\"model\":\"tiny\",\"prompt\":\"round trip, ok?\"}");
	assert_int_equal(json_integer_value(json_object_get(t, "max_model_len")), CTX);
	toks = json_dumps(json_object_get(t, "tokens"), JSON_COMPACT);
	snprintf(body, sizeof(body), "{\"model\":\"tiny\",\"tokens\":%s}", toks);
	free(toks);
	d = post("/detokenize", 200, "%s", body);
	assert_string_equal(json_string_value(json_object_get(d, "prompt")), "round trip, ok?");
	json_decref(t);
	json_decref(d);
	/* A prompt given as token ids is the same prompt. */
	t = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":[5,6,7],\"max_tokens\":3}");
	assert_int_equal(usage(t, "prompt_tokens"), 3);
	json_decref(t);
	wait_idle();
}

static void stats_metrics_and_dashboard_are_served(void **state)
{
	struct resp r;

	(void)state;
	fake_reset();
	assert_int_equal(request("GET", "/stats", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_true(json_integer_value(json_object_get(json_object_get(r.json, "http"), "requests_total")) > 0);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(r.json, "backend"), "live")), 0);
	resp_free(&r);
	assert_int_equal(request("GET", "/metrics", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_non_null(strstr(r.body, "# TYPE kvferry_http_requests_total counter\nkvferry_http_requests_total "));
	/* every family has its HELP line (naming its /stats field) right before its TYPE line */
	assert_non_null(strstr(r.body, "# HELP kvferry_http_requests_total /stats http.requests_total (ctrl/API.md)\n"
				       "# TYPE kvferry_http_requests_total counter\n"));
	assert_non_null(strstr(r.body, "# HELP kvferry_backend_replicas_stages_steps /stats "
				       "backend.replicas[].stages[].steps"));
	for (const char *t = strstr(r.body, "# TYPE "); t != NULL; t = strstr(t + 1, "# TYPE ")) {
		const char *h = t - 1;

		assert_true(t > r.body);
		while (h > r.body && h[-1] != '\n')
			h--; /* the start of the line before */
		assert_true(!strncmp(h, "# HELP ", 7));
		assert_int_equal(strncmp(h + 7, t + 7, strcspn(t + 7, " ")), 0);
	}
	assert_non_null(strstr(r.body, "kvferry_build_info{version=\""));
	assert_non_null(strstr(r.body, "kvferry_backend_replicas_stages_steps{replica=\"0\",stage=\"1\"} 7\n"));
	/* Every sample of a name follows its one TYPE line. */
	assert_non_null(strstr(r.body, "# TYPE kvferry_backend_replicas_stages_steps gauge\n"
				       "kvferry_backend_replicas_stages_steps{replica=\"0\",stage=\"0\"} 5\n"
				       "kvferry_backend_replicas_stages_steps{replica=\"0\",stage=\"1\"} 7\n"));
	resp_free(&r);
	assert_int_equal(request("GET", "/stats?format=html", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_non_null(strstr(r.body, "fetch('/stats')"));
	resp_free(&r);
}

/* /stats latency.<name>.count, and the sample @p name of /metrics. */
static int64_t hist_count(json_t *st, const char *name)
{
	return json_integer_value(json_object_get(json_object_get(json_object_get(st, "latency"), name), "count"));
}

static json_t *get_stats(void)
{
	struct resp r;
	json_t *j;

	assert_int_equal(request("GET", "/stats", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_non_null(r.json);
	j = json_incref(r.json);
	resp_free(&r);
	return j;
}

static int64_t http_counter(json_t *st, const char *k)
{
	return json_integer_value(json_object_get(json_object_get(st, "http"), k));
}

static void latency_histograms_count_what_was_served_and_polls_are_not_client_requests(void **state)
{
	json_t *a, *b, *j;
	struct resp r;
	const char *p;
	char want[160];

	(void)state;
	fake_reset();
	wait_idle();
	a = get_stats();
	/* 3 answered, 1 streamed, 1 that fails after its second token; 5 tokens each */
	for (int i = 0; i < 3; i++) {
		j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"count me in\",\"max_tokens\":5}");
		assert_int_equal(usage(j, "completion_tokens"), 5);
		json_decref(j);
	}
	assert_int_equal(request("POST", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"streamed\","
				 "\"max_tokens\":5,\"stream\":true}", 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_non_null(strstr(r.body, "data: [DONE]"));
	resp_free(&r);
	atomic_store(&g_fake.fail_after, 2);
	j = post("/v1/completions", 500, "{\"model\":\"tiny\",\"prompt\":\"doomed\",\"max_tokens\":5}");
	json_decref(j);
	atomic_store(&g_fake.fail_after, -1);
	wait_idle();
	b = get_stats();
	/* first tokens and queue times of all 5, the tokens after the first (4 x 4 + 1),
	 * end to end of the 4 answered: a failed request has no answer to time */
	assert_int_equal(hist_count(b, "time_to_first_token_seconds") - hist_count(a, "time_to_first_token_seconds"), 5);
	assert_int_equal(hist_count(b, "request_queue_time_seconds") - hist_count(a, "request_queue_time_seconds"), 5);
	assert_int_equal(hist_count(b, "inter_token_latency_seconds") - hist_count(a, "inter_token_latency_seconds"), 17);
	assert_int_equal(hist_count(b, "e2e_request_latency_seconds") - hist_count(a, "e2e_request_latency_seconds"), 4);
	/* 5 client requests between the two GET /stats, which are monitoring
	 * (each counts itself: the second is the one between) */
	assert_int_equal(http_counter(b, "requests_total") - http_counter(a, "requests_total"), 5);
	assert_int_equal(http_counter(b, "monitor_requests_total") - http_counter(a, "monitor_requests_total"), 1);

	assert_int_equal(request("GET", "/metrics", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_non_null(strstr(r.body, "# TYPE kvferry_time_to_first_token_seconds histogram\n"
				       "kvferry_time_to_first_token_seconds_bucket{le=\"0.001\"} "));
	snprintf(want, sizeof(want), "kvferry_e2e_request_latency_seconds_bucket{le=\"+Inf\"} %lld\n",
		 (long long)hist_count(b, "e2e_request_latency_seconds"));
	assert_non_null(p = strstr(r.body, want));
	snprintf(want, sizeof(want), "kvferry_e2e_request_latency_seconds_count %lld\n",
		 (long long)hist_count(b, "e2e_request_latency_seconds"));
	assert_non_null(strstr(p, want));
	/* base units, the pool's size a gauge, rooms by state a label */
	assert_non_null(strstr(r.body, "# TYPE kvferry_backend_replicas_stages_mean_step_seconds gauge\n"
				       "kvferry_backend_replicas_stages_mean_step_seconds{replica=\"0\",stage=\"0\"} 0.0015\n"
				       "kvferry_backend_replicas_stages_mean_step_seconds{replica=\"0\",stage=\"1\"} 0.00025\n"));
	assert_non_null(strstr(r.body, "kvferry_backend_replicas_stages_busy_ratio{replica=\"0\",stage=\"1\"} 0.5\n"));
	assert_non_null(strstr(r.body, "# TYPE kvferry_backend_replicas_blocks_capacity gauge\n"
				       "kvferry_backend_replicas_blocks_capacity{replica=\"0\"} 64\n"));
	assert_non_null(strstr(r.body, "# TYPE kvferry_backend_pd_rooms gauge\n"
				       "kvferry_backend_pd_rooms{state=\"Bootstrapping\"} 1\n"
				       "kvferry_backend_pd_rooms{state=\"WaitingForInput\"} 4\n"));
	assert_non_null(strstr(r.body, "# TYPE kvferry_uptime_seconds gauge\n"));
	/* (HELP lines still name the /stats fields: _us and blocks_total appear there) */
	assert_null(strstr(r.body, "_us{"));
	assert_null(strstr(r.body, "_us gauge"));
	assert_null(strstr(r.body, "\nkvferry_backend_replicas_blocks_total"));
	resp_free(&r);
	json_decref(a);
	json_decref(b);
}

/* ---- probes, admission, ids, parameters, models ---- */

static void health_answers_503_naming_what_is_down_while_livez_stays_200(void **state)
{
	struct resp r;
	json_t *st;

	(void)state;
	fake_reset();
	for (int i = 0; i < 3; i++) {
		const char *path = i == 0 ? "/health" : i == 1 ? "/readyz" : "/livez";

		assert_int_equal(request("GET", path, NULL, 0, &r), CURLE_OK);
		assert_int_equal(r.status, 200);
		assert_string_equal(json_string_value(json_object_get(r.json, "status")), i == 2 ? "alive" : "ok");
		resp_free(&r);
	}
	/* a stage goes down: readiness says so, by name; liveness does not */
	atomic_store(&g_fake.down, 1);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(request("GET", i ? "/readyz" : "/health", NULL, 0, &r), CURLE_OK);
		assert_int_equal(r.status, 503);
		assert_string_equal(json_string_value(json_object_get(r.json, "status")), "unavailable");
		assert_non_null(strstr(json_string_value(json_object_get(r.json, "reason")), "stage 1 (kvferry-worker pid 4242) down"));
		resp_free(&r);
	}
	assert_int_equal(request("GET", "/livez", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	resp_free(&r);
	st = get_stats();
	assert_true(json_is_false(json_object_get(st, "ready")));
	json_decref(st);
	atomic_store(&g_fake.down, 0);
	/* draining: not ready either, and says why; still alive */
	ctrl_http_set_draining(g_http, 1);
	assert_int_equal(request("GET", "/readyz", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 503);
	assert_string_equal(json_string_value(json_object_get(r.json, "status")), "draining");
	resp_free(&r);
	assert_int_equal(request("GET", "/livez", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	resp_free(&r);
	ctrl_http_set_draining(g_http, 0);
	st = get_stats();
	assert_true(json_is_true(json_object_get(st, "ready")));
	json_decref(st);
}

static void a_request_the_kv_pool_could_never_hold_is_a_400_before_any_byte_is_streamed(void **state)
{
	int n = count_tokens("hello world"), submits = atomic_load(&g_fake.submits);
	struct resp r;
	json_t *j;

	(void)state;
	fake_reset();
	atomic_store(&g_fake.pool, n + 10); /* the prompt and 10 tokens */
	for (int stream = 0; stream < 2; stream++) {
		char body[256];
		json_t *e;

		snprintf(body, sizeof(body), "{\"model\":\"tiny\",\"prompt\":\"hello world\",\"max_tokens\":11%s}",
			 stream ? ",\"stream\":true" : "");
		assert_int_equal(request("POST", "/v1/completions", body, 0, &r), CURLE_OK);
		assert_int_equal(r.status, 400); /* not a 200 and an error event */
		assert_non_null(r.json);
		e = json_object_get(r.json, "error");
		assert_string_equal(json_string_value(json_object_get(e, "code")), "context_length_exceeded");
		assert_string_equal(json_string_value(json_object_get(e, "param")), "max_tokens");
		/* the backend's own words */
		assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "but the pool holds"));
		resp_free(&r);
	}
	assert_int_equal(atomic_load(&g_fake.submits), submits);
	/* what fits is served */
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"hello world\",\"max_tokens\":10}");
	assert_int_equal(usage(j, "completion_tokens"), 10);
	json_decref(j);
	/* a request that does not say gets what fits, not the default 16 */
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"hello world\"}");
	assert_int_equal(usage(j, "completion_tokens"), 10);
	json_decref(j);
	/* a prompt the pool cannot hold at all: 400 naming the prompt */
	atomic_store(&g_fake.pool, n - 1);
	assert_error(400, "prompt", "context_length_exceeded", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"hello world\"}");
	wait_idle();
}

static void response_ids_are_unique_even_for_seeded_requests_in_one_second(void **state)
{
	char seen[24][48];

	(void)state;
	fake_reset();
	for (int i = 0; i < 24; i++) {
		json_t *j = post(i % 2 ? "/v1/chat/completions" : "/v1/completions", 200,
				 i % 2 ? "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1,\"seed\":7}"
				       : "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":1,\"seed\":7}");
		const char *id = json_string_value(json_object_get(j, "id"));

		assert_non_null(id);
		assert_true(!strncmp(id, i % 2 ? "chatcmpl-" : "cmpl-", i % 2 ? 9 : 5));
		snprintf(seen[i], sizeof(seen[i]), "%s", strchr(id, '-'));
		for (int k = 0; k < i; k++)
			assert_string_not_equal(seen[k], seen[i]);
		json_decref(j);
	}
	wait_idle();
}

/* echo (/v1/completions): the text starts with the prompt's, streamed or
 * not; a stop string in the prompt does not cut it, one in the generated
 * text does. */
static void echo_starts_the_text_with_the_prompt_and_no_stop_string_cuts_the_prompt(void **state)
{
	json_t *plain, *j;
	struct resp r;
	const char *finish;
	int events;
	char want[256];

	(void)state;
	fake_reset();
	plain = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"abc\",\"max_tokens\":4}");
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"abc\",\"max_tokens\":4,\"echo\":true}");
	snprintf(want, sizeof(want), "abc%s", text_of(plain));
	assert_string_equal(text_of(j), want);
	assert_int_equal(usage(j, "completion_tokens"), usage(plain, "completion_tokens"));
	json_decref(j);
	assert_int_equal(request("POST", "/v1/completions",
				 "{\"model\":\"tiny\",\"prompt\":\"abc\",\"max_tokens\":4,\"echo\":true,\"stream\":true}", 0, &r),
			 CURLE_OK);
	assert_string_equal(sse_text(r.body, 0, &finish, &events, NULL), want);
	resp_free(&r);
	/* the fake says the prompt back: its stop string ends the generated text */
	j = post("/v1/completions", 200,
		 "{\"model\":\"tiny\",\"prompt\":\"abSTOPc\",\"max_tokens\":40,\"echo\":true,\"stop\":\"STOP\"}");
	assert_string_equal(text_of(j), "abSTOPcab");
	assert_string_equal(finish_of(j), "stop");
	json_decref(j);
	assert_error(400, "echo", "invalid_type", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\",\"echo\":1}");
	json_decref(plain);
	wait_idle();
}

/* The legacy logprobs object of a streamed answer, its chunks' lists joined. */
static json_t *sse_logprobs(const char *body)
{
	json_t *all = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
	const char *p = body;

	while ((p = strstr(p, "data: {")) != NULL) {
		const char *end = strstr(p, "\n\n");
		json_t *j = json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL), *lp;
		const char *k;
		json_t *v;

		assert_non_null(j);
		lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
		if (json_is_object(lp))
			json_object_foreach(lp, k, v)
				json_array_extend(json_object_get(all, k), v);
		json_decref(j);
		p = end;
	}
	return all;
}

/*
 * echo with logprobs (lm-eval's likelihoods): the prompt tokens' entries
 * first, the first with null logprob and alternatives, each with its text's
 * offset in the echoed text, then the generated tokens'; streamed in the
 * same lists; max_tokens 0 gives the prompt alone, only with echo; and a
 * request the prefill node of a pair would compute is refused.
 */
static void echo_with_logprobs_reports_the_prompt_tokens_then_the_generated_ones(void **state)
{
	int n = count_tokens("abcd");
	json_t *j, *lp, *s, *v;
	struct resp r;
	char text[256] = "";
	size_t i;

	(void)state;
	fake_reset();
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"abcd\",\"max_tokens\":3,\"echo\":true,\"logprobs\":2}");
	lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
	assert_int_equal(json_array_size(json_object_get(lp, "tokens")), n + 3);
	assert_true(json_is_null(json_array_get(json_object_get(lp, "token_logprobs"), 0)));
	assert_true(json_is_null(json_array_get(json_object_get(lp, "top_logprobs"), 0)));
	json_array_foreach(json_object_get(lp, "token_logprobs"), i, v) {
		if (i == 0)
			continue;
		assert_true(json_is_real(v));
		assert_true(fabs(json_real_value(v) - ((int)i < n ? -(double)i / 8.0 : -0.5)) < 1e-6);
		if ((int)i < n) /* the fake's two: the prompt's token, then token 0 */
			assert_int_equal(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), i)), 2);
	}
	json_array_foreach(json_object_get(lp, "tokens"), i, v) {
		assert_int_equal(json_integer_value(json_array_get(json_object_get(lp, "text_offset"), i)), strlen(text));
		strcat(text, json_string_value(v));
	}
	assert_string_equal(text, text_of(j));
	assert_memory_equal(text, "abcd", 4);
	assert_int_equal(usage(j, "completion_tokens"), 3);
	assert_int_equal(usage(j, "prompt_tokens"), n);
	/* streamed: the same text, the same lists */
	assert_int_equal(request("POST", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"abcd\",\"max_tokens\":3,"
				 "\"echo\":true,\"logprobs\":2,\"stream\":true}", 0, &r), CURLE_OK);
	s = sse_logprobs(r.body);
	assert_true(json_equal(s, lp));
	json_decref(s);
	resp_free(&r);
	json_decref(j);
	/* max_tokens 0: the prompt alone, scored */
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"abcd\",\"max_tokens\":0,\"echo\":true,\"logprobs\":0}");
	lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
	assert_string_equal(text_of(j), "abcd");
	assert_string_equal(finish_of(j), "length");
	assert_int_equal(usage(j, "completion_tokens"), 0);
	assert_int_equal(json_array_size(json_object_get(lp, "token_logprobs")), n);
	assert_int_equal(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 1)), 0);
	json_decref(j);
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"abcd\",\"max_tokens\":0,\"echo\":true}");
	assert_string_equal(text_of(j), "abcd");
	assert_true(json_is_null(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs")));
	json_decref(j);
	/* a list of prompts, n 3 each: each choice its own prompt's entries,
	 * scored once a prompt (by its first choice), streamed or not */
	for (int stream = 0; stream < 2; stream++) {
		const char *body = "{\"model\":\"tiny\",\"prompt\":[\"ab\",\"abcd\"],\"max_tokens\":1,\"echo\":true,"
				   "\"logprobs\":1,\"n\":3,\"stream\":%s}";
		char b[256];
		json_t *ch;

		snprintf(b, sizeof(b), body, stream ? "true" : "false");
		atomic_store(&g_fake.plp_asked, 0);
		assert_int_equal(request("POST", "/v1/completions", b, 0, &r), CURLE_OK);
		assert_int_equal(r.status, 200);
		assert_int_equal(atomic_load(&g_fake.plp_asked), 2);
		if (stream) {
			/* the last prompt's third choice: its entries came with its first chunk */
			const char *p = strstr(r.body, "\"index\":5"), *t = p ? strstr(p, "\"token_logprobs\":[null,") : NULL;

			assert_non_null(t);
			assert_true(strstr(p, "\n\n") > t);
			resp_free(&r);
			continue;
		}
		ch = json_object_get(r.json, "choices");
		for (size_t c = 0; c < 6; c++) {
			json_t *lp = json_object_get(json_array_get(ch, c), "logprobs"), *first;

			first = json_object_get(json_array_get(ch, c - c % 3), "logprobs");
			assert_int_equal(json_array_size(json_object_get(lp, "tokens")), (c < 3 ? 2 : (size_t)n) + 1);
			assert_true(json_equal(json_object_get(lp, "text_offset"), json_object_get(first, "text_offset")));
			for (size_t k = 1; k < (c < 3 ? 2 : (size_t)n); k++)
				assert_true(json_equal(json_array_get(json_object_get(lp, "token_logprobs"), k),
						       json_array_get(json_object_get(first, "token_logprobs"), k)));
		}
		resp_free(&r);
	}
	assert_error(400, "max_tokens", "invalid_value", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":0}");
	assert_error(400, "max_tokens", "invalid_value", "/v1/chat/completions",
		     "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}");
	assert_error(400, "echo", "unsupported_value", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"x\",\"echo\":true,\"logprobs\":1,\"bootstrap_room\":7}");
	assert_error(400, "max_tokens", "unsupported_value", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"x\",\"echo\":true,\"max_tokens\":0,\"bootstrap_room\":7}");
	wait_idle();
}

/*
 * vLLM's request extensions that change the answer and that kvferry
 * implements: stop_token_ids, include_stop_str_in_output,
 * skip_special_tokens, truncate_prompt_tokens, add_special_tokens and
 * chat_template_kwargs' enable_thinking; the others are refused by name.
 */
static void vllms_extensions_are_applied_or_refused_by_name(void **state)
{
	json_t *t, *j, *plain;
	int32_t ids[8];
	int n = 0, nb;
	size_t i;
	json_t *v;
	struct resp r;
	const char *finish;
	int events;

	(void)state;
	fake_reset();
	t = post("/tokenize", 200, "{\"model\":\"tiny\",\"prompt\":\"abcdefgh\",\"add_special_tokens\":false}");
	json_array_foreach(json_object_get(t, "tokens"), i, v)
		if (n < 8)
			ids[n++] = (int32_t)json_integer_value(v);
	json_decref(t);
	assert_true(n >= 4 && ids[2] != ids[0] && ids[2] != ids[1]);
	/* stop_token_ids: the fake says the prompt back, so it stops at the third token */
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":[%d,%d,%d,%d],\"max_tokens\":20,"
		 "\"stop_token_ids\":[%d]}", ids[0], ids[1], ids[2], ids[3], ids[2]);
	assert_string_equal(finish_of(j), "stop");
	assert_int_equal(usage(j, "completion_tokens"), 3);
	json_decref(j);
	assert_error(400, "stop_token_ids", "invalid_value", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"x\",\"stop_token_ids\":[-1]}");
	/* include_stop_str_in_output: the stop string ends the text, streamed or not */
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"aaa bbSTOcc STOP dd\",\"max_tokens\":400,"
		 "\"stop\":\"STOP\",\"include_stop_str_in_output\":true}");
	assert_string_equal(text_of(j), "aaa bbSTOcc STOP");
	json_decref(j);
	assert_int_equal(request("POST", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"aaa bbSTOcc STOP dd\","
				 "\"max_tokens\":400,\"stream\":true,\"stop\":\"STOP\",\"include_stop_str_in_output\":true}",
				 0, &r), CURLE_OK);
	assert_string_equal(sse_text(r.body, 0, &finish, &events, NULL), "aaa bbSTOcc STOP");
	assert_string_equal(finish, "stop");
	resp_free(&r);
	/* skip_special_tokens false: the chat template's special tokens the fake says back show */
	plain = post("/v1/chat/completions", 200, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
		     "\"max_tokens\":4}");
	j = post("/v1/chat/completions", 200, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
		 "\"max_tokens\":4,\"skip_special_tokens\":false}");
	assert_null(strstr(text_of(plain), "<|im_start|>"));
	assert_non_null(strstr(text_of(j), "<|im_start|>"));
	json_decref(j);
	/* chat_template_kwargs: enable_thinking is read (this template ignores it), others refused */
	j = post("/v1/chat/completions", 200, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
		 "\"max_tokens\":4,\"chat_template_kwargs\":{\"enable_thinking\":false}}");
	assert_int_equal(usage(j, "prompt_tokens"), usage(plain, "prompt_tokens"));
	json_decref(j);
	json_decref(plain);
	assert_error(400, "chat_template_kwargs", "unsupported_parameter", "/v1/chat/completions",
		     "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template_kwargs\":{\"tools\":1}}");
	assert_error(400, "chat_template_kwargs", "invalid_type", "/v1/chat/completions",
		     "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template_kwargs\":\"x\"}");
	/* truncate_prompt_tokens: the prompt's last k tokens */
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":[%d,%d,%d,%d],\"max_tokens\":1,\"echo\":true,"
		 "\"truncate_prompt_tokens\":2}", ids[0], ids[1], ids[2], ids[3]);
	assert_int_equal(usage(j, "prompt_tokens"), 2);
	assert_memory_equal(text_of(j), "cd", 2);
	json_decref(j);
	/* add_special_tokens false: the prompt as /tokenize encodes it without them */
	nb = count_tokens("abcdefgh");
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"abcdefgh\",\"max_tokens\":1,\"add_special_tokens\":false}");
	assert_int_equal(usage(j, "prompt_tokens"), n);
	assert_true(nb >= n);
	json_decref(j);
	assert_error(400, "add_special_tokens", "unsupported_value", "/v1/chat/completions",
		     "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"add_special_tokens\":true}");
	/* the extensions kvferry does not implement */
	assert_error(400, "bad_words", "unsupported_parameter", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"x\",\"bad_words\":[\"no\"]}");
	assert_error(400, "add_generation_prompt", "unsupported_parameter", "/v1/chat/completions",
		     "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"add_generation_prompt\":false}");
	assert_error(400, "allowed_token_ids", "unsupported_parameter", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"x\",\"allowed_token_ids\":[1,2]}");
	wait_idle();
}

/* The chat template of the server's tokenizer: tests/kernels/data/chat/NAME,
 * or (NULL) the tokenizer's own again. */
static void use_template(const char *name)
{
	char path[512], err[256];

	if (name)
		snprintf(path, sizeof(path), "%s/../chat/%s", g_tok_dir, name);
	else
		snprintf(path, sizeof(path), "%s/tokenizer_config.json", g_tok_dir);
	if (kn_tok_load_chat_template(g_tok, path, err, sizeof(err)))
		fail_msg("%s: %s", path, err);
}

#define TOOLS "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":" \
	      "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]"
#define ASK "\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"weather in Paris?\"}]"
#define MT ", \"max_tokens\":200"
#define CALL "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"

/*
 * Tool calling (a Qwen 2.5 template): the model's <tool_call>s come back as
 * the message's tool_calls, text before them as its content, streamed or
 * not; an answer whose calls do not parse is text; tool_choice "none" reads
 * nothing; a history with calls and results is rendered; what cannot be
 * done is refused by name.
 */
static void a_models_tool_calls_come_back_as_tool_calls_streamed_or_not(void **state)
{
	json_t *j, *msg, *c, *args, *plain;
	struct resp r;
	const char *p;
	int calls = 0, finishes = 0;
	char content[256] = "";

	(void)state;
	fake_reset();
	use_template("qwen25.jinja");
	fake_say(CALL);
	j = post("/v1/chat/completions", 200, "{" ASK ", " TOOLS MT "}");
	msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
	assert_true(json_is_null(json_object_get(msg, "content")));
	c = json_array_get(json_object_get(msg, "tool_calls"), 0);
	assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
	assert_memory_equal(json_string_value(json_object_get(c, "id")), "chatcmpl-tool-", 14);
	assert_string_equal(json_string_value(json_object_get(json_object_get(c, "function"), "name")), "get_weather");
	args = json_loads(json_string_value(json_object_get(json_object_get(c, "function"), "arguments")), 0, NULL);
	assert_string_equal(json_string_value(json_object_get(args, "city")), "Paris");
	json_decref(args);
	assert_string_equal(finish_of(j), "tool_calls");
	json_decref(j);
	/* content before two calls; streamed: the content, then the calls in one chunk, then the finish */
	fake_say("Let me check.\n" CALL CALL);
	j = post("/v1/chat/completions", 200, "{" ASK ", " TOOLS MT "}");
	msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
	assert_string_equal(json_string_value(json_object_get(msg, "content")), "Let me check.\n");
	assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 2);
	json_decref(j);
	assert_int_equal(request("POST", "/v1/chat/completions", "{" ASK ", " TOOLS MT ", \"stream\":true}", 0, &r), CURLE_OK);
	for (p = strstr(r.body, "data: {"); p; p = strstr(p + 1, "data: {")) {
		json_t *ev = json_loadb(p + 6, (size_t)(strstr(p, "\n\n") - p - 6), 0, NULL), *ch, *d;

		assert_non_null(ev);
		ch = json_array_get(json_object_get(ev, "choices"), 0);
		d = json_object_get(ch, "delta");
		if (json_is_string(json_object_get(d, "content")))
			strcat(content, json_string_value(json_object_get(d, "content")));
		if (json_object_get(d, "tool_calls")) {
			calls += (int)json_array_size(json_object_get(d, "tool_calls"));
			assert_int_equal(json_integer_value(json_object_get(json_array_get(json_object_get(d, "tool_calls"), 1),
									    "index")), 1);
		}
		if (json_is_string(json_object_get(ch, "finish_reason"))) {
			assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "tool_calls");
			finishes++;
		}
		json_decref(ev);
	}
	assert_string_equal(content, "Let me check.\n");
	assert_int_equal(calls, 2);
	assert_int_equal(finishes, 1);
	resp_free(&r);
	/* not JSON inside: the answer is text, whole, streamed or not */
	fake_say("<tool_call>\nnot json\n</tool_call>");
	j = post("/v1/chat/completions", 200, "{" ASK ", " TOOLS MT "}");
	assert_string_equal(text_of(j), "<tool_call>\nnot json\n</tool_call>");
	assert_string_equal(finish_of(j), "stop");
	json_decref(j);
	assert_int_equal(request("POST", "/v1/chat/completions", "{" ASK ", " TOOLS MT ", \"stream\":true}", 0, &r), CURLE_OK);
	{
		const char *fin;
		int events;

		assert_string_equal(sse_text(r.body, 1, &fin, &events, NULL), "<tool_call>\nnot json\n</tool_call>");
	}
	resp_free(&r);
	/* tool_choice none: the tools are listed, the answer read as text */
	fake_say(CALL);
	j = post("/v1/chat/completions", 200, "{" ASK ", " TOOLS MT ", \"tool_choice\":\"none\"}");
	assert_string_equal(text_of(j), CALL);
	json_decref(j);
	/* a history of calls and results renders; the prompt grows by them */
	atomic_store(&g_fake.n_say, 0);
	plain = post("/v1/chat/completions", 200, "{" ASK ", " TOOLS ", \"max_tokens\":1}");
	j = post("/v1/chat/completions", 200, "{\"model\":\"tiny\",\"max_tokens\":1, " TOOLS ", \"messages\":["
		 "{\"role\":\"user\",\"content\":\"weather in Paris?\"},{\"role\":\"assistant\",\"content\":null,"
		 "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
		 "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\","
		 "\"content\":\"21 C\"}]}");
	assert_true(usage(j, "prompt_tokens") > usage(plain, "prompt_tokens") + 20);
	json_decref(j);
	json_decref(plain);
	assert_error(400, "messages", "invalid_value", "/v1/chat/completions",
		     "{\"model\":\"tiny\",\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":"
		     "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{not json\"}}]}]}");
	assert_error(400, "tool_choice", "unsupported_value", "/v1/chat/completions",
		     "{" ASK ", " TOOLS ", \"tool_choice\":\"required\"}");
	assert_error(400, "tools", "invalid_value", "/v1/chat/completions",
		     "{" ASK ", \"tools\":[{\"type\":\"function\",\"function\":{}}]}");
	/* Llama 3.1+: the answer is the call, {"name", "parameters"} JSON, ";" between two */
	use_template("llama31.jinja");
	fake_say("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; "
		 "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}");
	j = post("/v1/chat/completions", 200, "{" ASK ", " TOOLS MT "}");
	msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
	assert_true(json_is_null(json_object_get(msg, "content")));
	assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 2);
	args = json_loads(json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(msg,
		"tool_calls"), 1), "function"), "arguments")), 0, NULL);
	assert_string_equal(json_string_value(json_object_get(args, "city")), "Rome");
	json_decref(args);
	assert_string_equal(finish_of(j), "tool_calls");
	json_decref(j);
	assert_int_equal(request("POST", "/v1/chat/completions", "{" ASK ", " TOOLS MT ", \"stream\":true}", 0, &r), CURLE_OK);
	assert_null(strstr(r.body, "\"content\":\"{"));
	assert_non_null(strstr(r.body, "\"tool_calls\":[{"));
	assert_non_null(strstr(r.body, "\"finish_reason\":\"tool_calls\""));
	resp_free(&r);
	fake_say("It is sunny.");
	j = post("/v1/chat/completions", 200, "{" ASK ", " TOOLS MT "}");
	assert_string_equal(text_of(j), "It is sunny.");
	assert_string_equal(finish_of(j), "stop");
	json_decref(j);
	fake_say("{\"name\": \"get_weather\"");
	j = post("/v1/chat/completions", 200, "{" ASK ", " TOOLS MT "}");
	assert_string_equal(text_of(j), "{\"name\": \"get_weather\"");
	json_decref(j);
	/* a template that does not render tools refuses them */
	use_template(NULL);
	assert_error(400, "tools", "unsupported_value", "/v1/chat/completions", "{" ASK ", " TOOLS MT "}");
	assert_error(400, "tools", "unsupported_parameter", "/v1/completions",
		     "{\"model\":\"tiny\",\"prompt\":\"x\", " TOOLS "}");
	fake_reset();
	wait_idle();
}

static void parameters_kvferry_lacks_are_refused_by_name_unless_at_their_default(void **state)
{
	static const char *const refused[][2] = {
		{"logit_bias", "{\"50256\":-100}"}, {"presence_penalty", "0.5"}, {"frequency_penalty", "-1"},
		{"best_of", "3"}, {"suffix", "\"tail\""}, {"echo", "true"}, /* chat's (completions echo) */
		/* tools on /v1/completions (chat reads them: a_models_tool_calls_...) */
		{"tools", "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]"},
		{"response_format", "{\"type\":\"json_object\"}"}, {"tool_choice", "\"required\""},
		{"functions", "[{\"name\":\"f\"}]"}, {"modalities", "[\"text\",\"audio\"]"},
		{"repetition_penalty", "1.1"}, {"min_tokens", "4"}, {"guided_json", "{}"},
	};
	static const char *const neutral =
		"\"logit_bias\":{},\"presence_penalty\":0,\"frequency_penalty\":0.0,\"best_of\":1,\"echo\":false,"
		"\"suffix\":null,\"response_format\":{\"type\":\"text\"},\"tools\":[],\"tool_choice\":\"none\","
		"\"functions\":null,\"function_call\":\"auto\",\"modalities\":[\"text\"],\"repetition_penalty\":1,"
		"\"min_p\":0,\"user\":\"someone\"";
	char body[512];
	json_t *j;

	(void)state;
	fake_reset();
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		snprintf(body, sizeof(body), "{\"model\":\"tiny\",\"%s\":[{\"role\":\"user\",\"content\":\"x\"}],\"%s\":%s}",
			 i % 2 ? "messages" : "prompt", refused[i][0], refused[i][1]);
		if (i % 2 == 0)
			snprintf(body, sizeof(body), "{\"model\":\"tiny\",\"prompt\":\"x\",\"%s\":%s}", refused[i][0],
				 refused[i][1]);
		assert_error(400, refused[i][0], "unsupported_parameter",
			     i % 2 ? "/v1/chat/completions" : "/v1/completions", body);
	}
	assert_int_equal(atomic_load(&g_fake.live), 0);
	/* the defaults ask for nothing: served */
	j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":2,\"n\":1,%s}", neutral);
	assert_int_equal(usage(j, "completion_tokens"), 2);
	json_decref(j);
	j = post("/v1/chat/completions", 200,
		 "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2,%s}", neutral);
	assert_int_equal(usage(j, "completion_tokens"), 2);
	json_decref(j);
	wait_idle();
}

static void a_model_is_retrieved_by_its_id_and_another_id_is_a_404(void **state)
{
	struct resp r;

	(void)state;
	fake_reset();
	assert_int_equal(request("GET", "/v1/models/tiny", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_string_equal(json_string_value(json_object_get(r.json, "id")), "tiny");
	assert_string_equal(json_string_value(json_object_get(r.json, "object")), "model");
	assert_int_equal(json_integer_value(json_object_get(r.json, "max_model_len")), CTX);
	resp_free(&r);
	assert_error(404, "model", "model_not_found", "/v1/models/gpt-9", NULL);
	assert_error(404, "model", "model_not_found", "/v1/models/tiny%2Fother", NULL);
}

/* ---- the wire: framing, timeouts, the connection limit (raw sockets) ---- */

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int raw_connect(uint16_t port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

struct wire {
	char out[16384];
	size_t n;
	int closed;                  /* the server closed (or reset) the connection */
	double secs;                 /* until it closed, or the wait ended */
};

/* Write @p req on @p fd while reading what comes back, until the server closes
 * the connection or @p wait_s passes. A server that answers and closes
 * before it read everything is fine: the rest is not sent. */
static void wire_talk(int fd, const char *req, size_t len, double wait_s, struct wire *w)
{
	double t0 = mono_s();
	size_t sent = 0;

	memset(w, 0, sizeof(*w));
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN | (sent < len ? POLLOUT : 0)};
		double left = t0 + wait_s - mono_s();

		if (left <= 0)
			break;
		if (poll(&p, 1, (int)(left * 1000) + 1) <= 0)
			continue;
		if ((p.revents & POLLOUT) && sent < len) {
			ssize_t k = send(fd, req + sent, len - sent, MSG_NOSIGNAL | MSG_DONTWAIT);

			if (k > 0)
				sent += (size_t)k;
			else if (k < 0 && errno != EAGAIN)
				sent = len; /* the server is gone: read what it said */
		}
		if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
			ssize_t k = recv(fd, w->out + w->n, sizeof(w->out) - 1 - w->n, MSG_DONTWAIT);

			if (k > 0) {
				w->n += (size_t)k;
				w->out[w->n] = 0;
			} else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
				w->closed = 1;
				break;
			}
		}
	}
	w->secs = mono_s() - t0;
}

static void wire(uint16_t port, const char *req, size_t len, double wait_s, struct wire *w)
{
	int fd = raw_connect(port);

	wire_talk(fd, req, len, wait_s, w);
	close(fd);
}

static int count_of(const char *hay, const char *needle)
{
	int n = 0;

	for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

/* The one answer's JSON error code (asserts there is exactly one answer). */
static void assert_one_json_error(const struct wire *w, const char *status_line, const char *code)
{
	const char *b = strstr(w->out, "\r\n\r\n");
	json_t *j;

	if (strncmp(w->out, status_line, strlen(status_line)))
		fprintf(stderr, "got: %.300s\n", w->out);
	assert_true(!strncmp(w->out, status_line, strlen(status_line)));
	assert_int_equal(count_of(w->out, "HTTP/1.1 "), 1);
	assert_non_null(strcasestr(w->out, "\r\nContent-Type: application/json\r\n"));
	assert_non_null(b);
	j = json_loads(b + 4, 0, NULL);
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")), code);
	json_decref(j);
}

static void content_lengths_two_readers_could_frame_differently_are_refused_and_closed(void **state)
{
	uint16_t port = ctrl_http_port(g_http);
	const char *smuggled = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
	char req[1024];
	struct wire w;
	int n;

	(void)state;
	fake_reset();
	/* A proxy that takes the last Content-Length sees one request; MHD
	 * would take the first and run the body as a second request. */
	n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
		     "Content-Length: %zu\r\n\r\n%s", strlen(smuggled), smuggled);
	wire(port, req, (size_t)n, 5, &w);
	assert_one_json_error(&w, "HTTP/1.1 400 ", "invalid_content_length");
	assert_non_null(strcasestr(w.out, "\r\nConnection: close\r\n"));
	assert_true(w.closed);
	n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
		     "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
	wire(port, req, (size_t)n, 5, &w);
	assert_one_json_error(&w, "HTTP/1.1 400 ", "invalid_content_length");
	assert_true(w.closed);
	n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n");
	wire(port, req, (size_t)n, 5, &w);
	assert_one_json_error(&w, "HTTP/1.1 501 ", "unsupported_transfer_encoding");
	/* the same length twice frames the body one way only: served */
	n = snprintf(req, sizeof(req), "GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n"
		     "Connection: close\r\n\r\n");
	wire(port, req, (size_t)n, 5, &w);
	assert_true(!strncmp(w.out, "HTTP/1.1 200 ", 13));
	assert_int_equal(atomic_load(&g_fake.live), 0);
}

/*
 * libmicrohttpd refuses these itself, before any handler runs: the status is
 * right and the connection closed, but the body is its own HTML (and for a
 * bad Content-Length, 0.9.75 writes its status line twice): ctrl/API.md
 * "Errors" says so. Pinned here: the status and the close.
 */
static void malformed_lengths_and_huge_headers_or_urls_are_refused_and_closed(void **state)
{
	uint16_t port = ctrl_http_port(g_http);
	static const char *const cl[][2] = {
		{"-5", "HTTP/1.1 400 "}, {"abc", "HTTP/1.1 400 "}, {"99999999999999999999999", "HTTP/1.1 413 "},
		{"99999999999", "HTTP/1.1 413 "}, /* fits in 64 bits: ours, JSON */
	};
	size_t big = 1 << 20;
	char *req = malloc(big + 256);
	struct wire w;
	int n;

	(void)state;
	fake_reset();
	for (size_t i = 0; i < sizeof(cl) / sizeof(cl[0]); i++) {
		n = snprintf(req, 256, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n\r\n{}", cl[i][0]);
		wire(port, req, (size_t)n, 5, &w);
		assert_true(!strncmp(w.out, cl[i][1], strlen(cl[i][1])));
		assert_true(w.closed);
		if (i == 3)
			assert_one_json_error(&w, cl[i][1], "request_too_large");
	}
	/* a 1 MiB header, a 1 MiB URL */
	n = snprintf(req, 256, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ");
	memset(req + n, 'a', big);
	memcpy(req + n + big, "\r\n\r\n", 4);
	wire(port, req, (size_t)n + big + 4, 5, &w);
	assert_true(!strncmp(w.out, "HTTP/1.1 431 ", 13));
	assert_true(w.closed);
	n = snprintf(req, 256, "GET /");
	memset(req + n, 'a', big);
	n += snprintf(req + n + big, 64, " HTTP/1.1\r\nHost: x\r\n\r\n");
	wire(port, req, (size_t)n + big, 5, &w);
	assert_true(!strncmp(w.out, "HTTP/1.1 414 ", 13));
	assert_true(w.closed);
	free(req);
}

/* A server of its own, with small limits. */
static struct ctrl_http *start_small(int32_t max_connections, int32_t conn_timeout_s, double req_timeout_s,
				     const char *cors)
{
	struct ctrl_http_opts o;
	struct ctrl_http_backend be = {fake_submit, fake_cancel, fake_stats, &g_fake, NULL,
				       fake_ready, &g_fake, fake_admissible, &g_fake, NULL, NULL, NULL, NULL};
	struct ctrl_http *h;
	char err[256];

	ctrl_http_opts_init(&o);
	o.port = 0;
	o.threads = 2;
	o.model_name = "tiny";
	o.max_context = CTX;
	o.tok = g_tok;
	o.max_connections = max_connections;
	o.connection_timeout_s = conn_timeout_s;
	o.request_timeout_s = req_timeout_s;
	o.cors_origins = cors;
	h = ctrl_http_start(&o, &be, err, sizeof(err));
	if (!h)
		fprintf(stderr, "%s\n", err);
	assert_non_null(h);
	return h;
}

static void idle_stalled_and_trickling_connections_are_closed_in_time(void **state)
{
	struct ctrl_http *h = start_small(64, 1, 2.5, NULL);
	uint16_t port = ctrl_http_port(h);
	const char *stalled = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":";
	const char *slow = "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
	double t0;
	struct wire w;
	json_t *st;
	int fd, closed = 0;

	(void)state;
	fake_reset();
	/* idle: nothing sent */
	wire(port, "", 0, 10, &w);
	assert_true(w.closed);
	assert_int_equal(w.n, 0);
	assert_true(w.secs > 0.8 && w.secs < 3);
	/* a Content-Length larger than the body: closed, not answered after 40 s */
	wire(port, stalled, strlen(stalled), 10, &w);
	assert_true(w.closed);
	assert_true(w.secs > 0.8 && w.secs < 3);
	/* a byte every 0.3 s is never idle for 1 s: the request deadline ends it */
	fd = raw_connect(port);
	t0 = mono_s();
	for (size_t i = 0; i < strlen(slow) && mono_s() - t0 < 10; i++) {
		if (send(fd, slow + i, 1, MSG_NOSIGNAL) != 1) {
			closed = 1;
			break;
		}
		wire_talk(fd, "", 0, 0.3, &w);
		if (w.closed) {
			closed = 1;
			break;
		}
	}
	close(fd);
	assert_true(closed);
	assert_true(mono_s() - t0 > 2.3 && mono_s() - t0 < 4.5);
	/* a request waiting for its tokens longer than both is not idle */
	{
		char body[256], req[512];
		int n = snprintf(body, sizeof(body), "{\"model\":\"tiny\",\"prompt\":\"slow\",\"max_tokens\":200}");

		atomic_store(&g_fake.token_us, 20000); /* 200 tokens: 4 s */
		n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", n, body);
		wire(port, req, (size_t)n, 15, &w);
		assert_true(!strncmp(w.out, "HTTP/1.1 200 ", 13));
		assert_non_null(strstr(w.out, "\"completion_tokens\":200"));
		atomic_store(&g_fake.token_us, 200);
	}
	{
		struct ctrl_http *keep = g_http;

		g_http = h;
		wait_idle();
		g_http = keep;
	}
	st = ctrl_http_stats_json(h);
	assert_true(json_integer_value(json_object_get(json_object_get(st, "http"), "slow_requests_closed_total")) >= 1);
	json_decref(st);
	ctrl_http_stop(h);
}

static void connections_beyond_max_connections_get_a_503_json_and_are_closed(void **state)
{
	struct ctrl_http *h = start_small(3, 30, 30, NULL);
	uint16_t port = ctrl_http_port(h);
	const char *get = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
	const char *live = "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n";
	int idle[3];
	struct wire w;
	json_t *st;

	(void)state;
	fake_reset();
	for (int i = 0; i < 3; i++)
		idle[i] = raw_connect(port);
	usleep(100000); /* MHD accepts them */
	wire(port, get, strlen(get), 5, &w);
	assert_one_json_error(&w, "HTTP/1.1 503 ", "too_many_connections");
	assert_non_null(strcasestr(w.out, "\r\nConnection: close\r\n"));
	assert_true(w.closed);
	/* a liveness probe still answers */
	wire(port, live, strlen(live), 5, &w);
	assert_true(!strncmp(w.out, "HTTP/1.1 200 ", 13));
	/* at the limit again: served */
	close(idle[0]);
	usleep(100000);
	wire(port, get, strlen(get), 2, &w);
	assert_true(!strncmp(w.out, "HTTP/1.1 200 ", 13));
	close(idle[1]);
	close(idle[2]);
	st = ctrl_http_stats_json(h);
	assert_int_equal(json_integer_value(json_object_get(json_object_get(st, "http"), "connections_refused_total")), 1);
	json_decref(st);
	ctrl_http_stop(h);
}

/* One request on its own connection ("METHOD PATH"), with an Origin (NULL:
 * none), more header lines and a JSON body (NULL: none); @p w the answer. */
static void cors_talk(uint16_t port, const char *line, const char *origin, const char *headers, const char *body,
		      struct wire *w)
{
	char req[1024], orig[128] = "", len[96] = "";

	if (origin)
		snprintf(orig, sizeof(orig), "Origin: %s\r\n", origin);
	if (body)
		snprintf(len, sizeof(len), "Content-Type: application/json\r\nContent-Length: %zu\r\n", strlen(body));
	snprintf(req, sizeof(req), "%s HTTP/1.1\r\nHost: x\r\n%s%s%sConnection: close\r\n\r\n%s", line, orig, headers,
		 len, body ? body : "");
	wire(port, req, strlen(req), 5, w);
}

/* cors_allow_origins: a browser's preflight from an allowed origin gets
 * 204 with the methods and headers it asked for, another origin a 403
 * naming the key; answers carry Access-Control-Allow-Origin for the allowed
 * origins only; without the key nothing changes (OPTIONS 405, no header). */
static void cors_answers_preflights_and_tags_answers_for_the_allowed_origins_only(void **state)
{
	struct ctrl_http *h = start_small(0, 30, 30, "https://chat.example, http://localhost:3000");
	uint16_t port = ctrl_http_port(h);
	struct wire w;
	char err[256];
	struct ctrl_http_opts o;

	(void)state;
	fake_reset();
	cors_talk(port, "OPTIONS /v1/chat/completions", "http://localhost:3000",
		  "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type,authorization\r\n",
		  NULL, &w);
	assert_true(!strncmp(w.out, "HTTP/1.1 204 ", 13));
	assert_non_null(strcasestr(w.out, "\r\nAccess-Control-Allow-Origin: http://localhost:3000\r\n"));
	assert_non_null(strcasestr(w.out, "\r\nAccess-Control-Allow-Methods: GET, POST, OPTIONS\r\n"));
	assert_non_null(strcasestr(w.out, "\r\nAccess-Control-Allow-Headers: content-type,authorization\r\n"));
	assert_non_null(strcasestr(w.out, "\r\nVary: Origin\r\n"));
	cors_talk(port, "OPTIONS /v1/chat/completions", "https://evil.example", "Access-Control-Request-Method: POST\r\n",
		  NULL, &w);
	assert_one_json_error(&w, "HTTP/1.1 403 ", "origin_not_allowed");
	assert_non_null(strstr(w.out, "cors_allow_origins"));
	assert_null(strcasestr(w.out, "Access-Control-Allow-Origin"));
	cors_talk(port, "OPTIONS /v1/models", NULL, "", NULL, &w);
	assert_one_json_error(&w, "HTTP/1.1 405 ", "method_not_allowed");
	/* answers: the allowed origin (any case) named back, others nothing */
	cors_talk(port, "GET /v1/models", "https://CHAT.example", "", NULL, &w);
	assert_true(!strncmp(w.out, "HTTP/1.1 200 ", 13));
	assert_non_null(strcasestr(w.out, "\r\nAccess-Control-Allow-Origin: https://CHAT.example\r\n"));
	cors_talk(port, "GET /v1/models", "https://chat.example.evil", "", NULL, &w);
	assert_true(!strncmp(w.out, "HTTP/1.1 200 ", 13));
	assert_null(strcasestr(w.out, "Access-Control-Allow-Origin"));
	/* a stream and an error answer are tagged too */
	cors_talk(port, "POST /v1/completions", "https://chat.example", "",
		  "{\"model\":\"tiny\",\"prompt\":\"ab\",\"max_tokens\":2,\"stream\":true}", &w);
	assert_true(!strncmp(w.out, "HTTP/1.1 200 ", 13));
	assert_non_null(strcasestr(w.out, "\r\nAccess-Control-Allow-Origin: https://chat.example\r\n"));
	assert_non_null(strstr(w.out, "data: [DONE]"));
	cors_talk(port, "POST /v1/completions", "https://chat.example", "", "{", &w);
	assert_one_json_error(&w, "HTTP/1.1 400 ", "invalid_json");
	assert_non_null(strcasestr(w.out, "\r\nAccess-Control-Allow-Origin: https://chat.example\r\n"));
	{
		struct ctrl_http *keep = g_http;

		g_http = h;
		wait_idle();
		g_http = keep;
	}
	ctrl_http_stop(h);
	/* "*": any origin */
	h = start_small(0, 30, 30, "*");
	cors_talk(ctrl_http_port(h), "GET /v1/models", "https://any.example", "", NULL, &w);
	assert_non_null(strcasestr(w.out, "\r\nAccess-Control-Allow-Origin: *\r\n"));
	assert_null(strcasestr(w.out, "Vary: Origin"));
	ctrl_http_stop(h);
	/* without the key: no header, OPTIONS is not a method */
	cors_talk(ctrl_http_port(g_http), "GET /v1/models", "https://any.example", "", NULL, &w);
	assert_true(!strncmp(w.out, "HTTP/1.1 200 ", 13));
	assert_null(strcasestr(w.out, "Access-Control-Allow-Origin"));
	cors_talk(ctrl_http_port(g_http), "OPTIONS /v1/models", "https://any.example", "Access-Control-Request-Method: GET\r\n",
		  NULL, &w);
	assert_one_json_error(&w, "HTTP/1.1 405 ", "method_not_allowed");
	/* a value that is no origin list refuses the start, naming the entry */
	ctrl_http_opts_init(&o);
	o.port = 0;
	o.model_name = "tiny";
	o.tok = g_tok;
	o.cors_origins = "https://chat.example, https://x.example/app";
	{
		struct ctrl_http_backend be = {fake_submit, fake_cancel, fake_stats, &g_fake, NULL,
					       fake_ready, &g_fake, fake_admissible, &g_fake, NULL, NULL, NULL, NULL};

		assert_null(ctrl_http_start(&o, &be, err, sizeof(err)));
	}
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(err, "'https://x.example/app' is not an origin"));
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_completion_comes_back_with_consistent_usage),
		cmocka_unit_test(a_chat_completion_answers_as_the_assistant),
		cmocka_unit_test(the_stop_token_ends_with_finish_reason_stop),
		cmocka_unit_test(a_stop_string_ends_the_output_and_is_not_included),
		cmocka_unit_test(a_stream_frames_sse_chunks_and_ends_with_done),
		cmocka_unit_test(a_streamed_stop_string_is_never_sent_even_in_part),
		cmocka_unit_test(bad_requests_get_openai_error_objects),
		cmocka_unit_test(a_prompt_longer_than_the_context_is_refused),
		cmocka_unit_test(an_oversized_body_gets_413),
		cmocka_unit_test(a_client_that_disconnects_cancels_its_request),
		cmocka_unit_test(draining_refuses_new_work_and_finishes_what_is_in_flight),
		cmocka_unit_test(backend_failures_and_a_full_queue_become_5xx),
		cmocka_unit_test(n_choices_answer_in_one_body_and_one_stream_and_end_together),
		cmocka_unit_test(models_tokenize_and_detokenize_agree),
		cmocka_unit_test(stats_metrics_and_dashboard_are_served),
		cmocka_unit_test(latency_histograms_count_what_was_served_and_polls_are_not_client_requests),
		cmocka_unit_test(health_answers_503_naming_what_is_down_while_livez_stays_200),
		cmocka_unit_test(a_request_the_kv_pool_could_never_hold_is_a_400_before_any_byte_is_streamed),
		cmocka_unit_test(response_ids_are_unique_even_for_seeded_requests_in_one_second),
		cmocka_unit_test(echo_starts_the_text_with_the_prompt_and_no_stop_string_cuts_the_prompt),
		cmocka_unit_test(echo_with_logprobs_reports_the_prompt_tokens_then_the_generated_ones),
		cmocka_unit_test(vllms_extensions_are_applied_or_refused_by_name),
		cmocka_unit_test(a_models_tool_calls_come_back_as_tool_calls_streamed_or_not),
		cmocka_unit_test(parameters_kvferry_lacks_are_refused_by_name_unless_at_their_default),
		cmocka_unit_test(a_model_is_retrieved_by_its_id_and_another_id_is_a_404),
		cmocka_unit_test(content_lengths_two_readers_could_frame_differently_are_refused_and_closed),
		cmocka_unit_test(malformed_lengths_and_huge_headers_or_urls_are_refused_and_closed),
		cmocka_unit_test(idle_stalled_and_trickling_connections_are_closed_in_time),
		cmocka_unit_test(connections_beyond_max_connections_get_a_503_json_and_are_closed),
		cmocka_unit_test(cors_answers_preflights_and_tags_answers_for_the_allowed_origins_only),
	};

	return http_fake_run(argc, argv, "ctrl_http", tests, sizeof(tests) / sizeof(tests[0]));
}
