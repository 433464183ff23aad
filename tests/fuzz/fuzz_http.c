/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: a request body of the OpenAI endpoints read as the
 * server reads it, with no connection: http_read_body(), then
 * http_read_gen() for /v1/completions, /v1/chat/completions and /generate (every
 * parameter's check, the chat template, the tokenizer, the context and
 * admission limits) or http_read_tokenize() / http_read_detokenize().
 *
 * Input: byte 0 picks the route (bits 0-1; bit 6 set: SGLang's /generate
 * whatever bits 0-1 say) and the tokenizer (bits 2-5: models/ferry's,
 * tests/kernels/data/tok_tiny's with its ChatML template, with the Llama 3
 * config, or with one of a template of tests/kernels/data/chat/); the rest
 * is the body.
 *
 * Beyond the sanitizers it checks what a client relies on: a refusal has an
 * HTTP error status, a type and a message; an accepted generation request
 * has a non-empty prompt of ids in the vocabulary that leaves room for
 * max_tokens (>= 1, or 0 only for a prompt alone: echo, or /generate's
 * max_new_tokens 0) within max_context, prompt logprobs only where asked
 * (echo with logprobs, or logprob_start_len inside the prompt), never with
 * bootstrap_room, at most 16 non-empty stop strings
 * and parameters in their documented ranges; a tokenize or detokenize
 * answer exists (a NULL from json_pack() would be sent as nothing).
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_int.h"

#define MAX_CONTEXT 1024
#define POOL 700 /* positions the fake KV pool holds (< MAX_CONTEXT): some requests fit only after a cut */

static struct ctrl_http g_h[16];
static int g_n;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The scheduler's admissible(): what a pool of POOL positions can carry. */
static int32_t admissible(void *ctx, int32_t n_prompt, int32_t max_tokens, char *err, size_t errlen)
{
	int32_t most = POOL - n_prompt;

	(void)ctx;
	if (most < max_tokens)
		snprintf(err, errlen, "the KV pool holds %d positions; the request needs %d + %d", POOL, n_prompt,
			 max_tokens);
	return most;
}

static int64_t submit_pd(void *ctx, const struct ctrl_request *r, const struct ctrl_http_pd *pd)
{
	(void)ctx;
	(void)r;
	(void)pd;
	return -1;
}

static void add(struct kn_tok *t, const char *what, const char *err)
{
	struct ctrl_http *h = &g_h[g_n];

	if (!t) {
		fprintf(stderr, "fuzz_http: %s: %s\n", what, err);
		exit(1);
	}
	h->tok = t;
	h->model = "kvferry-fuzz";
	h->max_context = MAX_CONTEXT;
	h->max_tokens_default = 256;
	h->be.admissible = admissible;
	h->be.submit_pd = submit_pd; /* a bootstrap_room then asks admissible() for one token */
	g_n++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *src = KVF_SOURCE_ROOT;
	char path[4096], tiny[4096], err[512];
	struct dirent **names;
	int n;

	(void)argc;
	(void)argv;
	snprintf(path, sizeof(path), "%s/models/ferry", src);
	add(kn_tok_open(path, err, sizeof(err)), path, err);
	snprintf(tiny, sizeof(tiny), "%s/tests/kernels/data/tok_tiny", src);
	add(kn_tok_open(tiny, err, sizeof(err)), tiny, err);
	snprintf(path, sizeof(path), "%s/tests/kernels/data/tok_tiny_llama3_config.json", src);
	snprintf(tiny + strlen(tiny), sizeof(tiny) - strlen(tiny), "/tokenizer.json");
	add(kn_tok_open_file(tiny, path, err, sizeof(err)), path, err);
	snprintf(path, sizeof(path), "%s/tests/kernels/data/chat", src);
	n = scandir(path, &names, NULL, alphasort);
	for (int i = 0; i < n; i++) {
		if (strstr(names[i]->d_name, ".jinja") && g_n < 16) {
			struct kn_tok *t = kn_tok_open_file(tiny, NULL, err, sizeof(err));
			char f[4096 + 256];

			snprintf(f, sizeof(f), "%s/%s", path, names[i]->d_name);
			if (t && kn_tok_load_chat_template(t, f, err, sizeof(err))) {
				kn_tok_close(t);
				t = NULL;
			}
			add(t, f, err);
		}
		free(names[i]);
	}
	free(names);
	return 0;
}

static void refused(const struct http_verr *e)
{
	if (e->status < 400 || e->status > 599 || !e->type || !e->msg[0])
		abort();
}

static void accepted(const struct ctrl_http *h, const struct http_gen_req *q)
{
	int32_t vocab = kn_tok_vocab_size(h->tok);
	size_t longest = 0;

	if (q->n_ids < 1 || (int64_t)q->n_ids >= h->max_context || q->max_tokens < 0 ||
	    (q->max_tokens == 0) != (q->no_tokens != 0) || (int64_t)q->n_ids + q->max_tokens > h->max_context)
		abort();
	if ((q->prompt_lp || q->no_tokens) && q->room >= 0)
		abort();
	if (q->prompt_lp && !(q->echo && q->lp_on) && !(q->lp_start >= 0 && q->lp_start < (int64_t)q->n_ids))
		abort();
	for (int i = 0; i < q->n_more; i++)
		if (q->more[i].max_tokens < 0 || (q->more[i].max_tokens == 0) != (q->no_tokens != 0))
			abort();
	for (size_t i = 0; i < q->n_ids; i++)
		if (q->ids[i] < 0 || q->ids[i] >= vocab)
			abort();
	if (q->n_stops < 0 || q->n_stops > 16)
		abort();
	for (int i = 0; i < q->n_stops; i++) {
		if (!q->stops[i][0])
			abort();
		if (strlen(q->stops[i]) > longest)
			longest = strlen(q->stops[i]);
	}
	if (longest != q->max_stop)
		abort();
	if (!(q->temperature >= 0 && q->temperature <= 2) || !(q->top_p > 0 && q->top_p <= 1) ||
	    q->top_k < -1 || q->lp_top < 0 || q->lp_top > HTTP_MAX_LOGPROBS || (!q->lp_on && q->lp_top))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ctrl_http *h;
	struct http_verr e;
	struct http_gen_req q;
	json_t *req, *reply = NULL;
	int route, rc;

	if (size < 1)
		return 0;
	route = data[0] & 3;
	h = &g_h[(data[0] >> 2) % g_n];
	req = http_read_body((const char *)data + 1, size - 1, &e);
	if (!req) {
		refused(&e);
		return 0;
	}
	switch (data[0] & 0x40 ? 0 : route) {
	case 0:
	case 1:
		rc = http_read_gen(h, data[0] & 0x40 ? GEN_NATIVE : route ? GEN_CHAT : GEN_COMPLETION, req, &q, &e);
		if (rc)
			refused(&e);
		else
			accepted(h, &q);
		if (!rc)
			http_gen_req_free(&q);
		break;
	case 2:
		rc = http_read_tokenize(h, req, &reply, &e);
		if (rc)
			refused(&e);
		else if (!reply)
			abort();
		break;
	default:
		rc = http_read_detokenize(h, req, &reply, &e);
		if (rc && rc != -ENOMEM)
			refused(&e);
		else if (!rc && !reply)
			abort();
		break;
	}
	json_decref(reply);
	json_decref(req);
	return 0;
}
