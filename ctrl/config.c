/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layered configuration over the table in config_table.c (modelled on the
 * Valkey config table: one typed entry per key, parsed and range-checked by
 * type, so no key needs its own parsing code).
 *
 * Every key holds its value in struct ctrl_settings plus the layer and the
 * origin text that set it. A set from a weaker layer than the current one is
 * ignored, which makes the result independent of the order layers are read.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_int.h"
#include "ctrl_config.h"

#define ORIGIN_LEN 320

struct ctrl_config {
	struct ctrl_settings v;
	enum ctrl_cfg_source src[64];
	char origin[64][ORIGIN_LEN];
};

static void fmt(char *err, size_t errlen, const char *f, ...)
	__attribute__((format(printf, 3, 4)));

static void fmt(char *err, size_t errlen, const char *f, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, f);
	vsnprintf(err, errlen, f, ap);
	va_end(ap);
}

static const struct cfg_key *find_key(const char *name, size_t *idx)
{
	for (size_t i = 0; i < g_cfg_n_keys; i++) {
		if (strcmp(g_cfg_keys[i].name, name) == 0) {
			if (idx)
				*idx = i;
			return &g_cfg_keys[i];
		}
	}
	return NULL;
}

const char *ctrl_config_source_name(enum ctrl_cfg_source s)
{
	switch (s) {
	case CTRL_CFG_DEFAULT: return "default";
	case CTRL_CFG_FILE: return "file";
	case CTRL_CFG_ENV: return "env";
	case CTRL_CFG_FLAG: return "flag";
	}
	return "?";
}

static int parse_bool(const char *s, int *out)
{
	static const char *const yes[] = {"yes", "true", "on", "1", NULL};
	static const char *const no[] = {"no", "false", "off", "0", NULL};

	for (int i = 0; yes[i]; i++)
		if (strcasecmp(s, yes[i]) == 0)
			return *out = 1, 0;
	for (int i = 0; no[i]; i++)
		if (strcasecmp(s, no[i]) == 0)
			return *out = 0, 0;
	return -EINVAL;
}

/* Decimal integer with an optional K/M/G/T (1024-based) suffix, optionally
 * followed by "B" or "iB". */
static int parse_int(const char *s, int suffixes, double *out)
{
	char *end;
	long long v;
	double mul = 1;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (end == s || errno)
		return errno == ERANGE ? -ERANGE : -EINVAL;
	if (*end && suffixes) {
		switch (toupper((unsigned char)*end)) {
		case 'K': mul = 1024.0; break;
		case 'M': mul = 1024.0 * 1024; break;
		case 'G': mul = 1024.0 * 1024 * 1024; break;
		case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
		case 'B': mul = 1; end--; break;
		default: return -EINVAL;
		}
		end++;
		if (toupper((unsigned char)*end) == 'I')
			end++;
		if (toupper((unsigned char)*end) == 'B')
			end++;
	}
	if (*end)
		return -EINVAL;
	*out = (double)v * mul;
	return 0;
}

static const char *type_hint(const struct cfg_key *k, char *buf, size_t len)
{
	switch (k->type) {
	case CFG_INT: return "an integer";
	case CFG_SIZE: return "a size in bytes (suffixes K, M, G, T)";
	case CFG_FLOAT: return "a number";
	case CFG_BOOL: return "yes or no";
	case CFG_ENUM: {
		size_t o = 0;
		buf[0] = 0;
		for (int i = 0; k->names[i]; i++)
			o += (size_t)snprintf(buf + o, o < len ? len - o : 0, "%s%s",
					      i ? (k->names[i + 1] ? ", " : " or ") : "one of ", k->names[i]);
		return buf;
	}
	case CFG_STRING: return "a string";
	}
	return "?";
}

static void range_text(const struct cfg_key *k, char *buf, size_t len)
{
	if (k->type == CFG_FLOAT)
		snprintf(buf, len, "%g..%g", k->min, k->max);
	else
		snprintf(buf, len, "%lld..%lld", (long long)k->min, (long long)k->max);
}

