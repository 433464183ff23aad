/* SPDX-License-Identifier: Apache-2.0 */
/*
 * /stats (JSON), the live dashboard page (http_dashboard.h), and /metrics
 * (Prometheus text). One JSON object is the source of all three, so a
 * counter the backend adds shows up on the dashboard's raw view and in
 * Prometheus with no code here; the latency histograms are in it too
 * ("latency"), as bounds and cumulative counts.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_admin.h"
#include "http_dashboard.h"
#include "http_int.h"
#include "kvf_config.h"

/* Histogram @p id as /stats has it: bounds, cumulative counts at each, count, sum. */
static json_t *hist_json(struct ctrl_http *h, enum http_hist_id id)
{
	const struct http_hist_desc *d = &g_http_hist[id];
	json_t *le = json_array(), *b = json_array();
	uint64_t cum = 0;

	for (int i = 0; i <= d->n_le; i++) {
		cum += atomic_load_explicit(&h->hist[id].n[i], memory_order_relaxed);
		if (i < d->n_le) {
			json_array_append_new(le, json_real(d->le[i]));
			json_array_append_new(b, json_integer((json_int_t)cum));
		}
	}
	return json_pack("{s:o, s:o, s:I, s:f}", "le", le, "buckets", b, "count", (json_int_t)cum, "sum",
			 (double)atomic_load_explicit(&h->hist[id].sum_ns, memory_order_relaxed) / 1e9);
}

json_t *ctrl_http_stats_json(struct ctrl_http *h)
{
	json_t *http, *lat, *be = h->be.stats ? h->be.stats(h->be.ctx) : NULL;

	http = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:I}",
			 "requests_total", (json_int_t)atomic_load(&h->n_req),
			 "client_errors_total", (json_int_t)atomic_load(&h->n_4xx),
			 "server_errors_total", (json_int_t)atomic_load(&h->n_5xx),
			 "completions_total", (json_int_t)atomic_load(&h->n_completions),
			 "chat_completions_total", (json_int_t)atomic_load(&h->n_chat),
			 "streams_total", (json_int_t)atomic_load(&h->n_streams),
			 "prompt_tokens_total", (json_int_t)atomic_load(&h->prompt_tokens),
			 "completion_tokens_total", (json_int_t)atomic_load(&h->completion_tokens),
			 "client_cancels_total", (json_int_t)atomic_load(&h->client_cancels),
			 "tokenize_total", (json_int_t)atomic_load(&h->tokenize_calls),
			 "active", atomic_load(&h->active),
			 "monitor_requests_total", (json_int_t)atomic_load(&h->n_monitor));
	json_object_set_new(http, "generate_total", json_integer((json_int_t)atomic_load(&h->n_generate)));
	json_object_update_new(http, json_pack("{s:i, s:I, s:I}", "connections", atomic_load(&h->n_conns),
					       "connections_refused_total", (json_int_t)atomic_load(&h->n_conn_refused),
					       "slow_requests_closed_total", (json_int_t)atomic_load(&h->n_slow_closed)));
	lat = json_object();
	for (int i = 0; i < HTTP_HIST_N; i++)
		json_object_set_new(lat, g_http_hist[i].name, hist_json(h, (enum http_hist_id)i));
	json_t *st = json_pack("{s:s, s:f, s:b, s:b, s:i, s:o, s:o, s:o}", "model", h->model, "uptime_s",
			       http_now() - h->t0, "draining", atomic_load(&h->draining), "ready",
			       ctrl_http_ready(h, NULL, 0), "max_context", h->max_context, "http", http, "latency", lat,
			       "backend", be ? be : json_object());
	json_t *dp = h->be.node_stats ? h->be.node_stats(h->be.node_ctx) : NULL;

	if (dp != NULL && (st == NULL || json_object_set_new(st, "dataplane", dp) < 0))
		json_decref(dp);
	return st;
}

/* ---- Prometheus text ---- */

/*
 * Names: kvferry_<path>, the path's keys joined by '_', lower case. Arrays of
 * objects become a label per element ("replicas" -> replica="0"). The type
 * follows the key: a counter ends in _total, anything else is a gauge. Units
 * are Prometheus's base units: a key in microseconds ("mean_step_us") becomes
 * _seconds with its value scaled, a fraction (_frac) a _ratio. An object of
 * the histogram's shape ({"le","buckets","count","sum"}) is a histogram. What
 * these rules would get wrong is in g_rules, matched by the field's path.
 * ctrl/API.md lists every renamed family.
 */
