/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-ctrld's configuration: its table (config_table.c) over the
 * engine every daemon shares (shm/floor, kvf_cfg.h), and the two values
 * that need more than a key's type and range (stages, plans).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_int.h"
#include "ctrl_admin.h"
#include "ctrl_config.h"

_Static_assert(CTRL_CFG_STRLEN == CFG_STRLEN, "string values share the engine's length");
_Static_assert((int)CTRL_CFG_DEFAULT == (int)CFG_SRC_DEFAULT && (int)CTRL_CFG_FILE == (int)CFG_SRC_FILE
	       && (int)CTRL_CFG_ENV == (int)CFG_SRC_ENV && (int)CTRL_CFG_FLAG == (int)CFG_SRC_FLAG,
	       "the sources are the engine's");

struct ctrl_config {
	struct cfg *c;
};

const char *ctrl_config_source_name(enum ctrl_cfg_source s)
{
	return cfg_source_name((enum cfg_source)s);
}

struct ctrl_config *ctrl_config_new(void)
{
	struct ctrl_config *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->c = cfg_new(&g_cfg_table);
	if (!c->c) {
		free(c);
		return NULL;
	}
	return c;
}

void ctrl_config_free(struct ctrl_config *c)
{
	if (!c)
		return;
	cfg_free(c->c);
	free(c);
}

const struct ctrl_settings *ctrl_config_settings(const struct ctrl_config *c)
{
	return cfg_settings(c->c);
}

int ctrl_config_set(struct ctrl_config *c, const char *key, const char *value,
		    enum ctrl_cfg_source src, const char *origin, char *err, size_t errlen)
{
	return cfg_set(c->c, key, value, (enum cfg_source)src, origin, err, errlen);
}

int ctrl_config_load_file(struct ctrl_config *c, const char *path, int must_exist,
			  char *err, size_t errlen)
{
	return cfg_load_file(c->c, path, must_exist, err, errlen);
}

int ctrl_config_load_env(struct ctrl_config *c, char *const *envp, char *err, size_t errlen)
{
	return cfg_load_env(c->c, envp, err, errlen);
}

int ctrl_config_load_args(struct ctrl_config *c, int argc, char *const *argv,
			  const char *const *skip, const char *const *skip_bare,
			  char *err, size_t errlen)
{
	return cfg_load_args(c->c, argc, argv, skip, skip_bare, err, errlen);
}

int ctrl_config_plans(const char *plans, int32_t widths[8], int32_t *n, char *err, size_t errlen)
{
	const char *p = plans;

	*n = 0;
	if (strcmp(plans, "auto") == 0)
		return 0;
	while (*p) {
		char *end;
		long v;

		errno = 0;
		v = strtol(p, &end, 10);
		if (end == p || errno || v < 1 || v > 4096 || (*end && *end != ',')) {
			snprintf(err, errlen, "plans = \"%s\": \"%.*s\" is not a width in 1..4096; write up to 8 "
				 "ascending widths like 8,32,64,256, or auto", plans, (int)strcspn(p, ","), p);
			return -EINVAL;
		}
		if (*n == 8 || (*n > 0 && v <= widths[*n - 1])) {
			snprintf(err, errlen, "plans = \"%s\": %s; write up to 8 ascending widths like 8,32,64,256, "
				 "or auto", plans, *n == 8 ? "more than 8 widths" : "widths must ascend");
			*n = 0;
			return -EINVAL;
		}
		widths[(*n)++] = (int32_t)v;
		p = *end ? end + 1 : end;
	}
	if (*n == 0) {
		snprintf(err, errlen, "plans is empty: write up to 8 ascending widths like 8,32,64,256, or auto");
		return -EINVAL;
	}
	return 0;
}

int ctrl_config_stages(const char *stages, int32_t n_layers, int32_t ends[CTRL_CFG_MAX_STAGES],
		       int32_t *n_stages, char *err, size_t errlen)
{
	const char *p = stages;
	char *end;
	long v, prev = 0;
	int32_t n = 0;

	if (!strchr(stages, '-')) {
		errno = 0;
		v = strtol(stages, &end, 10);
		if (end == stages || *end || errno || v < 1 || v > CTRL_CFG_MAX_STAGES) {
			cfg_errf(err, errlen, "expected a stage count 1..%d or layer ranges like 0-8,8-16",
			    CTRL_CFG_MAX_STAGES);
			return -EINVAL;
		}
		if (n_layers > 0 && v > n_layers) {
			cfg_errf(err, errlen, "%ld stages but the model has only %d layers", v, n_layers);
			return -EINVAL;
		}
		for (long i = 0; i < v; i++)
			ends[i] = n_layers > 0 ? (int32_t)((i + 1) * n_layers / v) : 0;
		*n_stages = (int32_t)v;
		return 0;
	}
	for (;;) {
		long a, b;

		errno = 0;
		a = strtol(p, &end, 10);
		if (end == p || *end != '-' || errno)
			goto syntax;
		p = end + 1;
		b = strtol(p, &end, 10);
		if (end == p || (*end && *end != ',') || errno)
			goto syntax;
		if (a != prev) {
			cfg_errf(err, errlen, "range %ld-%ld does not start where the previous one ended (%ld): ranges must be contiguous from layer 0",
			    a, b, prev);
			return -EINVAL;
		}
		if (b <= a) {
			cfg_errf(err, errlen, "range %ld-%ld is empty: write start-end with end > start", a, b);
			return -EINVAL;
		}
		if (n == CTRL_CFG_MAX_STAGES) {
			cfg_errf(err, errlen, "more than %d stages", CTRL_CFG_MAX_STAGES);
			return -EINVAL;
		}
		ends[n++] = (int32_t)b;
		prev = b;
		if (!*end)
			break;
		p = end + 1;
	}
	if (n_layers > 0 && prev != n_layers) {
		cfg_errf(err, errlen, "ranges end at layer %ld but the model has %d layers: the last range must end at %d",
		    prev, n_layers, n_layers);
		return -EINVAL;
	}
	*n_stages = n;
	return 0;
syntax:
	cfg_errf(err, errlen, "cannot parse '%s': expected a stage count or ranges like 0-8,8-16", stages);
	return -EINVAL;
}