/* Parse @value for @k into @c's settings. */
static int store(struct ctrl_config *c, const struct cfg_key *k, const char *value,
		 const char *origin, char *err, size_t errlen)
{
	char *field = (char *)&c->v + k->offset;
	char hint[128], range[64];
	double d;
	int rc, b;

	switch (k->type) {
	case CFG_INT:
	case CFG_SIZE:
		rc = parse_int(value, k->type == CFG_SIZE, &d);
		if (rc == 0 && (d < k->min || d > k->max))
			rc = -ERANGE;
		if (rc == 0) {
			*(int64_t *)field = (int64_t)d;
			return 0;
		}
		break;
	case CFG_FLOAT: {
		char *end;
		errno = 0;
		d = strtod(value, &end);
		rc = (end == value || *end || errno || !isfinite(d)) ? -EINVAL : 0;
		if (rc == 0 && (d < k->min || d > k->max))
			rc = -ERANGE;
		if (rc == 0) {
			*(double *)field = d;
			return 0;
		}
		break;
	}
	case CFG_BOOL:
		rc = parse_bool(value, &b);
		if (rc == 0) {
			*(int *)field = b;
			return 0;
		}
		break;
	case CFG_ENUM:
		for (int i = 0; k->names[i]; i++) {
			if (strcasecmp(value, k->names[i]) == 0) {
				*(int64_t *)field = i;
				return 0;
			}
		}
		rc = -EINVAL;
		break;
	case CFG_STRING:
		if (strlen(value) >= CTRL_CFG_STRLEN) {
			fmt(err, errlen, "%s: value of '%s' is %zu bytes long; at most %d are accepted",
			    origin, k->name, strlen(value), CTRL_CFG_STRLEN - 1);
			return -ERANGE;
		}
		if (k->check) {
			char why[256];
			rc = k->check(value, why, sizeof(why));
			if (rc) {
				fmt(err, errlen, "%s: invalid value '%s' for '%s': %s", origin, value,
				    k->name, why);
				return rc;
			}
		}
		memcpy(field, value, strlen(value) + 1);
		return 0;
	}
	if (rc == -ERANGE) {
		range_text(k, range, sizeof(range));
		fmt(err, errlen, "%s: value '%s' for '%s' is out of range %s (%s)", origin, value,
		    k->name, range, k->help);
	} else {
		fmt(err, errlen, "%s: invalid value '%s' for '%s': expected %s", origin, value, k->name,
		    type_hint(k, hint, sizeof(hint)));
	}
	return rc;
}

struct ctrl_config *ctrl_config_new(void)
{
	struct ctrl_config *c = calloc(1, sizeof(*c));
	char err[256];

	if (!c)
		return NULL;
	_Static_assert(sizeof(c->src) / sizeof(c->src[0]) >= 32, "room for every key");
	for (size_t i = 0; i < g_cfg_n_keys; i++) {
		/* A default that fails its own check is a bug in the table. */
		if (store(c, &g_cfg_keys[i], g_cfg_keys[i].def, "default", err, sizeof(err))) {
			fprintf(stderr, "kvferry: config table: %s\n", err);
			free(c);
			errno = EINVAL;
			return NULL;
		}
		c->src[i] = CTRL_CFG_DEFAULT;
		snprintf(c->origin[i], ORIGIN_LEN, "default");
	}
	return c;
}

void ctrl_config_free(struct ctrl_config *c)
{
	free(c);
}

const struct ctrl_settings *ctrl_config_settings(const struct ctrl_config *c)
{
	return &c->v;
}

int ctrl_config_set(struct ctrl_config *c, const char *key, const char *value,
		    enum ctrl_cfg_source src, const char *origin, char *err, size_t errlen)
{
	size_t idx;
	const struct cfg_key *k = find_key(key, &idx);
	int rc;

	if (!k) {
		fmt(err, errlen, "%s: unknown key '%s' (kvferry-ctrld --help lists every key)", origin, key);
		return -ENOENT;
	}
	/* Validate even when a stronger layer wins, so that a broken file
	 * is reported whatever the flags say. */
	if (src < c->src[idx]) {
		struct ctrl_config tmp;
		memcpy(&tmp.v, &c->v, sizeof(tmp.v));
		return store(&tmp, k, value, origin, err, errlen);
	}
	rc = store(c, k, value, origin, err, errlen);
	if (rc)
		return rc;
	c->src[idx] = src;
	snprintf(c->origin[idx], ORIGIN_LEN, "%s", origin);
	return 0;
}

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = 0;
	return s;
}