static const struct prom_rule {
	const char *path;            /* the field's place in /stats */
	const char *key;             /* the name's last part instead of the field's key, or NULL;
	                                "": an object whose fields are named as its parent's */
	const char *label;           /* an object of numbers: one family, its keys as this label's values */
	const char *help;            /* said in HELP before the field's path, or NULL */
	const char *name;            /* the family's whole name instead of the path's, or NULL */
} g_rules[] = {
	/* a pool's size is a gauge, and a gauge's name must not end in _total */
	{"backend.replicas[].blocks_total", "blocks_capacity", NULL, "KV blocks in the pool", NULL},
	{"backend.replicas[].blocks_cached", NULL, NULL,
	 "[sched] prefix_cache: idle KV blocks kept for later prompts (not in blocks_in_use: an "
	 "allocation takes them back first)", NULL},
	{"backend.replicas[].prefix_hit_tokens_total", NULL, NULL,
	 "prompt positions whose KV came from the prefix cache instead of being computed", NULL},
	{"backend.replicas[].prefill_shared_tokens_total", NULL, NULL,
	 "prompt positions of a request's second and later choices (n) read from its first choice's "
	 "KV instead of being computed", NULL},
	{"backend.replicas[].prefix_flushes_total", NULL, NULL,
	 "times the prefix cache was emptied because the stages may have lost KV", NULL},
	/* the latency histograms: kvferry_time_to_first_token_seconds, not
	 * kvferry_latency_time_to_first_token_seconds */
	{"latency", "", NULL, NULL, NULL},
	{"latency.time_to_first_token_seconds", NULL, NULL, "a request's arrival to its first token", NULL},
	{"latency.inter_token_latency_seconds", NULL, NULL, "one token to the next of a request", NULL},
	{"latency.e2e_request_latency_seconds", NULL, NULL, "a request's arrival to its complete answer", NULL},
	{"latency.request_queue_time_seconds", NULL, NULL, "a request's arrival to its admission (KV reserved)", NULL},
	{"http.generate_total", NULL, NULL, "POST /generate requests (SGLang's native API) admitted", NULL},
	{"http.monitor_requests_total", NULL, NULL, "GET /stats, /dashboard, /metrics, /health, /livez, /readyz (not in requests_total)", NULL},
	{"http.connections", NULL, NULL, "HTTP connections open", NULL},
	{"http.connections_refused_total", NULL, NULL, "requests answered 503 beyond max_connections", NULL},
	{"http.slow_requests_closed_total", NULL, NULL, "connections closed as their request took over request_timeout to arrive", NULL},
	{"ready", NULL, NULL, "1 when /readyz answers 200: not draining, and a replica with every stage up", NULL},
	/* every replica's replays, one family of its own at the top */
	{"backend.requests_replayed_total", NULL, NULL, "requests run again after a stage died under them",
	 "kvferry_requests_replayed_total"},
	{"backend.replaying", NULL, NULL, "requests waiting to run again (for their chain to re-form)", NULL},
	{"backend.requests_moved_total", NULL, NULL, "waiting requests (lost ones to run again, and new ones) "
	 "handed from a replica whose chain was down to one that serves", "kvferry_requests_moved_total"},
	/* rooms by state: the states (CamelCase) as a label, not a family each */
	{"backend.pd.rooms", NULL, "state", "PD rooms in flight by state", NULL},
	{"backend.pd.rooms_lost_dataplane_total", NULL, NULL, "rooms failed at once because their prefill node's "
	 "dataplane restarted or fell silent (their messages were lost with its session)", NULL},
	{"backend.pd.rooms_retried_total", NULL, NULL, "requests run again in a fresh room after a dataplane "
	 "restart lost theirs ([pd] room_retries)", NULL},
	{"backend.pd.requests_replayed_here_total", NULL, NULL, "disaggregated requests whose stages here went "
	 "down under them, run again here from their prompts (their rooms given up)", NULL},
	{"backend.pd.prefill_dataplane_silences_total", NULL, NULL, "times a prefill node's dataplane went silent "
	 "(its rooms in flight wait for it)", NULL},
	{"backend.pd.dataplane_deaths_total", NULL, NULL, "times this node's dataplane was seen dead by the PD service",
	 NULL},
	{"dataplane.peers[].up", NULL, NULL, "1 while the dataplane hears the peer (0: silent, down, never heard)", NULL},
	{"dataplane.peers[].rtt_us", NULL, NULL, "smoothed RTT of the busiest stream to the peer", NULL},
	{"dataplane.peers[].credit_msgs", NULL, NULL, "messages the peer still accepts (least over the streams)", NULL},
	{"dataplane.peers[].restarts_total", NULL, NULL, "new epochs of the peer seen (its dataplane restarted)", NULL},
	{"dataplane.peers[].retransmits_total", NULL, NULL, "frames sent to the peer again", NULL},
	{"dataplane.copies.payload_sent_bytes_total", NULL, NULL, "payload bytes the dataplane handed its driver "
	 "(first sends and resends)", NULL},
	{"dataplane.copies.payload_received_bytes_total", NULL, NULL, "payload bytes of frames the dataplane accepted",
	 NULL},
	{"dataplane.copies.copied_sending_bytes_total", NULL, NULL, "payload bytes the dataplane's own code copied "
	 "into frames (0 where frames point at the region)", NULL},
	{"dataplane.copies.copied_receiving_bytes_total", NULL, NULL, "payload bytes the dataplane's own code copied "
	 "out of frames (reassembly; 0 for messages received in place)", NULL},
	{"dataplane.copies.crc_read_bytes_total", NULL, NULL, "payload bytes read by a CRC pass of their own", NULL},
	{"dataplane.copies.crc_given_bytes_total", NULL, NULL, "payload bytes sent with their producer's CRCs, "
	 "computed where it wrote them (no pass of the dataplane's own)", NULL},
	{"dataplane.copies.driver_copies_sending", NULL, NULL, "copies of each payload byte the port's driver makes "
	 "sending (1: net_memif, net_af_packet; 0: a NIC's DMA)", NULL},
	{"dataplane.copies.driver_copies_receiving", NULL, NULL, "copies of each payload byte the port's driver makes "
	 "receiving (0 on a zero-copy memif client)", NULL},
	{"dataplane.copies.sending_per_byte", NULL, NULL, "CPU copies of each payload byte sent: the driver's and the "
	 "dataplane's", NULL},
	{"dataplane.copies.receiving_per_byte", NULL, NULL, "CPU copies of each payload byte received: the driver's "
	 "and the dataplane's (rx_in_place and a zero-copy memif client take them to 0)", NULL},
};

