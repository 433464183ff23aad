/* SPDX-License-Identifier: Apache-2.0 */
/*
 * PD bootstrap: the routes answer as SGLang's bootstrap server does (status
 * codes, field names, both selector spellings), and the decode side's reads
 * over loopback get the parallel info, a rank's address, /health, and the
 * clear refusals (not ready, unknown rank, node down, layout mismatch).
 */
#include <errno.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ctrl_pd_boot.h"

/* A query string as "k=v&k=v" (no decoding needed for these tests). */
static const char *q_lookup(void *arg, const char *key)
{
	static char val[64];
	const char *s = arg;
	size_t kl = strlen(key);

	while (s != NULL && *s) {
		const char *amp = strchr(s, '&');
		size_t n = amp ? (size_t)(amp - s) : strlen(s);

		if (n > kl && strncmp(s, key, kl) == 0 && s[kl] == '=') {
			snprintf(val, sizeof(val), "%.*s", (int)(n - kl - 1), s + kl + 1);
			return val;
		}
		s = amp ? amp + 1 : NULL;
	}
	return NULL;
}

static int handle(struct ctrl_pd_boot *b, const char *method, const char *path, const char *query,
		  const char *body, char *out, size_t outlen)
{
	struct ctrl_pd_reply r;

	assert_int_equal(ctrl_pd_boot_handle(b, method, path, q_lookup, (void *)query, body,
					     body ? strlen(body) : 0, &r), 0);
	assert_non_null(r.body);
	snprintf(out, outlen, "%s", r.body);
	free(r.body);
	return r.status;
}

static const char *put_body(int pp_rank, const char *ip, int port)
{
	static char b[512];

	snprintf(b, sizeof(b),
		 "{\"attn_tp_size\":1,\"attn_tp_rank\":0,\"attn_dp_size\":1,\"attn_dp_rank\":0,"
		 "\"pp_size\":2,\"pp_rank\":%d,\"system_dp_size\":1,\"system_dp_rank\":0,"
		 "\"rank_ip\":\"%s\",\"rank_port\":%d,\"page_size\":16,\"kv_cache_dtype\":\"bfloat16\","
		 "\"num_layers\":4,\"layer_start\":%d,\"layer_end\":%d,\"num_kv_heads\":2,\"head_dim\":16}",
		 pp_rank, ip, port, pp_rank * 2, pp_rank * 2 + 2);
	return b;
}

static const char *const INFO_Q = "prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1";

