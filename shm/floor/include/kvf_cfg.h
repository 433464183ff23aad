/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kvf_cfg.h
 * The configuration engine every kvferry daemon uses: one declarative table
 * of keys per program (type, default, range, environment variable, flag,
 * help), filled in layers: built-in default < /etc/kvferry/kvferry.conf
 * (INI, the program's own sections) < its KVFERRY_* variables < flags.
 * Every value remembers where it came from, so that errors and `ctrlctl
 * config` can say so.
 *
 * Invariants:
 *  - A value in the settings has always passed its key's type and range
 *    check: a rejected setting leaves the previous value in place.
 *  - Layers may be applied in any order, but a layer never overrides a
 *    value set by a stronger one.
 *  - One file serves every program: the sections another program owns
 *    (cfg_table.foreign_sections) are skipped, an unknown one is an error;
 *    so are the variables of another program's prefix (env_skip).
 *  - A program with instances (cfg_table.instances: one process per
 *    instance, like kvferry-worker@NAME.service) reads [SECTION.NAME] over
 *    [SECTION] when started with --instance NAME, wherever the two stand in
 *    the file; the other instances' sections are skipped.
 *
 * Threading: a configuration is built by one thread; once built, any number
 * of threads may read it.
 */
#ifndef KVF_CFG_H
#define KVF_CFG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Longest string value (paths, addresses, lists), NUL included. */
#define CFG_STRLEN 512

enum cfg_type {
	CFG_INT,    /**< int64_t, decimal */
	CFG_SIZE,   /**< int64_t bytes, with K/M/G/T suffixes (powers of 1024) */
	CFG_FLOAT,  /**< double */
	CFG_BOOL,   /**< int: yes/no, true/false, on/off, 1/0 */
	CFG_ENUM,   /**< int64_t index into names[] */
	CFG_STRING, /**< char[CFG_STRLEN] */
};

/** Where a value came from, weakest first. */
enum cfg_source {
	CFG_SRC_DEFAULT = 0,
	CFG_SRC_FILE = 1,
	CFG_SRC_ENV = 2,
	CFG_SRC_FLAG = 3,
};

/**
 * The floor's error buffer: format into @p err (@p errlen bytes, truncated;
 * nothing when @p err is NULL or @p errlen 0), as every "err, errlen" pair
 * of kvferry's APIs is filled.
 */
void cfg_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/** A string key's extra check: 0, or -EINVAL with @p err filled. */
typedef int (*cfg_check_fn)(const char *value, char *err, size_t errlen);

struct cfg_key {
	const char *name;     /**< the INI key */
	const char *section;  /**< INI section it belongs in */
	enum cfg_type type;
	size_t offset;        /**< into the program's settings struct */
	const char *def;      /**< default, as text */
	double min, max;      /**< numeric range (inclusive) */
	const char *env;      /**< KVFERRY_* variable */
	const char *flag;     /**< --flag */
	const char *const *names; /**< CFG_ENUM: NULL-terminated spellings */
	cfg_check_fn check;   /**< CFG_STRING: optional */
	const char *help;
};

/** A program's table. */
struct cfg_table {
	const char *program;                 /**< "kvferry-worker": named in the hints */
	const struct cfg_key *keys;
	size_t n_keys;
	const char *const *sections;         /**< its own, in the order --print-config writes them */
	const char *const *foreign_sections; /**< other programs' sections in the same file: skipped; an
					      *   entry ending in '.' names a prefix ("worker.": [worker.0] ...) */
	const char *env_prefix;              /**< its variables start so ("KVFERRY_WK_") */
	const char *const *env_skip;         /**< names or prefixes (ending in _) of others: skipped */
	size_t settings_size;                /**< sizeof its settings struct */
	int instances;                       /**< 1: [sections[0].NAME] are per-instance (--instance NAME) */
};

/** Longest instance name (--instance), NUL included: [A-Za-z0-9_-], as a systemd instance. */
#define CFG_INSTANCE_MAX 64

struct cfg;

/** @return a configuration holding every default, or NULL (ENOMEM, or EINVAL: a bad table). */
struct cfg *cfg_new(const struct cfg_table *t);

/** NULL is a no-op. */
void cfg_free(struct cfg *c);

/** The effective values: the program's settings struct. */
const void *cfg_settings(const struct cfg *c);

/**
 * Set one key from text as layer @p src; @p origin ("file:12", the
 * variable, the flag) is copied.
 * @return 0 (also when a stronger layer already set it: that value stays),
 *         -ENOENT (unknown key), -EINVAL (not of its type), -ERANGE
 *         (outside its range); @p err names the key, the value and origin.
 */
int cfg_set(struct cfg *c, const char *key, const char *value, enum cfg_source src, const char *origin,
	    char *err, size_t errlen);

/**
 * Read an INI file (`key = value`, `[section]`, `#`/`;` comments, values in
 * optional double quotes). @p must_exist 0: a missing file is not an error.
 * In a table with instances, every [SECTION.NAME] is skipped.
 * @return 0, -ENOENT, -EIO, -EINVAL (syntax, unknown key or section, bad
 *         value), -ERANGE; @p err is "path:line: ...".
 */
int cfg_load_file(struct cfg *c, const char *path, int must_exist, char *err, size_t errlen);

/**
 * cfg_load_file(), then the file's [SECTION.@p instance] (SECTION: the
 * table's first section) over what [SECTION] set: an instance's own value
 * wins wherever its section stands. @p instance NULL or "" is
 * cfg_load_file(). A table without instances refuses an instance.
 * @return as cfg_load_file(); -EINVAL also for a bad instance name.
 */
int cfg_load_file_instance(struct cfg *c, const char *path, int must_exist, const char *instance, char *err,
			   size_t errlen);

/** Apply the program's KVFERRY_* variables of @p envp; one of its prefix naming no key is an error. */
int cfg_load_env(struct cfg *c, char *const *envp, char *err, size_t errlen);

/**
 * Apply flags: `--key value`, `--key=value`, booleans `--key` / `--no-key`.
 * @p skip (flags with a value) and @p skip_bare (without) are the caller's.
 * @return 0, -ENOENT (unknown flag), -EINVAL, -ERANGE.
 */
int cfg_load_args(struct cfg *c, int argc, char *const *argv, const char *const *skip,
		  const char *const *skip_bare, char *err, size_t errlen);

/**
 * A daemon's whole start-up read, in one call: --help (usage line @p usage,
 * the standard flags, then every key), --print-config, or the layers: the
 * file (--config PATH, else KVFERRY_CONFIG, else /etc/kvferry/kvferry.conf
 * when it exists; with --instance NAME in a table with instances, its
 * [SECTION.NAME] too), the program's variables, the flags (@p skip: the
 * caller's own flags that take a value, besides --config and --instance).
 * @return 0 with @p *out set; 1 when --help / --print-config was served
 *         (@p *out NULL) or --check was asked (@p *out set: check, then say
 *         so); < 0 with @p err filled (@p *out NULL).
 */
int cfg_load_daemon(const struct cfg_table *t, const char *usage, int argc, char *const *argv,
		    const char *const *skip, struct cfg **out, char *err, size_t errlen);

/** The instance cfg_load_daemon() read (--instance NAME), or NULL. */
const char *cfg_instance(const struct cfg *c);

/**
 * An instance named K-R (two numbers) is rank R of stage K: it reads
 * [SECTION.K], then [SECTION.K-R] over it.
 * @return R, with the stage K in @p *stage (may be NULL); -1 for any other name.
 */
int cfg_instance_rank(const char *instance, int *stage);

/** Where @p key came from (@p origin may be NULL). @return the source, or -ENOENT. */
int cfg_source(const struct cfg *c, const char *key, const char **origin);

/** @return the name of a source ("default", "file", "env", "flag"). */
const char *cfg_source_name(enum cfg_source s);

/** Key @p i of the table: its value as text, source and origin (for views). */
void cfg_value_text(const struct cfg *c, size_t i, char *buf, size_t len);
enum cfg_source cfg_source_at(const struct cfg *c, size_t i);
const char *cfg_origin_at(const struct cfg *c, size_t i);

/** Write a commented file with every key, default and help (all commented out). @return 0 or -EIO. */
int cfg_print_defaults(const struct cfg_table *t, FILE *f);

/** Write the flag list with help (for --help). @return 0 or -EIO. */
int cfg_print_usage(const struct cfg_table *t, FILE *f);

#ifdef __cplusplus
}
#endif
#endif /* KVF_CFG_H */
