/* SPDX-License-Identifier: Apache-2.0 */
/*
 * SGLang's native routes (POST /generate, /health_generate, /flush_cache,
 * GET /get_model_info, /get_server_info) against the echoing fake backend
 * of http_fake.h: the answers have SGLang's shape (text, output_ids,
 * meta_info with its finish_reason objects), a stream's events each carry
 * the answer so far, logprobs come as [logprob, id, text] triples, and what
 * kvferry does not implement is refused by name.
 * argv[1]: a tokenizer directory (tests/kernels/data/tok_tiny).
 */
#include <math.h>

#include "http_fake.h"

static const char *fin_type(json_t *j)
{
	return json_string_value(json_object_get(json_object_get(json_object_get(j, "meta_info"), "finish_reason"), "type"));
}

static int meta_int(json_t *j, const char *k)
{
	return (int)json_integer_value(json_object_get(json_object_get(j, "meta_info"), k));
}

/* The same prompt through /v1/completions: the text the echo gives. */
static char *completion_text(const char *prompt, int n)
{
	json_t *j = post("/v1/completions", 200, "{\"model\":\"tiny\",\"prompt\":\"%s\",\"max_tokens\":%d}", prompt, n);
	char *t = strdup(json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")));

	json_decref(j);
	return t;
}

static void generate_answers_text_output_ids_and_meta_info_as_sglang_does(void **state)
{
	char *want = completion_text("hello world", 5);
	json_t *j, *ids, *t;
	const char *id;

	(void)state;
	fake_reset();
	t = post("/tokenize", 200, "{\"prompt\":\"hello world\"}");
	j = post("/generate", 200, "{\"text\":\"hello world\",\"sampling_params\":{\"max_new_tokens\":5,\"temperature\":0}}");
	assert_string_equal(json_string_value(json_object_get(j, "text")), want);
	ids = json_object_get(j, "output_ids");
	assert_int_equal(json_array_size(ids), 5);
	/* the echo: the prompt's own tokens come back */
	for (size_t i = 0; i < 5; i++)
		assert_int_equal(json_integer_value(json_array_get(ids, i)),
				 json_integer_value(json_array_get(json_object_get(t, "tokens"), i)));
	assert_string_equal(fin_type(j), "length");
	assert_int_equal(json_integer_value(json_object_get(json_object_get(json_object_get(j, "meta_info"),
									     "finish_reason"), "length")), 5);
	assert_int_equal(meta_int(j, "prompt_tokens"), json_integer_value(json_object_get(t, "count")));
	assert_int_equal(meta_int(j, "completion_tokens"), 5);
	assert_int_equal(meta_int(j, "cached_tokens"), 0);
	assert_true(json_is_real(json_object_get(json_object_get(j, "meta_info"), "e2e_latency")));
	id = json_string_value(json_object_get(json_object_get(j, "meta_info"), "id"));
	assert_non_null(id);
	assert_int_equal(strlen(id), 32);
	json_decref(j);
	/* input_ids, the client's rid, and SGLang's default of 128 new tokens */
	j = post("/generate", 200, "{\"input_ids\":[40,41,42],\"rid\":\"req-7\"}");
	assert_string_equal(json_string_value(json_object_get(json_object_get(j, "meta_info"), "id")), "req-7");
	assert_int_equal(meta_int(j, "completion_tokens"), 128);
	assert_int_equal(meta_int(j, "prompt_tokens"), 3);
	assert_int_equal(json_integer_value(json_array_get(json_object_get(j, "output_ids"), 4)), 41);
	json_decref(j);
	json_decref(t);
	free(want);
	wait_idle();
}

static void generate_says_which_stop_token_or_string_ended_it(void **state)
{
	json_t *j, *fr, *ids;

	(void)state;
	fake_reset();
	atomic_store(&g_fake.eos_after, 2);
	j = post("/generate", 200, "{\"text\":\"abcdef\",\"sampling_params\":{\"max_new_tokens\":50}}");
	fr = json_object_get(json_object_get(j, "meta_info"), "finish_reason");
	assert_string_equal(json_string_value(json_object_get(fr, "type")), "stop");
	assert_int_equal(json_integer_value(json_object_get(fr, "matched")), g_fake.eos);
	ids = json_object_get(j, "output_ids");
	assert_int_equal(json_array_size(ids), 3); /* two tokens, then the stop token */
	assert_int_equal(json_integer_value(json_array_get(ids, 2)), g_fake.eos);
	assert_int_equal(meta_int(j, "completion_tokens"), 3);
	json_decref(j);
	wait_idle();
	fake_reset();
	j = post("/generate", 200,
		 "{\"text\":\"one two END three four\",\"sampling_params\":{\"max_new_tokens\":400,\"stop\":[\"xyz\",\"END\"]}}");
	assert_string_equal(json_string_value(json_object_get(j, "text")), "one two ");
	fr = json_object_get(json_object_get(j, "meta_info"), "finish_reason");
	assert_string_equal(json_string_value(json_object_get(fr, "type")), "stop");
	assert_string_equal(json_string_value(json_object_get(fr, "matched")), "END");
	json_decref(j);
	wait_idle();
}

static void a_generate_stream_sends_the_answer_so_far_in_each_event_then_done(void **state)
{
	struct resp r;
	json_t *whole, *prev = NULL, *last = NULL;
	const char *p;
	int events = 0;

	(void)state;
	fake_reset();
	atomic_store(&g_fake.token_us, 3000); /* tokens in several events */
	whole = post("/generate", 200, "{\"text\":\"stream me please\",\"sampling_params\":{\"max_new_tokens\":12}}");
	assert_int_equal(request("POST", "/generate",
				 "{\"text\":\"stream me please\",\"stream\":true,\"sampling_params\":{\"max_new_tokens\":12}}",
				 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	for (p = r.body; *p;) {
		const char *end = strstr(p, "\n\n");
		char buf[4096];
		json_t *j;

		assert_non_null(end);
		assert_memory_equal(p, "data: ", 6);
		snprintf(buf, sizeof(buf), "%.*s", (int)(end - p - 6), p + 6);
		p = end + 2;
		if (!strcmp(buf, "[DONE]")) {
			assert_int_equal(*p, 0);
			break;
		}
		j = json_loads(buf, 0, NULL);
		assert_non_null(j);
		events++;
		if (prev != NULL) { /* each event extends the one before */
			const char *a = json_string_value(json_object_get(prev, "text"));

			assert_memory_equal(json_string_value(json_object_get(j, "text")), a, strlen(a));
			assert_true(json_array_size(json_object_get(j, "output_ids"))
				    >= json_array_size(json_object_get(prev, "output_ids")));
			assert_true(json_is_null(json_object_get(json_object_get(prev, "meta_info"), "finish_reason")));
		}
		json_decref(prev);
		prev = j;
	}
	last = prev;
	assert_true(events >= 2);
	assert_non_null(last);
	assert_string_equal(json_string_value(json_object_get(last, "text")), json_string_value(json_object_get(whole, "text")));
	assert_true(json_equal(json_object_get(last, "output_ids"), json_object_get(whole, "output_ids")));
	assert_string_equal(fin_type(last), "length");
	json_decref(last);
	json_decref(whole);
	resp_free(&r);
	wait_idle();
}

static void generate_logprobs_come_as_logprob_id_text_triples(void **state)
{
	json_t *j, *m, *out, *x;

	(void)state;
	fake_reset();
	j = post("/generate", 200, "{\"input_ids\":[40,41,42],\"return_logprob\":true,\"return_text_in_logprobs\":true,"
		 "\"sampling_params\":{\"max_new_tokens\":3}}");
	m = json_object_get(j, "meta_info");
	out = json_object_get(m, "output_token_logprobs");
	assert_int_equal(json_array_size(out), 3);
	x = json_array_get(out, 1);
	assert_true(json_is_real(json_array_get(x, 0)));
	assert_true(json_real_value(json_array_get(x, 0)) > -0.51 && json_real_value(json_array_get(x, 0)) < -0.49);
	assert_int_equal(json_integer_value(json_array_get(x, 1)), 41);
	assert_true(json_is_string(json_array_get(x, 2)));
	/* no logprob_start_len: no prompt logprobs, an empty list a router can join */
	assert_int_equal(json_array_size(json_object_get(m, "input_token_logprobs")), 0);
	json_decref(j);
	/* without return_text_in_logprobs the text is null; without return_logprob no arrays */
	j = post("/generate", 200, "{\"input_ids\":[40,41],\"return_logprob\":true,\"sampling_params\":{\"max_new_tokens\":2}}");
	assert_true(json_is_null(json_array_get(json_array_get(json_object_get(json_object_get(j, "meta_info"),
										      "output_token_logprobs"), 0), 2)));
	json_decref(j);
	j = post("/generate", 200, "{\"input_ids\":[40,41],\"sampling_params\":{\"max_new_tokens\":2}}");
	assert_null(json_object_get(json_object_get(j, "meta_info"), "output_token_logprobs"));
	json_decref(j);
	wait_idle();
}

/* logprob_start_len (SGLang's): the prompt's [logprob, id, text] from that
 * position on, the first with null as SGLang pads it, the alternatives
 * beside them; max_new_tokens 0 answers with the prompt's alone. */
static void generate_reports_the_prompts_logprobs_from_logprob_start_len(void **state)
{
	json_t *j, *m, *in, *tops;

	(void)state;
	fake_reset();
	j = post("/generate", 200, "{\"input_ids\":[40,41,42,43,44],\"return_logprob\":true,\"logprob_start_len\":2,"
		 "\"top_logprobs_num\":2,\"sampling_params\":{\"max_new_tokens\":2}}");
	m = json_object_get(j, "meta_info");
	in = json_object_get(m, "input_token_logprobs");
	tops = json_object_get(m, "input_top_logprobs");
	assert_int_equal(json_array_size(in), 3);
	assert_int_equal(json_array_size(tops), 3);
	assert_true(json_is_null(json_array_get(json_array_get(in, 0), 0)));
	assert_int_equal(json_integer_value(json_array_get(json_array_get(in, 0), 1)), 42);
	assert_true(json_is_null(json_array_get(tops, 0)));
	for (int p = 3; p < 5; p++) {
		json_t *x = json_array_get(in, (size_t)p - 2);

		assert_true(fabs(json_real_value(json_array_get(x, 0)) + p / 8.0) < 1e-6);
		assert_int_equal(json_integer_value(json_array_get(x, 1)), 40 + p);
		assert_int_equal(json_array_size(json_array_get(tops, (size_t)p - 2)), 2);
	}
	assert_int_equal(json_array_size(json_object_get(m, "output_token_logprobs")), 2);
	assert_int_equal(json_array_size(json_object_get(j, "output_ids")), 2);
	json_decref(j);
	j = post("/generate", 200, "{\"input_ids\":[40,41,42],\"return_logprob\":true,\"logprob_start_len\":0,"
		 "\"sampling_params\":{\"max_new_tokens\":0}}");
	m = json_object_get(j, "meta_info");
	assert_int_equal(json_array_size(json_object_get(m, "input_token_logprobs")), 3);
	assert_int_equal(json_array_size(json_object_get(m, "output_token_logprobs")), 0);
	assert_int_equal(meta_int(j, "completion_tokens"), 0);
	assert_string_equal(json_string_value(json_object_get(json_object_get(m, "finish_reason"), "type")), "length");
	json_decref(j);
	wait_idle();
}

/* sampling_params' stop_token_ids (the finish names the token), no_stop_trim
 * (the stop string stays) and skip_special_tokens, as SGLang's. */
static void generate_takes_stop_token_ids_no_stop_trim_and_skip_special_tokens(void **state)
{
	json_t *j, *f;

	(void)state;
	fake_reset();
	j = post("/generate", 200, "{\"input_ids\":[40,41,42,43],\"sampling_params\":{\"max_new_tokens\":9,"
		 "\"stop_token_ids\":[42]}}");
	f = json_object_get(json_object_get(j, "meta_info"), "finish_reason");
	assert_string_equal(json_string_value(json_object_get(f, "type")), "stop");
	assert_int_equal(json_integer_value(json_object_get(f, "matched")), 42);
	assert_int_equal(json_array_size(json_object_get(j, "output_ids")), 3); /* 40, 41 and the stop token */
	json_decref(j);
	j = post("/generate", 200, "{\"text\":\"aaa STOP bb\",\"sampling_params\":{\"max_new_tokens\":50,\"stop\":\"STOP\","
		 "\"no_stop_trim\":true,\"skip_special_tokens\":false}}");
	assert_non_null(strstr(json_string_value(json_object_get(j, "text")), "aaa STOP"));
	assert_null(strstr(json_string_value(json_object_get(j, "text")), "bb"));
	json_decref(j);
	wait_idle();
}

static void assert_refused(const char *param, const char *code, const char *body)
{
	struct resp r;

	assert_int_equal(request("POST", "/generate", body, 0, &r), CURLE_OK);
	if (r.status != 400 || !r.json)
		fprintf(stderr, "%s -> %ld %s\n", body, r.status, r.body ? r.body : "");
	assert_int_equal(r.status, 400);
	assert_non_null(r.json);
	assert_string_equal(json_string_value(json_object_get(json_object_get(r.json, "error"), "param")), param);
	assert_string_equal(json_string_value(json_object_get(json_object_get(r.json, "error"), "code")), code);
	resp_free(&r);
}

static void what_generate_cannot_do_is_refused_by_name(void **state)
{
	json_t *j;
	struct resp r;

	(void)state;
	fake_reset();
	assert_refused("text", "unsupported_value", "{\"text\":[\"a\",\"b\"]}");
	assert_refused("input_ids", "unsupported_value", "{\"input_ids\":[[1,2],[3]]}");
	assert_refused("input_ids", "invalid_value", "{\"text\":\"a\",\"input_ids\":[1]}");
	assert_refused("text", "missing_required_parameter", "{\"sampling_params\":{}}");
	assert_refused("frequency_penalty", "unsupported_parameter",
		       "{\"text\":\"a\",\"sampling_params\":{\"frequency_penalty\":0.5}}");
	assert_refused("stop_token_ids", "invalid_value", "{\"text\":\"a\",\"sampling_params\":{\"stop_token_ids\":[-5]}}");
	assert_refused("spaces_between_special_tokens", "unsupported_parameter",
		       "{\"text\":\"a\",\"sampling_params\":{\"spaces_between_special_tokens\":false}}");
	assert_refused("bogus", "unsupported_parameter", "{\"text\":\"a\",\"sampling_params\":{\"bogus\":1}}");
	assert_refused("logprob_start_len", "invalid_value", "{\"input_ids\":[5,6],\"return_logprob\":true,"
		       "\"logprob_start_len\":2}");
	assert_refused("logprob_start_len", "invalid_value", "{\"text\":\"a\",\"logprob_start_len\":-2}");
	assert_refused("logprob_start_len", "unsupported_value", "{\"input_ids\":[5,6],\"return_logprob\":true,"
		       "\"logprob_start_len\":0,\"bootstrap_room\":3}");
	assert_refused("max_new_tokens", "unsupported_value", "{\"input_ids\":[5,6],\"bootstrap_room\":3,"
		       "\"sampling_params\":{\"max_new_tokens\":0}}");
	assert_refused("image_data", "unsupported_parameter", "{\"text\":\"a\",\"image_data\":\"x.png\"}");
	assert_refused("max_new_tokens", "invalid_value", "{\"text\":\"a\",\"sampling_params\":{\"max_new_tokens\":-1}}");
	assert_refused("sampling_params", "invalid_type", "{\"text\":\"a\",\"sampling_params\":[1]}");
	assert_refused("input_ids", "invalid_value", "{\"input_ids\":[1,99999999]}");
	assert_int_equal(atomic_load(&g_fake.live), 0);
	/* the defaults ask for nothing: served */
	j = post("/generate", 200, "{\"text\":\"x\",\"logprob_start_len\":-1,\"image_data\":null,\"sampling_params\":"
		 "{\"max_new_tokens\":2,\"n\":1,\"frequency_penalty\":0,\"presence_penalty\":0.0,\"repetition_penalty\":1,"
		 "\"min_p\":0,\"stop_token_ids\":[],\"skip_special_tokens\":true,\"json_schema\":null,\"sampling_seed\":3}}");
	assert_int_equal(meta_int(j, "completion_tokens"), 2);
	json_decref(j);
	assert_int_equal(request("GET", "/generate", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 405);
	resp_free(&r);
	wait_idle();
}

static void the_routes_sglangs_router_and_tools_call_answer(void **state)
{
	struct resp r;
	json_t *j;

	(void)state;
	fake_reset();
	assert_int_equal(request("GET", "/get_model_info", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_true(json_is_true(json_object_get(r.json, "is_generation")));
	assert_string_equal(json_string_value(json_object_get(r.json, "model_path")), "tiny");
	resp_free(&r);
	assert_int_equal(request("GET", "/get_server_info", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_string_equal(json_string_value(json_object_get(r.json, "disaggregation_mode")), "null");
	assert_int_equal(json_integer_value(json_object_get(r.json, "context_length")), CTX);
	resp_free(&r);
	ctrl_http_set_bootstrap_port(g_http, 8998);
	assert_int_equal(request("GET", "/get_server_info", NULL, 0, &r), CURLE_OK);
	assert_int_equal(json_integer_value(json_object_get(r.json, "disaggregation_bootstrap_port")), 8998);
	resp_free(&r);
	/* a one-token generation through the backend; 503 naming what is down when it cannot serve */
	j = post("/health_generate", 200, "{}");
	assert_int_equal(meta_int(j, "completion_tokens"), 1);
	json_decref(j);
	assert_int_equal(request("GET", "/health_generate", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 200);
	resp_free(&r);
	atomic_store(&g_fake.down, 1);
	assert_int_equal(request("GET", "/health_generate", NULL, 0, &r), CURLE_OK);
	assert_int_equal(r.status, 503);
	assert_non_null(strstr(json_string_value(json_object_get(r.json, "reason")), "stage 1"));
	resp_free(&r);
	atomic_store(&g_fake.down, 0);
	j = post("/flush_cache", 200, "{}");
	assert_true(json_is_true(json_object_get(j, "flushed")));
	json_decref(j);
	/* draining: /generate refused like the OpenAI routes */
	ctrl_http_set_draining(g_http, 1);
	assert_int_equal(request("POST", "/generate", "{\"text\":\"x\"}", 0, &r), CURLE_OK);
	assert_int_equal(r.status, 503);
	resp_free(&r);
	ctrl_http_set_draining(g_http, 0);
	wait_idle();
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(generate_answers_text_output_ids_and_meta_info_as_sglang_does),
		cmocka_unit_test(generate_says_which_stop_token_or_string_ended_it),
		cmocka_unit_test(a_generate_stream_sends_the_answer_so_far_in_each_event_then_done),
		cmocka_unit_test(generate_logprobs_come_as_logprob_id_text_triples),
		cmocka_unit_test(generate_reports_the_prompts_logprobs_from_logprob_start_len),
		cmocka_unit_test(generate_takes_stop_token_ids_no_stop_trim_and_skip_special_tokens),
		cmocka_unit_test(what_generate_cannot_do_is_refused_by_name),
		cmocka_unit_test(the_routes_sglangs_router_and_tools_call_answer),
	};

	return http_fake_run(argc, argv, "ctrl_http_native", tests, sizeof(tests) / sizeof(tests[0]));
}
