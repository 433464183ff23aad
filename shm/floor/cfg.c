/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The layered configuration engine (kvf_cfg.h), over any program's table
 * (modelled on the Valkey config table: one typed entry per key, parsed and
 * range-checked by type, so no key needs its own parsing code).
 *
 * Every key holds its value in the program's settings struct plus the layer
 * and the origin text that set it. A set from a weaker layer than the
 * current one is ignored, which makes the result independent of the order
 * layers are read. An instance's section ([worker.0]) is one more pass over
 * the file after the base sections, at the file's layer: it wins over
 * [worker] whichever comes first in the file. An instance named K-R (two
 * numbers: rank R of stage K, tensor parallelism) reads [worker.K] and then
 * its own [worker.K-R], if any: a stage's ranks share their stage's section.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvf_cfg.h"
#include "kvf_config.h"

#define ORIGIN_LEN 320

struct cfg {
	const struct cfg_table *t;
	void *v;                       /* [settings_size] */
	enum cfg_source *src;          /* [n_keys] */
	char (*origin)[ORIGIN_LEN];    /* [n_keys] */
	char instance[CFG_INSTANCE_MAX]; /* --instance NAME, or "" */
};

void cfg_errf(char *err, size_t errlen, const char *f, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, f);
	vsnprintf(err, errlen, f, ap);
	va_end(ap);
}

static const struct cfg_key *find_key(const struct cfg_table *t, const char *name, size_t *idx)
{
	for (size_t i = 0; i < t->n_keys; i++) {
		if (strcmp(t->keys[i].name, name) == 0) {
			if (idx)
				*idx = i;
			return &t->keys[i];
		}
	}
	return NULL;
}