int ctrl_config_list_next(const char **p, const char **item, size_t *len)
{
	const char *s = *p;
	size_t n, k;

	if (s == NULL)
		return 0;
	while (*s == ' ')
		s++;
	n = k = strcspn(s, ",");
	while (k > 0 && s[k - 1] == ' ')
		k--;
	*item = s;
	*len = k;
	*p = s[n] ? s + n + 1 : NULL;
	return 1;
}

int ctrl_config_cors_check(const char *origins, char *err, size_t errlen)
{
	const char *p = origins ? origins : "", *o;
	size_t k;

	while (*p == ' ')
		p++;
	if (!*p || !strcmp(p, "*"))
		return 0;
	while (ctrl_config_list_next(&p, &o, &k)) {
		const char *host = !strncmp(o, "http://", 7) ? o + 7 : !strncmp(o, "https://", 8) ? o + 8 : NULL;

		if (!host || host >= o + k || memchr(host, '/', (size_t)(o + k - host)) ||
		    memchr(o, ' ', k) || memchr(o, '*', k)) {
			cfg_errf(err, errlen, "cors_allow_origins: '%.*s' is not an origin: write \"*\" alone for any, "
				 "or origins like https://chat.example.com or http://localhost:3000 (scheme, host, "
				 "port; no path) separated by commas", (int)k, o);
			return -EINVAL;
		}
	}
	return 0;
}

int ctrl_config_check(const struct ctrl_config *c, char *err, size_t errlen)
{
	const struct ctrl_settings *v = cfg_settings(c->c);

	if (v->spec && v->spec_c_half < v->spec_c_full) {
		const char *oh, *of;

		cfg_source(c->c, "spec_c_half", &oh);
		cfg_source(c->c, "spec_c_full", &of);
		cfg_errf(err, errlen, "spec_c_half (%lld, from %s) is below spec_c_full (%lld, from %s): full depth would outlast half depth",
		    (long long)v->spec_c_half, oh, (long long)v->spec_c_full, of);
		return -EINVAL;
	}
	if (ctrl_config_cors_check(v->cors_allow_origins, err, errlen))
		return -EINVAL;
	if (!v->admin_socket[0]) {
		cfg_errf(err, errlen, "admin_socket is empty: ctrlctl needs a socket path");
		return -EINVAL;
	}
	return 0;
}

json_t *ctrl_config_json(const struct ctrl_config *c)
{
	json_t *arr = json_array();
	char buf[CTRL_CFG_STRLEN + 32];

	if (!arr)
		return NULL;
	for (size_t i = 0; i < g_cfg_table.n_keys; i++) {
		const struct cfg_key *k = &g_cfg_table.keys[i];
		json_t *o;

		cfg_value_text(c->c, i, buf, sizeof(buf));
		o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "key", k->name, "section",
			      k->section, "value", buf, "source", cfg_source_name(cfg_source_at(c->c, i)),
			      "origin", cfg_origin_at(c->c, i), "default", k->def, "env", k->env, "help", k->help);
		if (!o || json_array_append_new(arr, o)) {
			json_decref(arr);
			return NULL;
		}
	}
	return arr;
}

int ctrl_config_print_defaults(FILE *f)
{
	return cfg_print_defaults(&g_cfg_table, f);
}

int ctrl_config_print_usage(FILE *f)
{
	return cfg_print_usage(&g_cfg_table, f);
}

static int cmd_config(void *arg, const char *cmd, json_t *params, json_t **data, char *err, size_t errlen)
{
	(void)cmd;
	(void)params;
	(void)err;
	(void)errlen;
	*data = ctrl_config_json(arg);
	return *data ? 0 : -ENOMEM;
}

int ctrl_config_admin_register(struct ctrl_admin *a, const struct ctrl_config *c)
{
	return ctrl_admin_register(a, "/ctrl/config", "effective configuration and where each value came from",
				   cmd_config, (void *)c);
}

int ctrl_config_source(const struct ctrl_config *c, const char *key, const char **origin)
{
	return cfg_source(c->c, key, origin);
}
