/* SPDX-License-Identifier: Apache-2.0 */
/* Private to the HTTP layer: the server, a generation request, and the
 * helpers http.c, http_openai.c and http_stats.c share (the clock and the
 * replies live in http_reply.c, below all three; the byte buffer is the
 * floor's, kvf_buf.h). */
#ifndef CTRL_HTTP_INT_H
#define CTRL_HTTP_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <microhttpd.h>

#include "ctrl_http.h"
#include "kvf_buf.h"

/* Most top logprobs a request may ask for (OpenAI's limit, the chain's). */
#define HTTP_MAX_LOGPROBS CTRL_CHAIN_MAX_LOGPROBS

struct http_ev {
	double t;                    /* http_now() when the backend handed it over */
	uint64_t t_admitted_ns;      /* ctrl_event's: when the scheduler admitted the request */
	int32_t token;
	float logprob;
	int32_t n_generated;
	int32_t finish; /* enum ctrl_finish */
	int32_t prompt_pos;          /* > 0: prompt token prompt_pos scored (ctrl_event's) */
	int32_t cached;              /* ctrl_event's cached_tokens */
	int32_t n_top;
	int32_t top_ids[HTTP_MAX_LOGPROBS];
	float top_lps[HTTP_MAX_LOGPROBS];
};

/* One generated token's logprobs, and where its text starts in the output
 * (or a prompt token's, with echo and prompt logprobs). */
struct lp_ent {
	int32_t token;
	int32_t none;                /* a prompt token with no logprob (the first, or not yet scored) */
	float logprob;
	size_t off;                  /* bytes of output text before this token's */
	int32_t n_top;
	int32_t top_ids[HTTP_MAX_LOGPROBS];
	float top_lps[HTTP_MAX_LOGPROBS];
};

/* GEN_NATIVE: SGLang's native POST /generate (text or input_ids, sampling_params,
 * answers of text, output_ids and meta_info), what SGLang's router and tools send. */
enum gen_kind { GEN_COMPLETION, GEN_CHAT, GEN_NATIVE };

/*
 * Latency histograms (http_reply.c observes, http_stats.c renders). Each
 * bucket is one relaxed atomic counter, not cumulative; the sum is kept in
 * nanoseconds so it too is one fetch_add. Observing is a search over at most
 * HTTP_HIST_MAX bounds and two atomic adds, from any thread, with no lock; a
 * scrape reads the buckets one by one and derives the count from the same
 * reads, so _count always equals the +Inf bucket (the sum may lag by the
 * observations racing the scrape).
 */
enum http_hist_id {
	HTTP_HIST_TTFT,              /* arrival -> first token handed over by the backend */
	HTTP_HIST_ITL,               /* one token -> the next, per token after the first */
	HTTP_HIST_E2E,               /* arrival -> the answer complete */
	HTTP_HIST_QUEUE,             /* arrival -> admitted by the scheduler */
	HTTP_HIST_N
};

#define HTTP_HIST_MAX 24

struct http_hist_desc {
	const char *name;            /* the /stats latency key; kvferry_<name> in /metrics */
	const double *le;            /* upper bounds in seconds, ascending */
	int n_le;                    /* <= HTTP_HIST_MAX */
};

extern const struct http_hist_desc g_http_hist[HTTP_HIST_N];

struct http_hist {
	atomic_uint_fast64_t n[HTTP_HIST_MAX + 1]; /* [i]: le[i-1] < x <= le[i]; [n_le]: above all */
	atomic_uint_fast64_t sum_ns;
};

/* Count one observation of @p seconds (negative counts as 0) in @p h's
 * histogram @p id. Any thread, no lock. */
void http_hist_observe(struct ctrl_http *h, enum http_hist_id id, double seconds);

/*
 * One generation request. Fields above `mu`'s line are shared with the
 * backend thread and guarded by mu; the rest belong to whichever MHD thread
 * runs the connection (MHD never runs one connection on two threads).
 */