const char *cfg_source_name(enum cfg_source s)
{
	switch (s) {
	case CFG_SRC_DEFAULT: return "default";
	case CFG_SRC_FILE: return "file";
	case CFG_SRC_ENV: return "env";
	case CFG_SRC_FLAG: return "flag";
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

/* Offset of the first byte of @p s that is not part of well-formed UTF-8
 * (no overlong forms, surrogates or code points past U+10FFFF), or -1. */
static long utf8_bad(const char *s)
{
	const unsigned char *p = (const unsigned char *)s, *b = p;

	while (*p) {
		unsigned char c = *p;
		int n = c < 0x80 ? 0 : c < 0xC2 ? -1 : c <= 0xDF ? 1 : c <= 0xEF ? 2 : c <= 0xF4 ? 3 : -1;
		unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
		unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;

		if (n < 0)
			return (long)(p - b);
		for (int k = 1; k <= n; k++, lo = 0x80, hi = 0xBF)
			if (p[k] < lo || p[k] > hi)
				return (long)(p - b);
		p += n + 1;
	}
	return -1;
}

/* Parse @value for @k into the settings at @v. */
static int store(void *v, const struct cfg_key *k, const char *value, const char *origin, char *err,
		 size_t errlen)
{
	char *field = (char *)v + k->offset;
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
		if (strlen(value) >= CFG_STRLEN) {
			cfg_errf(err, errlen, "%s: value of '%s' is %zu bytes long; at most %d are accepted",
			    origin, k->name, strlen(value), CFG_STRLEN - 1);
			return -ERANGE;
		}
		/* Values travel in JSON (ctrlctl config, /v1/models, every answer's
		 * "model"), which carries UTF-8 only: refused here by name rather
		 * than failing there as "out of memory" or an empty answer. */
		if (utf8_bad(value) >= 0) {
			cfg_errf(err, errlen, "%s: value of '%s' is not UTF-8 text (byte %ld); write it in UTF-8",
			    origin, k->name, utf8_bad(value) + 1);
			return -EINVAL;
		}
		if (k->check) {
			char why[256];
			rc = k->check(value, why, sizeof(why));
			if (rc) {
				cfg_errf(err, errlen, "%s: invalid value '%s' for '%s': %s", origin, value,
				    k->name, why);
				return rc;
			}
		}
		memcpy(field, value, strlen(value) + 1);
		return 0;
	}
	if (rc == -ERANGE) {
		range_text(k, range, sizeof(range));
		cfg_errf(err, errlen, "%s: value '%s' for '%s' is out of range %s (%s)", origin, value,
		    k->name, range, k->help);
	} else {
		cfg_errf(err, errlen, "%s: invalid value '%s' for '%s': expected %s", origin, value, k->name,
		    type_hint(k, hint, sizeof(hint)));
	}
	return rc;
}

struct cfg *cfg_new(const struct cfg_table *t)
{
	struct cfg *c = calloc(1, sizeof(*c));
	char err[256];

	if (c == NULL)
		return NULL;
	c->t = t;
	c->v = calloc(1, t->settings_size);
	c->src = calloc(t->n_keys, sizeof(*c->src));
	c->origin = calloc(t->n_keys, sizeof(*c->origin));
	if (c->v == NULL || c->src == NULL || c->origin == NULL) {
		cfg_free(c);
		errno = ENOMEM;
		return NULL;
	}
	for (size_t i = 0; i < t->n_keys; i++) {
		/* A default that fails its own check is a bug in the table. */
		if (t->keys[i].offset >= t->settings_size
		    || store(c->v, &t->keys[i], t->keys[i].def, "default", err, sizeof(err))) {
			fprintf(stderr, "%s: config table: %s\n", t->program,
				t->keys[i].offset >= t->settings_size ? "a key's offset lies outside the settings" : err);
			cfg_free(c);
			errno = EINVAL;
			return NULL;
		}
		c->src[i] = CFG_SRC_DEFAULT;
		snprintf(c->origin[i], ORIGIN_LEN, "default");
	}
	return c;
}

void cfg_free(struct cfg *c)
{
	if (c == NULL)
		return;
	free(c->v);
	free(c->src);
	free(c->origin);
	free(c);
}

const void *cfg_settings(const struct cfg *c)
{
	return c->v;
}

int cfg_set(struct cfg *c, const char *key, const char *value, enum cfg_source src, const char *origin,
	    char *err, size_t errlen)
{
	size_t idx;
	const struct cfg_key *k = find_key(c->t, key, &idx);
	int rc;

	if (!k) {
		cfg_errf(err, errlen, "%s: unknown key '%s' (%s --help lists every key)", origin, key, c->t->program);
		return -ENOENT;
	}
	/* Validate even when a stronger layer wins, so that a broken file
	 * is reported whatever the flags say. */
	if (src < c->src[idx]) {
		void *tmp = malloc(c->t->settings_size);

		if (tmp == NULL)
			return -ENOMEM;
		memcpy(tmp, c->v, c->t->settings_size);
		rc = store(tmp, k, value, origin, err, errlen);
		free(tmp);
		return rc;
	}
	rc = store(c->v, k, value, origin, err, errlen);
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

/* Is @p s one of @p list: a name, or a prefix ending in '.' ("worker.")? */
static int in_names(const char *const *list, const char *s)
{
	for (; list && *list; list++) {
		size_t l = strlen(*list);

		if ((*list)[l - 1] == '.' ? strncmp(*list, s, l) == 0 && s[l] : strcmp(*list, s) == 0)
			return 1;
	}
	return 0;
}

static int instance_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n >= CFG_INSTANCE_MAX)
		return 0;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-')
			return 0;
	return 1;
}

/* The instance NAME of section @p sec when it is [BASE.NAME] of a table with
 * instances (BASE: its first section), else NULL. */
static const char *instance_of(const struct cfg_table *t, const char *sec)
{
	size_t l = strlen(t->sections[0]);

	if (!t->instances || strncmp(sec, t->sections[0], l) != 0 || sec[l] != '.')
		return NULL;
	return sec + l + 1;
}

/* One pass over the file: @p instance NULL reads the table's sections and
 * skips every instance's; otherwise only [BASE.instance] is read. */