static const struct prom_unit {
	const char *suffix, *to;
	double scale;                /* field value * scale = the sample */
	const char *was;             /* for HELP, where the value is scaled */
} g_units[] = {
	{"_us", "_seconds", 1e-6, "microseconds"}, {"_ms", "_seconds", 1e-3, "milliseconds"},
	{"_ns", "_seconds", 1e-9, "nanoseconds"},  {"_s", "_seconds", 1.0, NULL},
	{"_frac", "_ratio", 1.0, NULL},
};

/* A field's family: its name, whether it counts, the unit it was renamed from. */
struct prom_name {
	char name[192];
	int counter;
	const struct prom_unit *unit; /* NULL: no unit suffix */
};

/* One metric family: its HELP and TYPE lines, then its samples. */
struct prom_fam {
	char *name;
	const char *type;            /* "counter", "gauge", "histogram" */
	char *help;
	struct kvf_buf samples;
};

struct prom {
	struct prom_fam *f;
	size_t n, cap;
	int oom;
};

static const struct prom_rule *rule_for(const char *path)
{
	for (size_t i = 0; i < sizeof(g_rules) / sizeof(g_rules[0]); i++)
		if (!strcmp(g_rules[i].path, path))
			return &g_rules[i];
	return NULL;
}

/* The first @p n bytes of @p key as a name: lower case, '_' for anything else than [a-z0-9]. */
static void snake(char *out, size_t cap, const char *key, size_t n)
{
	size_t j = 0;

	for (size_t i = 0; i < n && j + 1 < cap; i++)
		out[j++] = isalnum((unsigned char)key[i]) ? (char)tolower((unsigned char)key[i]) : '_';
	out[j] = 0;
}

