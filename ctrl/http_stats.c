/* SPDX-License-Identifier: Apache-2.0 */
/*
 * /stats (JSON), the live dashboard page, and /metrics (Prometheus text).
 * One JSON object is the source of all three, so a counter the backend adds
 * shows up on the dashboard's raw view and in Prometheus with no code here.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrl_admin.h"
#include "http_int.h"
#include "kvf_config.h"

json_t *ctrl_http_stats_json(struct ctrl_http *h)
{
	json_t *http, *be = h->be.stats ? h->be.stats(h->be.ctx) : NULL;

	http = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i}",
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
			 "active", atomic_load(&h->active));
	return json_pack("{s:s, s:f, s:b, s:i, s:o, s:o}", "model", h->model, "uptime_s",
			 http_now() - h->t0, "draining", atomic_load(&h->draining), "max_context",
			 h->max_context, "http", http, "backend", be ? be : json_object());
}

/* ---- Prometheus text ---- */

static void metric_name(struct sbuf *b, const char *prefix, const char *key)
{
	sbuf_add(b, prefix, strlen(prefix));
	sbuf_add(b, "_", 1);
	for (const char *p = key; *p; p++) {
		char ch = isalnum((unsigned char)*p) ? *p : '_';
		sbuf_add(b, &ch, 1);
	}
}

/* A label name from an array's key: "stages" -> "stage". */
static void label_name(char *out, size_t cap, const char *key)
{
	size_t n = strlen(key);

	if (n > 1 && key[n - 1] == 's')
		n--;
	if (n >= cap)
		n = cap - 1;
	memcpy(out, key, n);
	out[n] = 0;
}

/* @p path: the field's place in /stats ("backend.replicas[].blocks_in_use"), for its HELP line */
static void emit(struct sbuf *out, struct sbuf *seen, const char *name, const char *path, const char *labels,
		 double v)
{
	char line[128];
	int counter = strlen(name) > 6 && !strcmp(name + strlen(name) - 6, "_total");
	char key[512];
	/* One TYPE line per metric name, before its first sample. */
	size_t nl = strlen(name) < sizeof(key) - 3 ? strlen(name) : sizeof(key) - 3;

	key[0] = '\n';
	memcpy(key + 1, name, nl);
	key[nl + 1] = '\n';
	key[nl + 2] = 0;
	if (!seen->p || !strstr(seen->p, key)) {
		sbuf_add(seen, key, strlen(key));
		sbuf_add(out, "# HELP ", 7);
		sbuf_add(out, name, strlen(name));
		sbuf_add(out, " /stats ", 8);
		sbuf_add(out, path, strlen(path));
		sbuf_add(out, " (ctrl/API.md)\n", 15);
		sbuf_add(out, "# TYPE ", 7);
		sbuf_add(out, name, strlen(name));
		sbuf_add(out, counter ? " counter\n" : " gauge\n", counter ? 9 : 7);
	}
	sbuf_add(out, name, strlen(name));
	if (labels[0]) {
		sbuf_add(out, "{", 1);
		sbuf_add(out, labels, strlen(labels));
		sbuf_add(out, "}", 1);
	}
	snprintf(line, sizeof(line), " %.17g\n", v);
	sbuf_add(out, line, strlen(line));
}

/* Samples are grouped by name as Prometheus expects: walk once per name. */
static void walk(const json_t *j, const char *prefix, const char *path, const char *labels, struct sbuf *out,
		 struct sbuf *seen)
{
	const char *key;
	json_t *v;

	json_object_foreach((json_t *)j, key, v) {
		struct sbuf name = {0};
		char here[256];

		snprintf(here, sizeof(here), "%s%s%s", path, path[0] ? "." : "", key);
		metric_name(&name, prefix, key);
		if (!name.p)
			continue; /* out of memory: leave the sample out */
		if (json_is_number(v))
			emit(out, seen, name.p, here, labels, json_number_value(v));
		else if (json_is_boolean(v))
			emit(out, seen, name.p, here, labels, json_is_true(v));
		else if (json_is_object(v))
			walk(v, name.p, here, labels, out, seen);
		else if (json_is_array(v)) {
			size_t i;
			json_t *e;
			char ln[64], lab[512];
			label_name(ln, sizeof(ln), key);
			json_array_foreach(v, i, e) {
				if (!json_is_object(e))
					continue;
				snprintf(lab, sizeof(lab), "%s%s%s=\"%zu\"", labels, labels[0] ? "," : "", ln, i);
				strncat(here, "[]", sizeof(here) - strlen(here) - 1);
				walk(e, name.p, here, lab, out, seen);
				here[strlen(here) - 2] = '\0';
			}
		}
		sbuf_free(&name);
	}
}