static int load_file(struct cfg *c, const char *path, int must_exist, const char *instance, char *err,
		     size_t errlen)
{
	const struct cfg_table *t = c->t;
	FILE *f = fopen(path, "r");
	char *line = NULL, *section = NULL;
	const char *inst;
	size_t cap = 0;
	ssize_t n;
	int lineno = 0, rc = 0, foreign = instance != NULL;
	char origin[ORIGIN_LEN];

	if (!f) {
		if (errno == ENOENT && !must_exist)
			return 0;
		rc = errno == ENOENT ? -ENOENT : -EIO;
		cfg_errf(err, errlen, "fopen(%s) failed: %s%s", path, strerror(errno),
		    errno == ENOENT ? " (--print-config writes a commented one)" : "");
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
				cfg_errf(err, errlen, "%s: malformed section header '%s': expected [name]", origin, s);
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
			inst = instance_of(t, section);
			if (inst != NULL && !instance_name_ok(inst)) {
				cfg_errf(err, errlen, "%s: malformed section header [%s]: an instance's section is "
				    "[%s.NAME], NAME of letters, digits, '_' and '-'", origin, section, t->sections[0]);
				rc = -EINVAL;
				goto out;
			}
			/* the base pass skips every instance, an instance's pass all but its own */
			if (instance != NULL)
				foreign = inst == NULL || strcmp(inst, instance) != 0;
			else
				foreign = inst != NULL || in_names(t->foreign_sections, section);
			if (!foreign && inst == NULL && !in_names(t->sections, section)) {
				char list[256];
				size_t o = 0;

				list[0] = 0;
				for (int i = 0; t->sections[i]; i++)
					o += (size_t)snprintf(list + o, o < sizeof(list) ? sizeof(list) - o : 0, "%s%s",
							      i ? ", " : "", t->sections[i]);
				cfg_errf(err, errlen, "%s: unknown section [%s] (%s reads %s)", origin, section, t->program,
				    list);
				rc = -EINVAL;
				goto out;
			}
			continue;
		}
		if (foreign)
			continue; /* another program's section */
		eq = strchr(s, '=');
		if (!eq) {
			cfg_errf(err, errlen, "%s: expected 'key = value', found '%s'", origin, s);
			rc = -EINVAL;
			goto out;
		}
		*eq = 0;
		key = trim(s);
		val = trim(eq + 1);
		if (*val == '"') {
			size_t l = strlen(val);
			if (l < 2 || val[l - 1] != '"') {
				cfg_errf(err, errlen, "%s: unterminated quoted value for '%s'", origin, key);
				rc = -EINVAL;
				goto out;
			}
			val[l - 1] = 0;
			val++;
		}
		k = find_key(t, key, NULL);
		if (k && section && strcmp(k->section, section) != 0
		    && (instance == NULL || strcmp(k->section, t->sections[0]) != 0)) {
			cfg_errf(err, errlen, "%s: key '%s' belongs in section [%s], not [%s]", origin, key,
			    k->section, section);
			rc = -EINVAL;
			goto out;
		}
		rc = cfg_set(c, key, val, CFG_SRC_FILE, origin, err, errlen);
		if (rc)
			goto out;
	}
	if (ferror(f)) {
		cfg_errf(err, errlen, "read(%s) failed: %s", path, strerror(errno));
		rc = -EIO;
	}
out:
	free(section);
	free(line);
	fclose(f);
	return rc;
}

int cfg_load_file(struct cfg *c, const char *path, int must_exist, char *err, size_t errlen)
{
	return load_file(c, path, must_exist, NULL, err, errlen);
}

int cfg_load_file_instance(struct cfg *c, const char *path, int must_exist, const char *instance, char *err,
			   size_t errlen)
{
	int rc;

	if (instance == NULL || !*instance)
		return load_file(c, path, must_exist, NULL, err, errlen);
	if (!c->t->instances) {
		cfg_errf(err, errlen, "%s has no instances (--instance %s)", c->t->program, instance);
		return -EINVAL;
	}
	if (!instance_name_ok(instance)) {
		cfg_errf(err, errlen, "invalid instance name '%s' (--instance): 1-%d letters, digits, '_' or '-'",
			 instance, CFG_INSTANCE_MAX - 1);
		return -EINVAL;
	}
	snprintf(c->instance, sizeof(c->instance), "%s", instance);
	rc = load_file(c, path, must_exist, NULL, err, errlen);
	if (rc == 0 && cfg_instance_rank(instance, NULL) >= 0) {
		/* K-R: its stage's section first, its own over it */
		char stage[CFG_INSTANCE_MAX];

		snprintf(stage, sizeof(stage), "%.*s", (int)(strchr(instance, '-') - instance), instance);
		rc = load_file(c, path, must_exist, stage, err, errlen);
	}
	return rc ? rc : load_file(c, path, must_exist, instance, err, errlen);
}

int cfg_instance_rank(const char *instance, int *stage)
{
	const char *d = instance != NULL ? strchr(instance, '-') : NULL;
	char *end;
	long k, r;

	if (d == NULL || d == instance || !isdigit((unsigned char)*instance) || !isdigit((unsigned char)d[1]))
		return -1;
	k = strtol(instance, &end, 10);
	if (end != d)
		return -1;
	r = strtol(d + 1, &end, 10);
	if (*end != 0 || k > 65535 || r > 65535)
		return -1;
	if (stage != NULL)
		*stage = (int)k;
	return (int)r;
}