static int ends_with(const char *s, size_t n, const char *suffix)
{
	size_t k = strlen(suffix);

	return n > k && !memcmp(s + n - k, suffix, k);
}

/* The family of field @p key under @p prefix. */
static void family_name(struct prom_name *pn, const char *prefix, const char *key)
{
	char k[128];
	size_t n = strlen(key), j;
	int counter = ends_with(key, n, "_total");

	pn->counter = counter;
	pn->unit = NULL;
	if (n >= sizeof(k))
		n = sizeof(k) - 1;
	memcpy(k, key, n);
	k[n] = 0;
	if (counter)
		k[n -= 6] = 0; /* the unit sits before _total */
	for (size_t i = 0; i < sizeof(g_units) / sizeof(g_units[0]); i++) {
		if (ends_with(k, n, g_units[i].suffix) &&
		    n - strlen(g_units[i].suffix) + strlen(g_units[i].to) < sizeof(k)) {
			n -= strlen(g_units[i].suffix);
			memcpy(k + n, g_units[i].to, strlen(g_units[i].to) + 1);
			n += strlen(g_units[i].to);
			pn->unit = &g_units[i];
			break;
		}
	}
	j = (size_t)snprintf(pn->name, sizeof(pn->name), "%s_", prefix);
	if (j < sizeof(pn->name))
		snake(pn->name + j, sizeof(pn->name) - j, k, n);
	if (counter)
		strncat(pn->name, "_total", sizeof(pn->name) - strlen(pn->name) - 1);
}

/* The family @p name, added with its HELP (from @p path, @p r, @p unit) if new. */
static struct prom_fam *fam_get(struct prom *p, const char *name, const char *type, const char *path,
				const struct prom_rule *r, const struct prom_unit *unit)
{
	char help[320], was[64] = "";
	struct prom_fam *f;

	for (size_t i = 0; i < p->n; i++)
		if (!strcmp(p->f[i].name, name))
			return &p->f[i];
	if (p->n == p->cap) {
		size_t cap = p->cap ? p->cap * 2 : 64;
		struct prom_fam *nf = realloc(p->f, cap * sizeof(*nf));

		if (!nf)
			goto oom;
		p->f = nf;
		p->cap = cap;
	}
	if (unit && unit->was)
		snprintf(was, sizeof(was), " in seconds (it is in %s)", unit->was);
	snprintf(help, sizeof(help), "%s%s/stats %s%s (ctrl/API.md)", r && r->help ? r->help : "",
		 r && r->help ? ": " : "", path, was);
	f = &p->f[p->n];
	memset(f, 0, sizeof(*f));
	f->name = strdup(name);
	f->help = strdup(help);
	f->type = type;
	if (!f->name || !f->help) {
		free(f->name);
		free(f->help);
		goto oom;
	}
	p->n++;
	return f;
oom:
	p->oom = 1;
	return NULL;
}

/* @p v in the fewest digits that read back as the same double ("0.0025", not
 * "0.0025000000000000001"; integers without an exponent up to 2^53). */
static void fmt_num(char *out, size_t cap, double v)
{
	for (int prec = 6; prec <= 17; prec++) {
		snprintf(out, cap, "%.*g", prec, v);
		if (strtod(out, NULL) == v)
			return;
	}
}

/* Append `name{labels[,extra]} value` to @p f. */
static void sample(struct prom *p, struct prom_fam *f, const char *name, const char *labels, const char *extra,
		   double v)
{
	char num[40];
	int rc = 0;

	if (!f)
		return;
	rc |= kvf_buf_str(&f->samples, name);
	if (labels[0] || (extra && extra[0])) {
		rc |= kvf_buf_add(&f->samples, "{", 1);
		rc |= kvf_buf_str(&f->samples, labels);
		if (labels[0] && extra && extra[0])
			rc |= kvf_buf_add(&f->samples, ",", 1);
		if (extra)
			rc |= kvf_buf_str(&f->samples, extra);
		rc |= kvf_buf_add(&f->samples, "}", 1);
	}
	fmt_num(num, sizeof(num), v);
	rc |= kvf_buf_add(&f->samples, " ", 1);
	rc |= kvf_buf_str(&f->samples, num);
	rc |= kvf_buf_add(&f->samples, "\n", 1);
	if (rc)
		p->oom = 1;
}