char *ctrl_http_prometheus(const json_t *stats)
{
	struct sbuf body = {0}, seen = {0}, sorted = {0};
	char *line, *save, *copy;
	struct sbuf *groups = NULL;
	size_t n_groups = 0;

	walk(stats, "kvferry", "", "", &body, &seen);
	if (!body.p) {
		sbuf_free(&seen);
		return strdup("");
	}
	/* Regroup: every sample of a name right after its HELP and TYPE lines. */
	copy = body.p;
	for (line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (!strncmp(line, "# TYPE ", 7) && n_groups > 0) {
			sbuf_add(&groups[n_groups - 1], line, strlen(line)); /* right after its HELP */
			sbuf_add(&groups[n_groups - 1], "\n", 1);
			continue;
		}
		if (!strncmp(line, "# HELP ", 7)) {
			struct sbuf *g = realloc(groups, (n_groups + 1) * sizeof(*g));
			if (!g)
				break;
			groups = g;
			memset(&groups[n_groups], 0, sizeof(groups[0]));
			sbuf_add(&groups[n_groups], line, strlen(line));
			sbuf_add(&groups[n_groups], "\n", 1);
			n_groups++;
			continue;
		}
		for (size_t i = 0; i < n_groups; i++) {
			const char *nm = groups[i].p + 7;
			size_t nl = strcspn(nm, " ");
			if (!strncmp(line, nm, nl) && (line[nl] == ' ' || line[nl] == '{')) {
				sbuf_add(&groups[i], line, strlen(line));
				sbuf_add(&groups[i], "\n", 1);
				break;
			}
		}
	}
	for (size_t i = 0; i < n_groups; i++) {
		sbuf_add(&sorted, groups[i].p, groups[i].len);
		sbuf_free(&groups[i]);
	}
	free(groups);
	{
		static const char bi[] = "# HELP kvferry_build_info the running kvferry version (always 1)\n"
					 "# TYPE kvferry_build_info gauge\n"
					 "kvferry_build_info{version=\"" KVF_VERSION "\"} 1\n";

		sbuf_add(&sorted, bi, sizeof(bi) - 1);
	}
	sbuf_free(&body);
	sbuf_free(&seen);
	return sorted.p ? sorted.p : strdup("");
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

/* The dashboard: a static page that polls /stats once a second. */
static const char g_dashboard[] =
	"<!doctype html><html><head><meta charset=\"utf-8\"><title>kvferry</title>\n"
	"<style>body{font:14px system-ui,sans-serif;margin:2em;color:#222}"
	"table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 10px;text-align:right}"
	"th{background:#f4f4f4}.bar{background:#e8e8e8;width:240px;height:14px;display:inline-block}"
	".bar>div{background:#3a7;height:14px}h2{font-size:16px;margin:1em 0 .2em}#err{color:#b00}</style></head>\n"
	"<body><h1>kvferry-ctrld</h1><div id=\"hdr\"></div><div id=\"err\"></div><div id=\"reps\"></div>\n"
	"<h2>HTTP</h2><table id=\"http\"></table>\n"
	"<script>\n"
	"function bar(f){f=Math.max(0,Math.min(1,f||0));return '<span class=\"bar\"><div style=\"width:'+(f*100).toFixed(1)+'%\"></div></span> '+(f*100).toFixed(1)+'%';}\n"
	"function num(v){return typeof v==='number'?(Number.isInteger(v)?v:v.toFixed(2)):v;}\n"
	"function kv(o){let s='';for(const k in o){if(typeof o[k]!=='object')s+='<tr><th>'+k+'</th><td>'+num(o[k])+'</td></tr>';}return s;}\n"
	"async function tick(){try{const r=await fetch('/stats');const s=await r.json();\n"
	" document.getElementById('err').textContent='';\n"
	" document.getElementById('hdr').innerHTML='model <b>'+s.model+'</b>, up '+s.uptime_s.toFixed(0)+' s'+(s.draining?' &mdash; <b>draining</b>':'');\n"
	" let h='';const reps=(s.backend&&s.backend.replicas)||[];\n"
	" reps.forEach((p,i)=>{h+='<h2>replica '+i+': '+p.n_stages+' stages, '+p.n_groups+' groups</h2>';\n"
	"  h+='<p>pipeline occupancy '+bar(p.occupancy)+' (ideal '+((p.ideal_occupancy||0)*100).toFixed(1)+'%), round trip '+num(p.mean_round_trip_us)+' &micro;s, live '+p.live+', queued '+p.queued+', KV blocks '+p.blocks_in_use+'/'+p.blocks_total+'</p>';\n"
	"  h+='<table><tr><th>stage</th><th>steps</th><th>columns</th><th>cols/step</th><th>mean step &micro;s</th><th>busy</th></tr>';\n"
	"  (p.stages||[]).forEach((st,j)=>{h+='<tr><td>'+j+'</td><td>'+st.steps_total+'</td><td>'+st.cols_total+'</td><td>'+(st.steps_total?(st.cols_total/st.steps_total).toFixed(1):'-')+'</td><td>'+num(st.mean_step_us)+'</td><td style=\"text-align:left\">'+bar(st.busy_frac)+'</td></tr>';});\n"
	"  h+='</table>';});\n"
	" document.getElementById('reps').innerHTML=h;document.getElementById('http').innerHTML=kv(s.http);\n"
	"}catch(e){document.getElementById('err').textContent='cannot fetch /stats: '+e;}}\n"
	"tick();setInterval(tick,1000);\n"
	"</script></body></html>\n";

enum MHD_Result http_stats(struct ctrl_http *h, struct MHD_Connection *c, int html)
{
	if (html)
		return http_text(h, c, MHD_HTTP_OK, "text/html; charset=utf-8", g_dashboard, sizeof(g_dashboard) - 1);
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