const char *cfg_instance(const struct cfg *c)
{
	return c->instance[0] ? c->instance : NULL;
}

/* Is variable @p e (its name @p nl bytes long) one of @p list: a name, or a
 * prefix ending in '_'? */
static int env_listed(const char *const *list, const char *e, size_t nl)
{
	for (; list && *list; list++) {
		size_t l = strlen(*list);

		if ((*list)[l - 1] == '_' ? (nl >= l && strncmp(e, *list, l) == 0)
					  : (nl == l && strncmp(e, *list, l) == 0))
			return 1;
	}
	return 0;
}

int cfg_load_env(struct cfg *c, char *const *envp, char *err, size_t errlen)
{
	const struct cfg_table *t = c->t;
	const size_t pl = strlen(t->env_prefix);

	for (; envp && *envp; envp++) {
		const char *e = *envp, *eq = strchr(e, '=');
		size_t nl;
		const struct cfg_key *k = NULL;
		int rc;

		if (!eq || strncmp(e, t->env_prefix, pl) != 0)
			continue;
		nl = (size_t)(eq - e);
		if ((nl == strlen("KVFERRY_CONFIG") && strncmp(e, "KVFERRY_CONFIG", nl) == 0)
		    || env_listed(t->env_skip, e, nl))
			continue;
		for (size_t i = 0; i < t->n_keys; i++) {
			if (strlen(t->keys[i].env) == nl && strncmp(t->keys[i].env, e, nl) == 0) {
				k = &t->keys[i];
				break;
			}
		}
		if (!k) {
			cfg_errf(err, errlen, "environment: unknown variable %.*s (%s --help lists every %s* variable)",
			    (int)nl, e, t->program, t->env_prefix);
			return -ENOENT;
		}
		rc = cfg_set(c, k->name, eq + 1, CFG_SRC_ENV, k->env, err, errlen);
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

int cfg_load_args(struct cfg *c, int argc, char *const *argv, const char *const *skip,
		  const char *const *skip_bare, char *err, size_t errlen)
{
	const struct cfg_table *t = c->t;

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
		for (size_t j = 0; j < t->n_keys && !k; j++) {
			const char *f = t->keys[j].flag;
			if (strlen(f) == nl && strncmp(f, a, nl) == 0)
				k = &t->keys[j];
			else if (t->keys[j].type == CFG_BOOL && strncmp(a, "--no-", 5) == 0 &&
				 strlen(f) == nl - 3 && strncmp(f + 2, a + 5, nl - 5) == 0)
				k = &t->keys[j], negated = 1;
		}
		if (!k) {
			cfg_errf(err, errlen, "unknown option '%.*s' (%s --help lists every option)", (int)nl, a, t->program);
			return -ENOENT;
		}
		if (eq) {
			val = eq + 1;
		} else if (k->type == CFG_BOOL) {
			val = negated ? "no" : "yes";
		} else if (i + 1 < argc) {
			val = argv[++i];
		} else {
			cfg_errf(err, errlen, "option %s needs a value: %s", k->flag, k->help);
			return -EINVAL;
		}
		if (negated && eq) {
			cfg_errf(err, errlen, "option --no-%s takes no value", k->flag + 2);
			return -EINVAL;
		}
		rc = cfg_set(c, k->name, val, CFG_SRC_FLAG, k->flag, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

extern char **environ;

int cfg_load_daemon(const struct cfg_table *t, const char *usage, int argc, char *const *argv,
		    const char *const *skip, struct cfg **out, char *err, size_t errlen)
{
	static const char *const bare[] = { "--help", "-h", "--print-config", "--check", "--version", NULL };
	const char *all_skip[9] = { "--config" }, *path = getenv("KVFERRY_CONFIG"), *instance = NULL;
	int must = path != NULL && *path, check = 0, rc;
	size_t ns = 1;
	struct cfg *c;

	*out = NULL;
	if (t->instances)
		all_skip[ns++] = "--instance";
	for (; skip != NULL && *skip != NULL && ns < 8; skip++)
		all_skip[ns++] = *skip;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("%s\nConfiguration: /etc/kvferry/kvferry.conf [%s], then %s* variables, then these "
			       "options:\n"
			       "  --config PATH            the configuration file (or KVFERRY_CONFIG)\n"
			       "  --print-config           write a commented [%s] section with every default\n"
			       "  --check                  check the configuration and exit\n"
			       "  --version                print the version and exit\n",
			       usage, t->sections[0], t->env_prefix, t->sections[0]);
			if (t->instances)
				printf("  --instance NAME          also read [%s.NAME], over [%s] (%s@NAME.service)\n",
				       t->sections[0], t->sections[0], t->program);
			cfg_print_usage(t, stdout);
			return 1;
		}
		if (!strcmp(argv[i], "--print-config")) {
			cfg_print_defaults(t, stdout);
			return 1;
		}
		if (!strcmp(argv[i], "--version")) {
			printf("%s %s\n", t->program, KVF_VERSION);
			return 1;
		}
		check |= !strcmp(argv[i], "--check");
		if (!strcmp(argv[i], "--config")) {
			if (i + 1 == argc) {
				cfg_errf(err, errlen, "option --config needs a path");
				return -EINVAL;
			}
			path = argv[++i], must = 1;
		} else if (!strncmp(argv[i], "--config=", 9)) {
			path = argv[i] + 9, must = 1;
		} else if (t->instances && !strcmp(argv[i], "--instance")) {
			if (i + 1 == argc) {
				cfg_errf(err, errlen, "option --instance needs a name");
				return -EINVAL;
			}
			instance = argv[++i];
		} else if (t->instances && !strncmp(argv[i], "--instance=", 11)) {
			instance = argv[i] + 11;
		}
	}
	c = cfg_new(t);
	if (c == NULL) {
		cfg_errf(err, errlen, "out of memory reading the configuration");
		return -ENOMEM;
	}
	rc = cfg_load_file_instance(c, path != NULL && *path ? path : "/etc/kvferry/kvferry.conf", must, instance,
				    err, errlen);
	if (!rc)
		rc = cfg_load_env(c, environ, err, errlen);
	if (!rc)
		rc = cfg_load_args(c, argc, argv, all_skip, bare, err, errlen);
	if (rc) {
		cfg_free(c);
		return rc;
	}
	*out = c;
	return check;
}

void cfg_value_text(const struct cfg *c, size_t i, char *buf, size_t len)
{
	const struct cfg_key *k = &c->t->keys[i];
	const char *field = (const char *)c->v + k->offset;

	switch (k->type) {
	case CFG_INT:
	case CFG_SIZE: snprintf(buf, len, "%lld", (long long)*(const int64_t *)field); break;
	case CFG_FLOAT: snprintf(buf, len, "%g", *(const double *)field); break;
	case CFG_BOOL: snprintf(buf, len, "%s", *(const int *)field ? "yes" : "no"); break;
	case CFG_ENUM: snprintf(buf, len, "%s", k->names[*(const int64_t *)field]); break;
	case CFG_STRING: snprintf(buf, len, "%s", field); break;
	}
}

enum cfg_source cfg_source_at(const struct cfg *c, size_t i)
{
	return c->src[i];
}

const char *cfg_origin_at(const struct cfg *c, size_t i)
{
	return c->origin[i];
}

int cfg_print_defaults(const struct cfg_table *t, FILE *f)
{
	char range[64];

	fprintf(f, "# %s configuration (INI).\n"
		   "# Every key below is commented out and shows its built-in default.\n"
		   "# Precedence: default < this file < KVFERRY_* environment < command-line flag.\n"
		   "# `ctrlctl config` shows the effective values and where each came from.\n", t->program);
	for (int s = 0; t->sections[s]; s++) {
		fprintf(f, "\n[%s]\n", t->sections[s]);
		for (size_t i = 0; i < t->n_keys; i++) {
			const struct cfg_key *k = &t->keys[i];
			if (strcmp(k->section, t->sections[s]) != 0)
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

int cfg_print_usage(const struct cfg_table *t, FILE *f)
{
	char hint[128];

	for (size_t i = 0; i < t->n_keys; i++) {
		const struct cfg_key *k = &t->keys[i];
		fprintf(f, "  %-24s %s\n  %-24s (%s; default '%s'; env %s)\n", k->flag, k->help, "",
			type_hint(k, hint, sizeof(hint)), k->def, k->env);
	}
	return ferror(f) ? -EIO : 0;
}

int cfg_source(const struct cfg *c, const char *key, const char **origin)
{
	size_t idx;

	if (!find_key(c->t, key, &idx))
		return -ENOENT;
	if (origin)
		*origin = c->origin[idx];
	return (int)c->src[idx];
}