/* `name="value"` with the value escaped as the text format wants. */
static void label_pair(char *out, size_t cap, const char *name, const char *value)
{
	size_t j = (size_t)snprintf(out, cap, "%s=\"", name);

	for (const char *c = value; *c && j + 3 < cap; c++) {
		if (*c == '\\' || *c == '"' || *c == '\n') {
			out[j++] = '\\';
			out[j++] = *c == '\n' ? 'n' : *c;
		} else {
			out[j++] = *c;
		}
	}
	if (j + 1 < cap) {
		out[j++] = '"';
		out[j] = 0;
	} else {
		out[cap - 1] = 0;
	}
}

static int is_histogram(const json_t *v)
{
	const json_t *le = json_object_get(v, "le"), *b = json_object_get(v, "buckets");

	return json_is_array(le) && json_is_array(b) && json_array_size(le) == json_array_size(b) &&
	       json_is_number(json_object_get(v, "count")) && json_is_number(json_object_get(v, "sum"));
}

static void histogram(struct prom *p, const json_t *v, const char *name, const char *path, const char *labels)
{
	struct prom_fam *f = fam_get(p, name, "histogram", path, rule_for(path), NULL);
	char sname[192], le[48], lab[64];
	size_t i;
	json_t *e;

	snprintf(sname, sizeof(sname), "%s_bucket", name);
	json_array_foreach(json_object_get(v, "le"), i, e) {
		fmt_num(le, sizeof(le), json_number_value(e));
		label_pair(lab, sizeof(lab), "le", le);
		sample(p, f, sname, labels, lab,
		       json_number_value(json_array_get(json_object_get(v, "buckets"), i)));
	}
	sample(p, f, sname, labels, "le=\"+Inf\"", json_number_value(json_object_get(v, "count")));
	snprintf(sname, sizeof(sname), "%s_sum", name);
	sample(p, f, sname, labels, NULL, json_number_value(json_object_get(v, "sum")));
	snprintf(sname, sizeof(sname), "%s_count", name);
	sample(p, f, sname, labels, NULL, json_number_value(json_object_get(v, "count")));
}

/* Samples are grouped by family as Prometheus expects, in first-seen order. */
static void walk(struct prom *p, const json_t *j, const char *prefix, const char *path, const char *labels)
{
	const char *key;
	json_t *v;

	json_object_foreach((json_t *)j, key, v) {
		const struct prom_rule *r;
		struct prom_name pn;
		const char *type;
		double scale;
		char here[256];

		snprintf(here, sizeof(here), "%s%s%s", path, path[0] ? "." : "", key);
		r = rule_for(here);
		family_name(&pn, prefix, r && r->key ? r->key : key);
		if (r && r->name)
			snprintf(pn.name, sizeof(pn.name), "%s", r->name);
		type = pn.counter ? "counter" : "gauge";
		scale = pn.unit ? pn.unit->scale : 1.0;
		if (json_is_number(v) || json_is_boolean(v)) {
			double x = json_is_number(v) ? json_number_value(v) : json_is_true(v);

			sample(p, fam_get(p, pn.name, type, here, r, pn.unit), pn.name, labels, NULL, x * scale);
		} else if (json_is_object(v) && is_histogram(v)) {
			histogram(p, v, pn.name, here, labels);
		} else if (json_is_object(v) && r && r->label) {
			const char *k2;
			json_t *x;
			char lab[160];

			json_object_foreach(v, k2, x) {
				if (!json_is_number(x))
					continue;
				label_pair(lab, sizeof(lab), r->label, k2);
				sample(p, fam_get(p, pn.name, type, here, r, pn.unit), pn.name, labels, lab,
				       json_number_value(x) * scale);
			}
		} else if (json_is_object(v)) {
			walk(p, v, r && r->key && !r->key[0] ? prefix : pn.name, here, labels);
		} else if (json_is_array(v)) {
			size_t i, n = strlen(key);
			json_t *e;
			char ln[64], idx[24], lab[512];

			/* a label name from the array's key: "stages" -> "stage" */
			if (n > 1 && key[n - 1] == 's')
				n--;
			snake(ln, sizeof(ln), key, n);
			strncat(here, "[]", sizeof(here) - strlen(here) - 1);
			json_array_foreach(v, i, e) {
				json_t *node = json_object_get(e, "node");

				if (!json_is_object(e))
					continue;
				/* dataplane peers by their node id, not their place */
				if (!strcmp(here, "dataplane.peers[]") && json_is_integer(node))
					snprintf(idx, sizeof(idx), "%lld", (long long)json_integer_value(node));
				else
					snprintf(idx, sizeof(idx), "%zu", i);
				snprintf(lab, sizeof(lab), "%s%s", labels, labels[0] ? "," : "");
				label_pair(lab + strlen(lab), sizeof(lab) - strlen(lab), ln, idx);
				walk(p, e, pn.name, here, lab);
			}
		}
	}
}