static int known_section(const char *s)
{
	for (int i = 0; g_cfg_sections[i]; i++)
		if (strcmp(g_cfg_sections[i], s) == 0)
			return 1;
	return 0;
}

int ctrl_config_load_file(struct ctrl_config *c, const char *path, int must_exist,
			  char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char *line = NULL, *section = NULL;
	size_t cap = 0;
	ssize_t n;
	int lineno = 0, rc = 0;
	char origin[ORIGIN_LEN];

	if (!f) {
		if (errno == ENOENT && !must_exist)
			return 0;
		rc = errno == ENOENT ? -ENOENT : -EIO;
		fmt(err, errlen, "fopen(%s) failed: %s%s", path, strerror(errno),
		    errno == ENOENT ? " (kvferry-ctrld --print-config writes a commented one)" : "");
		return rc;
	}
	while ((n = getline(&line, &cap, f)) >= 0) {
		char *s, *eq, *key, *val;
		const struct cfg_key *k;

		lineno++;
		snprintf(origin, sizeof(origin), "%s:%d", path, lineno);
		s = trim(line);
		if (!*s || *s == '#' || *s == ';')
			continue;
		if (*s == '[') {
			char *end = strchr(s, ']');
			if (!end || trim(end + 1)[0]) {
				fmt(err, errlen, "%s: malformed section header '%s': expected [name]", origin, s);
				rc = -EINVAL;
				goto out;
			}
			*end = 0;
			free(section);
			section = strdup(trim(s + 1));
			if (!section) {
				rc = -ENOMEM;
				goto out;
			}
			if (!known_section(section)) {
				fmt(err, errlen, "%s: unknown section [%s] (sections: http, model, engine, sched, ctrl, dataplane)",
				    origin, section);
				rc = -EINVAL;
				goto out;
			}
			continue;
		}
		eq = strchr(s, '=');
		if (!eq) {
			fmt(err, errlen, "%s: expected 'key = value', found '%s'", origin, s);
			rc = -EINVAL;
			goto out;
		}
		*eq = 0;
		key = trim(s);
		val = trim(eq + 1);
		if (*val == '"') {
			size_t l = strlen(val);
			if (l < 2 || val[l - 1] != '"') {
				fmt(err, errlen, "%s: unterminated quoted value for '%s'", origin, key);
				rc = -EINVAL;
				goto out;
			}
			val[l - 1] = 0;
			val++;
		}
		k = find_key(key, NULL);
		if (k && section && strcmp(k->section, section) != 0) {
			fmt(err, errlen, "%s: key '%s' belongs in section [%s], not [%s]", origin, key,
			    k->section, section);
			rc = -EINVAL;
			goto out;
		}
		rc = ctrl_config_set(c, key, val, CTRL_CFG_FILE, origin, err, errlen);
		if (rc)
			goto out;
	}
	if (ferror(f)) {
		fmt(err, errlen, "read(%s) failed: %s", path, strerror(errno));
		rc = -EIO;
	}
out:
	free(section);
	free(line);
	fclose(f);
	return rc;
}