static void routes_answer_what_sglang_answers(void **state)
{
	struct ctrl_pd_boot *b = ctrl_pd_boot_create();
	char out[1024];
	json_t *j;

	(void)state;
	assert_non_null(b);
	assert_int_equal(handle(b, "GET", "/health", NULL, NULL, out, sizeof(out)), 200);
	assert_string_equal(out, "OK");
	/* nothing registered: the parallel info is not ready */
	assert_int_equal(handle(b, "GET", "/route", INFO_Q, NULL, out, sizeof(out)), 503);
	assert_non_null(strstr(out, "not fully registered"));
	/* a registration without a field, or not JSON, is refused by name */
	assert_int_equal(handle(b, "PUT", "/route", NULL, "{\"attn_tp_size\":1}", out, sizeof(out)), 400);
	assert_non_null(strstr(out, "attn_tp_rank"));
	assert_int_equal(handle(b, "PUT", "/route", NULL, "{nope", out, sizeof(out)), 400);
	assert_non_null(strstr(out, "not a JSON object"));
	/* one of two pipeline ranks: still 503, then both: the info */
	assert_int_equal(handle(b, "PUT", "/route", NULL, put_body(0, "10.0.0.1", 7000), out, sizeof(out)), 200);
	assert_int_equal(handle(b, "GET", "/route", INFO_Q, NULL, out, sizeof(out)), 503);
	assert_non_null(strstr(out, "1 of 2"));
	assert_int_equal(handle(b, "GET", "/route",
				"prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", NULL, out,
				sizeof(out)), 503);
	assert_int_equal(handle(b, "PUT", "/route", NULL, put_body(1, "10.0.0.2", 7001), out, sizeof(out)), 200);
	assert_int_equal(ctrl_pd_boot_ready(b), 1);
	assert_int_equal(handle(b, "GET", "/route", INFO_Q, NULL, out, sizeof(out)), 200);
	j = json_loads(out, 0, NULL);
	assert_non_null(j);
	/* both spellings of the sizes, the page layout */
	assert_int_equal(json_integer_value(json_object_get(j, "attn_tp_size")), 1);
	assert_int_equal(json_integer_value(json_object_get(j, "prefill_attn_tp_size")), 1);
	assert_int_equal(json_integer_value(json_object_get(j, "prefill_tp_size")), 1);
	assert_int_equal(json_integer_value(json_object_get(j, "dp_size")), 1);
	assert_int_equal(json_integer_value(json_object_get(j, "prefill_dp_size")), 1);
	assert_int_equal(json_integer_value(json_object_get(j, "pp_size")), 2);
	assert_int_equal(json_integer_value(json_object_get(j, "prefill_pp_size")), 2);
	assert_int_equal(json_integer_value(json_object_get(j, "page_size")), 16);
	assert_string_equal(json_string_value(json_object_get(j, "kv_cache_dtype")), "bfloat16");
	json_decref(j);
	/* a concrete rank: its address; the older selectors too */
	assert_int_equal(handle(b, "GET", "/route",
				"prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=1", NULL, out,
				sizeof(out)), 200);
	j = json_loads(out, 0, NULL);
	assert_string_equal(json_string_value(json_object_get(j, "rank_ip")), "10.0.0.2");
	assert_int_equal(json_integer_value(json_object_get(j, "rank_port")), 7001);
	json_decref(j);
	assert_int_equal(handle(b, "GET", "/route", "engine_rank=0&target_dp_group=0&target_pp_rank=0", NULL, out,
				sizeof(out)), 200);
	assert_non_null(strstr(out, "10.0.0.1"));
	assert_int_equal(handle(b, "GET", "/route", "engine_rank=-1&target_dp_group=-1", NULL, out, sizeof(out)),
			 200);
	assert_non_null(strstr(out, "prefill_dp_size"));
	/* unknown rank 404, missing or bad selector 400, other method 405, other route 404 */
	assert_int_equal(handle(b, "GET", "/route",
				"prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=3&target_pp_rank=0", NULL, out,
				sizeof(out)), 404);
	assert_int_equal(handle(b, "GET", "/route", "prefill_dp_rank=0&target_tp_rank=0&target_pp_rank=0", NULL,
				out, sizeof(out)), 400);
	assert_non_null(strstr(out, "prefill_cp_rank"));
	assert_int_equal(handle(b, "GET", "/route", "engine_rank=x&target_dp_group=0", NULL, out, sizeof(out)), 400);
	assert_int_equal(handle(b, "GET", "/route", NULL, NULL, out, sizeof(out)), 400);
	assert_int_equal(handle(b, "POST", "/route", NULL, "{}", out, sizeof(out)), 405);
	assert_int_equal(handle(b, "GET", "/routes", NULL, NULL, out, sizeof(out)), 404);
	ctrl_pd_boot_destroy(b);
}