struct gen {
	pthread_mutex_t mu;
	atomic_int refs;             /* the connection's + the backend's */
	struct ctrl_http *h;
	struct MHD_Connection *conn;
	struct http_ev *q;           /* events not yet taken by the connection */
	size_t qn, qcap;
	char *backend_err;           /* CTRL_FINISH_ERROR's message */
	int backend_done;            /* the finish event arrived */
	int suspended;               /* the connection is suspended, waiting on q */
	int conn_gone;               /* MHD completed the connection */
	int cancel_sent;
	int32_t n_seen;              /* tokens delivered (for /requests) */
	/* ---- connection thread only ---- */
	uint64_t id;
	enum gen_kind kind;
	int stream, include_usage;
	char rid[48];
	int64_t created;
	double t_start;              /* arrival: the handler began with the whole body */
	double t_last;               /* the latest token's http_ev.t (inter-token latency) */
	int32_t n_cached;            /* prompt positions the prefix cache gave (usage's cached_tokens) */
	int queue_noted, e2e_noted;  /* queue time / end-to-end latency observed */
	int32_t n_prompt, n_gen, max_tokens;
	char **stops;
	int n_stops;
	size_t max_stop;
	struct kn_tok_stream *ds;
	struct kvf_buf text;            /* decoded output so far (truncated at a stop string) */
	size_t text_base;            /* echo: the prompt's text at its start (no stop string cuts it) */
	size_t emitted;              /* bytes of text already streamed */
	int done;                    /* the answer is complete (finish is set) */
	const char *finish;          /* "stop", "length", "abort" */
	int failed;                  /* the backend ended it with an error */
	char *fail_msg;              /* why (malloc'd), when failed */
	int lp_on;                   /* logprobs asked: completions' logprobs >= 0, chat's logprobs true
	                                (GEN_NATIVE: always, its output_ids come from the entries) */
	int32_t lp_top;              /* alternatives per token */
	int lp_report;               /* GEN_NATIVE: return_logprob */
	int lp_text;                 /* GEN_NATIVE: return_text_in_logprobs */
	int stop_hit;                /* the stop string that cut the text, -1: none */
	int keep_stop;               /* the stop string stays at the end of the text */
	int tool_parse;              /* its calls are read back as tool_calls: kn_tok_chat_tool_style() */
	int tools_sent;              /* streaming: the tool calls' chunk is out */
	int32_t stop_token;          /* the token that ended it (CTRL_FINISH_STOP), -1: none */
	struct lp_ent *lp;           /* one per generated token */
	size_t lp_n, lp_cap, lp_sent;
	/* prompt logprobs (completions' echo with logprobs, /generate's
	 * logprob_start_len): an entry per prompt position, offsets into the
	 * echoed text (0 without echo); the first has none */
	struct lp_ent *plp;          /* [n_prompt], NULL: not asked (or another choice's, below) */
	struct gen *plp_src;         /* n > 1: the prompt's first choice, which asked for the prompt's
	                                logprobs and whose entries this one reports too (they do not
	                                depend on the draw), or NULL */
	int32_t plp_start;           /* the first position reported (/generate's logprob_start_len) */
	int32_t plp_missing;         /* positions not yet scored */
	int plp_sent;                /* streamed (with the first chunk) */
	int cut;                     /* a stop string cut the text: tokens past it are not reported */
	struct kvf_buf out;             /* SSE bytes waiting to be read by MHD */
	size_t out_off;
	int role_sent, final_sent;   /* final_sent: the stream's end ([DONE]) is out */
	int fin_sent;                /* this choice's finish chunk (or error) is out */
	/* n > 1: one request object a choice, each its own backend request; the
	 * first (index 0, the lead) owns the connection and answers for all. A
	 * choice past the first holds a reference on the lead (its events wake
	 * the lead's connection); the lead holds their connection references
	 * until the connection closes. */
	int32_t index;               /* in choices[] */
	int32_t per_prompt;          /* the lead's: choices a prompt (n) */
	struct gen *lead;            /* NULL: this is the lead */
	struct gen **kids;           /* the lead's: choices 1..n_kids */
	int n_kids;
	struct gen *next, *prev;     /* h->gens, under h->mu */
};

struct ctrl_http {
	struct MHD_Daemon *d;
	struct ctrl_http_backend be;
	char *address, *model;
	char *model_path, *pd_mode;  /* /get_model_info, /get_server_info */
	char *cors;                  /* cors_allow_origins ("": none) */
	atomic_int bootstrap_port;
	int32_t pp_size;
	uint16_t port;
	int32_t threads, max_context, max_tokens_default;
	size_t body_limit;
	const struct kn_tok *tok;
	int32_t *stop_ids;
	int32_t n_stop;
	int64_t started;
	double t0;
	atomic_int draining, stopping, active;
	atomic_uint_fast64_t n_req, n_4xx, n_5xx, n_completions, n_chat, n_generate, n_streams,
		prompt_tokens, completion_tokens, client_cancels, tokenize_calls;
	atomic_uint_fast64_t n_monitor; /* GET /stats, /dashboard, /metrics, the probes: not in n_req */
	atomic_uint_fast64_t n_conn_refused; /* requests answered 503 beyond max_connections */
	atomic_uint_fast64_t n_slow_closed;  /* connections shut down by request_timeout */
	struct http_hist hist[HTTP_HIST_N];
	atomic_uint_fast64_t seq;    /* seeds of unseeded requests */
	atomic_uint_fast64_t ids;    /* response ids */
	uint64_t id_salt;            /* response ids: a bijection of (salt + seq), random per server */
	/* connections (http_conn.c) */
	int32_t max_connections;
	double request_timeout_s;
	atomic_int n_conns;          /* open now */
	pthread_mutex_t conn_mu;     /* conns */
	struct http_conn *conns;
	pthread_mutex_t mu;          /* gens list */
	struct gen *gens;
	pthread_t ticker;
	int ticker_started;
	pthread_mutex_t tick_mu;
	pthread_cond_t tick_cv;
};