int ctrl_config_load_env(struct ctrl_config *c, char *const *envp, char *err, size_t errlen)
{
	for (; envp && *envp; envp++) {
		const char *e = *envp, *eq = strchr(e, '=');
		size_t nl;
		const struct cfg_key *k = NULL;
		int rc;

		if (!eq || strncmp(e, "KVFERRY_", 8) != 0)
			continue;
		nl = (size_t)(eq - e);
		for (size_t i = 0; i < g_cfg_n_keys; i++) {
			if (strlen(g_cfg_keys[i].env) == nl && strncmp(g_cfg_keys[i].env, e, nl) == 0) {
				k = &g_cfg_keys[i];
				break;
			}
		}
		if (!k) {
			if (nl == strlen("KVFERRY_CONFIG") && strncmp(e, "KVFERRY_CONFIG", nl) == 0)
				continue;
			fmt(err, errlen, "environment: unknown variable %.*s (kvferry-ctrld --help lists every KVFERRY_* variable)",
			    (int)nl, e);
			return -ENOENT;
		}
		rc = ctrl_config_set(c, k->name, eq + 1, CTRL_CFG_ENV, k->env, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

static int in_list(const char *const *list, const char *s, size_t len)
{
	for (; list && *list; list++)
		if (strlen(*list) == len && strncmp(*list, s, len) == 0)
			return 1;
	return 0;
}

int ctrl_config_load_args(struct ctrl_config *c, int argc, char *const *argv,
			  const char *const *skip, const char *const *skip_bare,
			  char *err, size_t errlen)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *eq = strchr(a, '='), *val = NULL;
		size_t nl = eq ? (size_t)(eq - a) : strlen(a);
		const struct cfg_key *k = NULL;
		int negated = 0, rc;

		if (in_list(skip_bare, a, nl))
			continue;
		if (in_list(skip, a, nl)) {
			if (!eq)
				i++;
			continue;
		}
		for (size_t j = 0; j < g_cfg_n_keys && !k; j++) {
			const char *f = g_cfg_keys[j].flag;
			if (strlen(f) == nl && strncmp(f, a, nl) == 0)
				k = &g_cfg_keys[j];
			else if (g_cfg_keys[j].type == CFG_BOOL && strncmp(a, "--no-", 5) == 0 &&
				 strlen(f) == nl - 3 && strncmp(f + 2, a + 5, nl - 5) == 0)
				k = &g_cfg_keys[j], negated = 1;
		}
		if (!k) {
			fmt(err, errlen, "unknown option '%.*s' (kvferry-ctrld --help lists every option)", (int)nl, a);
			return -ENOENT;
		}
		if (eq) {
			val = eq + 1;
		} else if (k->type == CFG_BOOL) {
			val = negated ? "no" : "yes";
		} else if (i + 1 < argc) {
			val = argv[++i];
		} else {
			fmt(err, errlen, "option %s needs a value: %s", k->flag, k->help);
			return -EINVAL;
		}
		if (negated && eq) {
			fmt(err, errlen, "option --no-%s takes no value", k->flag + 2);
			return -EINVAL;
		}
		rc = ctrl_config_set(c, k->name, val, CTRL_CFG_FLAG, k->flag, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
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
			fmt(err, errlen, "expected a stage count 1..%d or layer ranges like 0-8,8-16",
			    CTRL_CFG_MAX_STAGES);
			return -EINVAL;
		}
		if (n_layers > 0 && v > n_layers) {
			fmt(err, errlen, "%ld stages but the model has only %d layers", v, n_layers);
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
			fmt(err, errlen, "range %ld-%ld does not start where the previous one ended (%ld): ranges must be contiguous from layer 0",
			    a, b, prev);
			return -EINVAL;
		}
		if (b <= a) {
			fmt(err, errlen, "range %ld-%ld is empty: write start-end with end > start", a, b);
			return -EINVAL;
		}
		if (n == CTRL_CFG_MAX_STAGES) {
			fmt(err, errlen, "more than %d stages", CTRL_CFG_MAX_STAGES);
			return -EINVAL;
		}
		ends[n++] = (int32_t)b;
		prev = b;
		if (!*end)
			break;
		p = end + 1;
	}
	if (n_layers > 0 && prev != n_layers) {
		fmt(err, errlen, "ranges end at layer %ld but the model has %d layers: the last range must end at %d",
		    prev, n_layers, n_layers);
		return -EINVAL;
	}
	*n_stages = n;
	return 0;
syntax:
	fmt(err, errlen, "cannot parse '%s': expected a stage count or ranges like 0-8,8-16", stages);
	return -EINVAL;
}

int ctrl_config_check(const struct ctrl_config *c, char *err, size_t errlen)
{
	const struct ctrl_settings *v = &c->v;

	if (v->spec && v->spec_c_half < v->spec_c_full) {
		fmt(err, errlen, "spec_c_half (%lld, from %s) is below spec_c_full (%lld, from %s): full depth would outlast half depth",
		    (long long)v->spec_c_half, c->origin[find_key("spec_c_half", NULL) - g_cfg_keys],
		    (long long)v->spec_c_full, c->origin[find_key("spec_c_full", NULL) - g_cfg_keys]);
		return -EINVAL;
	}
	if (!v->admin_socket[0]) {
		fmt(err, errlen, "admin_socket is empty: ctrlctl needs a socket path");
		return -EINVAL;
	}
	return 0;
}

static void value_text(const struct ctrl_config *c, const struct cfg_key *k, char *buf, size_t len)
{
	const char *field = (const char *)&c->v + k->offset;

	switch (k->type) {
	case CFG_INT:
	case CFG_SIZE: snprintf(buf, len, "%lld", (long long)*(const int64_t *)field); break;
	case CFG_FLOAT: snprintf(buf, len, "%g", *(const double *)field); break;
	case CFG_BOOL: snprintf(buf, len, "%s", *(const int *)field ? "yes" : "no"); break;
	case CFG_ENUM: snprintf(buf, len, "%s", k->names[*(const int64_t *)field]); break;
	case CFG_STRING: snprintf(buf, len, "%s", field); break;
	}
}

json_t *ctrl_config_json(const struct ctrl_config *c)
{
	json_t *arr = json_array();
	char buf[CTRL_CFG_STRLEN + 32];

	if (!arr)
		return NULL;
	for (size_t i = 0; i < g_cfg_n_keys; i++) {
		const struct cfg_key *k = &g_cfg_keys[i];
		json_t *o;

		value_text(c, k, buf, sizeof(buf));
		o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "key", k->name, "section",
			      k->section, "value", buf, "source", ctrl_config_source_name(c->src[i]),
			      "origin", c->origin[i], "default", k->def, "env", k->env, "help", k->help);
		if (!o || json_array_append_new(arr, o)) {
			json_decref(arr);
			return NULL;
		}
	}
	return arr;
}