static void a_rank_that_disagrees_is_refused_and_a_restarted_one_moves(void **state)
{
	struct ctrl_pd_boot *b = ctrl_pd_boot_create();
	struct ctrl_pd_boot_stats st;
	char out[1024], body[600];

	(void)state;
	assert_int_equal(handle(b, "PUT", "/route", NULL, put_body(0, "10.0.0.1", 7000), out, sizeof(out)), 200);
	/* the same position again with a new address: replaced, not counted twice */
	assert_int_equal(handle(b, "PUT", "/route", NULL, put_body(0, "10.0.0.9", 7009), out, sizeof(out)), 200);
	ctrl_pd_boot_stats(b, &st);
	assert_int_equal(st.registered, 1);
	assert_int_equal(st.expected, 2);
	/* another page size: refused, naming both values */
	snprintf(body, sizeof(body), "%s", put_body(1, "10.0.0.2", 7001));
	memcpy(strstr(body, "\"page_size\":16"), "\"page_size\":32", 14);
	assert_int_equal(handle(b, "PUT", "/route", NULL, body, out, sizeof(out)), 400);
	assert_non_null(strstr(out, "page_size 32 differs from the 16"));
	/* a rank outside its size */
	snprintf(body, sizeof(body), "%s", put_body(1, "10.0.0.2", 7001));
	memcpy(strstr(body, "\"pp_rank\":1"), "\"pp_rank\":5", 11);
	assert_int_equal(handle(b, "PUT", "/route", NULL, body, out, sizeof(out)), 400);
	assert_non_null(strstr(out, "outside its sizes"));
	ctrl_pd_boot_stats(b, &st);
	assert_int_equal(st.registered, 1);
	assert_int_equal((int)st.puts_refused, 2);
	assert_int_equal(handle(b, "PUT", "/route", NULL, put_body(1, "10.0.0.2", 7001), out, sizeof(out)), 200);
	assert_int_equal(handle(b, "GET", "/route",
				"prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", NULL, out,
				sizeof(out)), 200);
	assert_non_null(strstr(out, "10.0.0.9"));
	ctrl_pd_boot_destroy(b);
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void the_decode_side_reads_the_routes_over_loopback(void **state)
{
	struct ctrl_pd_boot *b = ctrl_pd_boot_create();
	struct ctrl_pd_info want = { 1, 1, 1, 1, 16, "bfloat16", 4, 2, 16, 3, 30000 }, got, local;
	struct ctrl_pd_rank r = { 0, 0, 0, 0, "10.1.2.3", 7100, 0, 4 }, gr;
	char err[512], addr[64];
	struct ctrl_pd_boot_server *s;
	double t0;

	(void)state;
	s = ctrl_pd_boot_serve(b, "127.0.0.1", 0, err, sizeof(err));
	assert_non_null(s);
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", ctrl_pd_boot_server_port(s));
	assert_int_equal(ctrl_pd_health(addr, 5, err, sizeof(err)), 0);
	assert_int_equal(ctrl_pd_fetch_info(addr, 5, &got, err, sizeof(err)), -EAGAIN);
	assert_non_null(strstr(err, "not every rank"));
	assert_int_equal(ctrl_pd_boot_register(b, &want, &r, err, sizeof(err)), 0);
	assert_int_equal(ctrl_pd_fetch_info(addr, 5, &got, err, sizeof(err)), 0);
	assert_int_equal(got.tp_size, 1);
	assert_int_equal(got.pp_size, 1);
	assert_int_equal(got.page_size, 16);
	assert_int_equal(got.n_layers, 4);
	assert_string_equal(got.kv_dtype, "bfloat16");
	/* kvferry's own: where a kvferry decode node finds the node's dataplane and API */
	assert_int_equal(got.dataplane_node, 3);
	assert_int_equal(got.api_port, 30000);
	assert_int_equal(ctrl_pd_fetch_rank(addr, 0, 0, 0, 0, 5, &gr, err, sizeof(err)), 0);
	assert_string_equal(gr.ip, "10.1.2.3");
	assert_int_equal(gr.port, 7100);
	assert_int_equal(gr.layer_end, 4);
	assert_int_equal(ctrl_pd_fetch_rank(addr, 0, 0, 1, 0, 5, &gr, err, sizeof(err)), -ENOENT);
	/* the contract: equal passes; each difference is named with both values */
	local = got;
	assert_int_equal(ctrl_pd_check_contract(&got, &local, addr, err, sizeof(err)), 0);
	local.page_size = 32;
	assert_int_equal(ctrl_pd_check_contract(&got, &local, addr, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "page_size=16"));
	assert_non_null(strstr(err, "page_size=32"));
	local = got;
	snprintf(local.kv_dtype, sizeof(local.kv_dtype), "float32");
	assert_int_equal(ctrl_pd_check_contract(&got, &local, addr, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "kv_cache_dtype=bfloat16"));
	assert_non_null(strstr(err, "kv_cache_dtype=float32"));
	local = got;
	local.n_layers = 8;
	assert_int_equal(ctrl_pd_check_contract(&got, &local, addr, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "num_layers"));
	/* the node goes away: unreachable, within the timeout */
	ctrl_pd_boot_server_stop(s);
	t0 = now_s();
	assert_int_equal(ctrl_pd_health(addr, 1, err, sizeof(err)), -EHOSTUNREACH);
	assert_int_equal(ctrl_pd_fetch_info(addr, 1, &got, err, sizeof(err)), -EHOSTUNREACH);
	assert_true(now_s() - t0 < 3.0);
	assert_non_null(strstr(err, "bootstrap_port"));
	ctrl_pd_boot_destroy(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(routes_answer_what_sglang_answers),
		cmocka_unit_test(a_rank_that_disagrees_is_refused_and_a_restarted_one_moves),
		cmocka_unit_test(the_decode_side_reads_the_routes_over_loopback),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