char *ctrl_http_prometheus(const json_t *stats)
{
	static const char bi[] = "# HELP kvferry_build_info the running kvferry version (always 1)\n"
				 "# TYPE kvferry_build_info gauge\n"
				 "kvferry_build_info{version=\"" KVF_VERSION "\"} 1\n";
	struct prom p = {0};
	struct kvf_buf out = {0};
	int rc = 0;

	walk(&p, stats, "kvferry", "", "");
	for (size_t i = 0; i < p.n; i++) {
		struct prom_fam *f = &p.f[i];

		rc |= kvf_buf_add(&out, "# HELP ", 7);
		rc |= kvf_buf_str(&out, f->name);
		rc |= kvf_buf_add(&out, " ", 1);
		rc |= kvf_buf_str(&out, f->help);
		rc |= kvf_buf_add(&out, "\n# TYPE ", 8);
		rc |= kvf_buf_str(&out, f->name);
		rc |= kvf_buf_add(&out, " ", 1);
		rc |= kvf_buf_str(&out, f->type);
		rc |= kvf_buf_add(&out, "\n", 1);
		if (f->samples.p)
			rc |= kvf_buf_add(&out, f->samples.p, f->samples.len);
		kvf_buf_free(&f->samples);
		free(f->name);
		free(f->help);
	}
	free(p.f);
	rc |= kvf_buf_add(&out, bi, sizeof(bi) - 1);
	if (rc || p.oom) {
		kvf_buf_free(&out);
		errno = ENOMEM;
		return NULL;
	}
	return out.p;
}

enum MHD_Result http_metrics(struct ctrl_http *h, struct MHD_Connection *c)
{
	json_t *st = ctrl_http_stats_json(h);
	char *text = st ? ctrl_http_prometheus(st) : NULL;
	enum MHD_Result ret;

	json_decref(st);
	if (!text)
		return http_error(h, c, 500, "server_error", NULL, NULL, "out of memory rendering metrics");
	ret = http_text(h, c, MHD_HTTP_OK, "text/plain; version=0.0.4", text, strlen(text));
	free(text);
	return ret;
}

enum MHD_Result http_stats(struct ctrl_http *h, struct MHD_Connection *c, int html)
{
	if (html) {
		struct kvf_buf page = {0};
		enum MHD_Result ret;
		int rc = 0;

		for (size_t i = 0; i < sizeof(g_dashboard) / sizeof(g_dashboard[0]); i++)
			rc |= kvf_buf_str(&page, g_dashboard[i]);
		ret = rc ? http_error(h, c, 500, "server_error", NULL, NULL, "out of memory rendering the dashboard")
			 : http_text(h, c, MHD_HTTP_OK, "text/html; charset=utf-8", page.p, page.len);
		kvf_buf_free(&page);
		return ret;
	}
	return http_json(h, c, MHD_HTTP_OK, ctrl_http_stats_json(h));
}

static int cmd_requests(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	(void)cmd;
	(void)params;
	(void)err;
	(void)errlen;
	*data = ctrl_http_requests_json(arg);
	return *data ? 0 : -ENOMEM;
}

int ctrl_http_admin_register(struct ctrl_admin *a, struct ctrl_http *h)
{
	return ctrl_admin_register(a, "/http/requests", "requests in flight: id, endpoint, prompt tokens, generated, age",
				   cmd_requests, h);
}