int ctrl_config_print_defaults(FILE *f)
{
	char range[64];

	fprintf(f, "# kvferry-ctrld configuration (INI).\n"
		   "# Every key below is commented out and shows its built-in default.\n"
		   "# Precedence: default < this file < KVFERRY_* environment < command-line flag.\n"
		   "# `ctrlctl config` shows the effective values and where each came from.\n");
	for (int s = 0; g_cfg_sections[s]; s++) {
		fprintf(f, "\n[%s]\n", g_cfg_sections[s]);
		for (size_t i = 0; i < g_cfg_n_keys; i++) {
			const struct cfg_key *k = &g_cfg_keys[i];
			if (strcmp(k->section, g_cfg_sections[s]) != 0)
				continue;
			fprintf(f, "\n# %s\n", k->help);
			if (k->type == CFG_INT || k->type == CFG_SIZE || k->type == CFG_FLOAT) {
				range_text(k, range, sizeof(range));
				fprintf(f, "# range %s%s; env %s; flag %s\n", range,
					k->type == CFG_SIZE ? " bytes (K, M, G suffixes)" : "", k->env, k->flag);
			} else {
				fprintf(f, "# env %s; flag %s\n", k->env, k->flag);
			}
			fprintf(f, "#%s = %s\n", k->name, k->def);
		}
	}
	return ferror(f) ? -EIO : 0;
}

int ctrl_config_print_usage(FILE *f)
{
	char hint[128];

	for (size_t i = 0; i < g_cfg_n_keys; i++) {
		const struct cfg_key *k = &g_cfg_keys[i];
		fprintf(f, "  %-24s %s\n  %-24s (%s; default '%s'; env %s)\n", k->flag, k->help, "",
			type_hint(k, hint, sizeof(hint)), k->def, k->env);
	}
	return ferror(f) ? -EIO : 0;
}

int ctrl_config_source(const struct ctrl_config *c, const char *key, const char **origin)
{
	size_t idx;

	if (!find_key(key, &idx))
		return -ENOENT;
	if (origin)
		*origin = c->origin[idx];
	return (int)c->src[idx];
}