/* Per-connection state (MHD's con_cls). */
struct conn_state {
	struct kvf_buf body;
	int too_big;
	int first_done;
	struct gen *gen;
};

double http_now(void);

/* The choice whose prompt entries @p g reports (itself, or its prompt's first choice). */
static inline const struct gen *plp_owner(const struct gen *g)
{
	return g->plp_src != NULL ? g->plp_src : g;
}

/* Queue an OpenAI-style error object. */
enum MHD_Result http_error(struct ctrl_http *h, struct MHD_Connection *c, unsigned status,
			   const char *type, const char *param, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));
/* http_error() and "Connection: close": nothing more is read from the
 * connection (its framing cannot be trusted, or it is to be shed). */
enum MHD_Result http_error_close(struct ctrl_http *h, struct MHD_Connection *c, unsigned status,
				 const char *type, const char *param, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));
/* Queue the error object of a refused request (struct http_verr, below). */
struct http_verr;
enum MHD_Result http_verr_send(struct ctrl_http *h, struct MHD_Connection *c, const struct http_verr *e);
/* Queue @j (stolen) as application/json. */
enum MHD_Result http_json(struct ctrl_http *h, struct MHD_Connection *c, unsigned status, json_t *j);
/* Queue a text body with a content type. */
enum MHD_Result http_text(struct ctrl_http *h, struct MHD_Connection *c, unsigned status,
			  const char *type, const char *body, size_t len);
/* CORS (cors_allow_origins): the Access-Control-Allow-Origin of an answer
 * to a request whose Origin is allowed (every answer passes here), and the
 * answer to a preflight (OPTIONS). */
void http_cors(struct ctrl_http *h, struct MHD_Connection *c, struct MHD_Response *r);
enum MHD_Result http_preflight(struct ctrl_http *h, struct MHD_Connection *c, const char *url);

/* An answer refused: what http_verr_send() (http_reply.c) tells the client. */
struct http_verr {
	unsigned status;
	const char *type, *param, *code;
	char msg[768];
};

/* What a completion or chat request asks for, read by http_read_gen(). */
struct http_gen_req {
	int stream, include_usage, ignore_eos;
	int echo;                    /* /v1/completions: the text starts with the prompt's */
	int lp_on;                   /* logprobs asked: completions' logprobs >= 0, chat's logprobs true */
	int32_t lp_top;              /* alternatives per token */
	int prompt_lp;               /* the prompt tokens' logprobs too (echo with logprobs;
	                                /generate's logprob_start_len >= 0) */
	int64_t lp_start;            /* /generate's logprob_start_len (-1: none) */
	int no_tokens;               /* max_tokens 0 was asked: the prompt alone (echo) */
	int tool_parse;              /* chat with tools and tool_choice "auto": the answer's calls
	                                are read back, in kn_tok_chat_tool_style()'s form (http_tools.c) */
	int32_t *stop_ids;           /* stop_token_ids (vLLM's, SGLang's) [n_stop_ids] (malloc'd) */
	int n_stop_ids;
	int skip_special;            /* skip_special_tokens (default 1): special tokens' text left out */
	int keep_stop;               /* include_stop_str_in_output / no_stop_trim: a stop string stays */
	int add_special;             /* /v1/completions' add_special_tokens (default 1: BOS) */
	int64_t truncate;            /* truncate_prompt_tokens: keep the prompt's last this many (0: all) */
	char **stops;                /* [n_stops] non-empty stop strings (malloc'd) */
	int n_stops;
	size_t max_stop;             /* the longest one's length */
	int32_t *ids;                /* the encoded prompt [n_ids] (malloc'd) */
	size_t n_ids;
	int64_t max_tokens;          /* asked, or what fits (0 only with no_tokens) */
	int64_t n;                   /* choices a prompt (1..HTTP_MAX_CHOICES) */
	/* /v1/completions with a list of prompts: the second and later ones
	 * (ids, n_ids and max_tokens above are the first's); each answered
	 * with n choices, prompt p's choice j at index p * n + j */
	struct http_prompt {
		int32_t *ids;
		size_t n_ids;
		int64_t max_tokens;
	} *more;
	int n_more;
	double temperature, top_p;
	int64_t top_k;
	uint64_t seed;
	int64_t room, bport;         /* bootstrap_room (-1: none), bootstrap_port */
	const char *bhost;           /* bootstrap_host, inside the request's JSON, or NULL */
	int64_t psession;            /* kvferry_session (a kvferry decode node's forward), 0 if absent */
	/* GEN_NATIVE */
	int lp_report, lp_text;      /* return_logprob, return_text_in_logprobs */
	const char *rid;             /* rid, inside the request's JSON, or NULL */
	const char *prompt_param;    /* "text" or "input_ids" (NULL: the endpoint's own) */
};

/* The most choices one request may ask for (prompts x n). */
#define HTTP_MAX_CHOICES 128

/* SGLang's default max_new_tokens (a /generate request that does not say). */
#define HTTP_NATIVE_MAX_NEW_TOKENS 128

/* Fill @p e: its type follows @p status (500s are server errors). @return -1. */
int http_verr_set(struct http_verr *e, unsigned status, const char *param, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* http_req.c: requests read and checked, no connection touched (see there).
 * Each returns 0, or -1 with @p e filled; any thread, nothing shared but
 * the server's seed counter (atomic). */
/* The body as a JSON object (JSON_REJECT_DUPLICATES), or NULL. */
json_t *http_read_body(const char *body, size_t len, struct http_verr *e);
/* A /v1/completions, /v1/chat/completions or /generate request, the prompt encoded and
 * checked against max_context and the backend's admissible(). On -1 @p q
 * holds nothing; on 0 free it with http_gen_req_free(). */
int http_read_gen(struct ctrl_http *h, enum gen_kind kind, json_t *req, struct http_gen_req *q,
		  struct http_verr *e);
void http_gen_req_free(struct http_gen_req *q);
/* Pieces of the readers, shared with http_native.c: an optional field of
 * @p req (1 absent or null, 0 read, -1 refused with @p e filled); a prompt
 * (a string, encoded, or an array of token ids) as field @p param; the stop
 * strings ("stop") and the bootstrap fields of @p req. */
int http_opt_int(json_t *req, const char *key, int64_t lo, int64_t hi, int64_t *out, struct http_verr *e);
int http_opt_num(json_t *req, const char *key, double lo, double hi, double *out, struct http_verr *e);
int http_opt_bool(json_t *req, const char *key, int *out, struct http_verr *e);
int http_prompt_ids(struct ctrl_http *h, json_t *p, const char *param, int add_special, int32_t **ids, size_t *n,
		    struct http_verr *e);
int http_read_stops(json_t *req, struct http_gen_req *q, struct http_verr *e);
/* http_tools.c: `tools` and `tool_choice` of a chat request (q->tool_parse). */
int http_read_tools(struct ctrl_http *h, json_t *req, struct http_gen_req *q, struct http_verr *e);
/* The most of the text up to @p upto that may stream as content (not past
 * a <tool_call>, nor a tail that may become one). */
size_t http_tool_hold(const struct gen *g, size_t upto);
/* The answer's tool calls (a new array) and where its content ends, or NULL
 * when it has none (or they do not parse: the answer is text). */
json_t *http_tool_calls(struct gen *g, size_t *content_end);
/* stop_token_ids of @p obj into q->stop_ids. */
int http_read_stop_ids(struct ctrl_http *h, json_t *obj, struct http_gen_req *q, struct http_verr *e);
int http_read_bootstrap(json_t *req, struct http_gen_req *q, struct http_verr *e);
/* A request with bootstrap_room (read) that asks for no tokens or for prompt
 * logprobs (@p mt, @p lp: their fields' names) is refused: 0 or -1. */
int http_pd_prompt_only(const struct http_gen_req *q, const char *mt, const char *lp, struct http_verr *e);
/* A parameter kvferry accepts only at its default (the value that asks
 * for nothing), refused at any other with 400 unsupported_parameter naming
 * it; a table of them is checked by http_check_fixed() (null and absent
 * always pass). */
enum http_neutral {
	HTTP_NEUTRAL_NULL,           /* only null */
	HTTP_NEUTRAL_ZERO,           /* 0 */
	HTTP_NEUTRAL_ONE,            /* 1 */
	HTTP_NEUTRAL_MINUS_ONE,      /* the integer -1 */
	HTTP_NEUTRAL_FALSE,          /* false */
	HTTP_NEUTRAL_TRUE,           /* true */
	HTTP_NEUTRAL_EMPTY,          /* "", [] or {} */
	HTTP_NEUTRAL_NONE_AUTO,      /* "none" or "auto" (no tools: nothing to call) */
	HTTP_NEUTRAL_TEXT_FORMAT,    /* {"type": "text"} */
	HTTP_NEUTRAL_TEXT_ONLY,      /* ["text"] */
};
struct http_fixed {
	const char *key;
	enum http_neutral ok;
	const char *want;            /* the accepted value, as the message says it */
};
/* @p where prefixes the field's name in the message ("sampling_params "). */
int http_check_fixed(json_t *obj, const struct http_fixed *t, size_t n, const char *where, struct http_verr *e);
/* http_native.c: a POST /generate request up to its encoded prompt (q's
 * seed is preset); the rest as http_read_gen(). */
int http_read_native(struct ctrl_http *h, json_t *req, struct http_gen_req *q, struct http_verr *e);
/* Its answer: the whole of it (@p final), or a streamed event's, with the
 * text up to @p upto and the tokens up to @p lp_upto. */
json_t *http_native_json(const struct gen *g, size_t upto, size_t lp_upto, int final);
/* SGLang's other routes: POST /generate, /health_generate, /flush_cache,
 * GET /get_model_info, /get_server_info. @return -1 when @p url is none of
 * them, else what MHD is told. */
int http_native_route(struct ctrl_http *h, struct MHD_Connection *c, struct conn_state *cs, const char *method,
		      const char *url);
/* The answers of /tokenize and /detokenize (*reply, a new reference);
 * -ENOMEM too for detokenize (no answer can be built: drop the connection). */
int http_read_tokenize(struct ctrl_http *h, json_t *req, json_t **reply, struct http_verr *e);
int http_read_detokenize(struct ctrl_http *h, json_t *req, json_t **reply, struct http_verr *e);

/* http_openai.c: the generation and token endpoints. */
enum MHD_Result http_generate(struct ctrl_http *h, struct MHD_Connection *c, struct conn_state *cs,
			      enum gen_kind kind, json_t *req);
enum MHD_Result http_generate_resume(struct ctrl_http *h, struct MHD_Connection *c, struct conn_state *cs);
enum MHD_Result http_tokenize(struct ctrl_http *h, struct MHD_Connection *c, json_t *req);
enum MHD_Result http_detokenize(struct ctrl_http *h, struct MHD_Connection *c, json_t *req);
void gen_unref(struct gen *g);
/* http_gen.c: the request's life (see there). */
void gen_on_event(void *arg, const struct ctrl_event *ev);
void gen_pump(struct gen *g);
/* gen_pump() on every choice of the lead @p g; 1 when each one is done. */
void gen_pump_all(struct gen *g);
int gen_all_done(const struct gen *g);
int gen_suspend(struct gen *g);
/* A request refused before its connection had it: cancel its first
 * @p n_submitted choices and drop the connection's references. */
void gen_abandon(struct gen *g, int n_submitted);
/* Cancel choice @p g's backend request unless it finished or was cancelled. */
void gen_cancel(struct gen *g);
int http_peer_closed(struct MHD_Connection *c);
/* http_body.c: MHD's reader of a streamed body. */
ssize_t gen_stream_read(void *cls, uint64_t pos, char *buf, size_t max);
void gen_connection_closed(struct gen *g);

/* http_conn.c: open connections, request_timeout, the limit (see there). */
struct http_conn;
/* MHD_OPTION_NOTIFY_CONNECTION (cls: the server). */
void http_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
		      enum MHD_ConnectionNotificationCode code);
/* The connection's request has fully arrived (its deadline no longer runs). */
void http_conn_arrived(struct ctrl_http *h, struct MHD_Connection *c);
/* Its answer ended: the next request's deadline starts now. */
void http_conn_answered(struct ctrl_http *h, struct MHD_Connection *c);
/* @return 1 while more than max_connections are open. */
int http_conn_over_limit(struct ctrl_http *h);
/* The ticker: shut down every connection whose request is late. */
void http_conn_sweep(struct ctrl_http *h);

/* http_stats.c */
enum MHD_Result http_stats(struct ctrl_http *h, struct MHD_Connection *c, int html);
enum MHD_Result http_metrics(struct ctrl_http *h, struct MHD_Connection *c);

#endif /* CTRL_HTTP_INT_H */
