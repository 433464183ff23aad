/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file ctrl_config.h
 * kvferry-ctrld's configuration: one declarative table of keys (type,
 * default, range, environment variable, command-line flag, help), filled in
 * layers: built-in default < /etc/kvferry/kvferry.conf (INI) < KVFERRY_*
 * environment < command-line flags. Every value remembers where it came
 * from ("default", "file:line", the variable, or the flag), so that errors
 * and `ctrlctl config` can say so.
 *
 * Invariants:
 *  - A value in struct ctrl_settings has always passed its key's type and
 *    range check: a rejected setting leaves the previous value in place.
 *  - Layers may be applied in any order, but a layer never overrides a value
 *    set by a stronger one (a file read after the flags does not undo them).
 *
 * Threading: a ctrl_config is built by one thread; once built, any number of
 * threads may read it (nothing changes it afterwards).
 */
#ifndef CTRL_CONFIG_H
#define CTRL_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Longest string value (paths, addresses, peer lists), NUL included. */
#define CTRL_CFG_STRLEN 512
/** Most explicit stage ranges ("0-8,8-16,..."). */
#define CTRL_CFG_MAX_STAGES 16

/** Default config file path. */
#define CTRL_CONFIG_PATH "/etc/kvferry/kvferry.conf"
/** Default admin socket path. */
#define CTRL_ADMIN_PATH "/run/kvferry/ctrl.sock"

/** Where a value came from, weakest first. */
enum ctrl_cfg_source {
	CTRL_CFG_DEFAULT = 0,
	CTRL_CFG_FILE = 1,
	CTRL_CFG_ENV = 2,
	CTRL_CFG_FLAG = 3,
};

/** Compute backend of the stage engines. */
enum ctrl_cfg_backend {
	CTRL_CFG_BACKEND_CPU = 0,
	CTRL_CFG_BACKEND_CUDA = 1,
};

/** What this node does in prefill/decode disaggregation ([pd] role). */
enum ctrl_cfg_pd_role {
	CTRL_CFG_PD_BOTH = 0,    /**< prefill and decode here (no disaggregation) */
	CTRL_CFG_PD_PREFILL = 1, /**< also serves the bootstrap routes */
	CTRL_CFG_PD_DECODE = 2,  /**< takes KV pages from prefill nodes */
};

/** The effective values, one field per key of the table. */
struct ctrl_settings {
	/* [http] */
	char listen_address[CTRL_CFG_STRLEN];
	int64_t port;                 /**< 0: an ephemeral port (tests) */
	int64_t http_threads;
	int64_t request_body_limit;   /**< bytes */
	int64_t connection_timeout;   /**< seconds a connection may stay silent; 0 = never closed */
	int64_t request_timeout;      /**< seconds a request may take to arrive; 0 = no deadline */
	int64_t max_connections;      /**< beyond it: 503 and closed; 0 = libmicrohttpd's own */
	char cors_allow_origins[CTRL_CFG_STRLEN]; /**< "" = no CORS; "*"; or origins, comma-separated */
	/* [model] */
	char model_dir[CTRL_CFG_STRLEN];
	char served_model_name[CTRL_CFG_STRLEN]; /**< "" = the model dir's basename */
	int64_t max_tokens_default;
	int64_t max_context;          /**< 0 = the model's max_position */
	char chat_template[CTRL_CFG_STRLEN]; /**< "" = the model's; "none"; else a template file */
	/* [engine] */
	char stages[CTRL_CFG_STRLEN]; /**< "N" or "0-8,8-16" */
	int64_t backend;              /**< enum ctrl_cfg_backend */
	int64_t threads;              /**< 0 = online cores */
	int64_t kv_blocks;            /**< 0 = as many as kv_memory holds */
	int64_t kv_memory;            /**< bytes (CPU pool budget) */
	double kv_mem_fraction;       /**< CUDA: share of free device memory */
	int64_t device;               /**< CUDA device ordinal */
	int64_t cuda_gemv, cuda_wide_x, cuda_attn, cuda_batch_invariant; /**< kn_stage_opts' CUDA kernel choices */
	char cuda_module[CTRL_CFG_STRLEN]; /**< kvferry-cuda.so; "" = beside the program, else installed */
	char plans[CTRL_CFG_STRLEN];  /**< "auto" or ascending plan widths "8,32,64,256" */
	/* [sched] */
	int64_t max_slots;
	int64_t mb_k;
	double step_budget;           /**< cuda: launch time / its decodes' time; 1 = off */
	int64_t groups;               /**< 0 = stages + 1 */
	int64_t max_queue;
	int64_t replicas;
	int prefix_cache;             /**< keep finished prompts' KV blocks (ctrl/sched_prefix.c) */
	int spec;
	int prefill_pipeline;         /**< a prompt's chunks may be in flight in several groups */
	int64_t spec_depth;
	int64_t spec_c_full;
	int64_t spec_c_half;
	int64_t replay_max;           /**< replays of a request its chain lost; 0 = none */
	int64_t replay_timeout;       /**< seconds a request waits for its chain to re-form */
	/* [ctrl] */
	char admin_socket[CTRL_CFG_STRLEN];
	int64_t drain_timeout;        /**< seconds */
	int64_t poll_spin_us;         /**< -1 = auto (cuda 2000, cpu 0) */
	/* [engine] stages in kvferry-worker processes */
	char worker_region[CTRL_CFG_STRLEN]; /**< "" = stages run inside ctrld */
	int64_t worker_region_size;   /**< bytes; > 0: ctrld creates the region */
	int64_t worker_return;        /**< 0: ring on this node, 1: through the dataplane */
	int64_t worker_join_timeout;  /**< seconds */
	int64_t worker_group_timeout; /**< seconds */
	/* [pd] */
	int64_t pd_role;              /**< enum ctrl_cfg_pd_role */
	int64_t bootstrap_port;
	char rank_address[CTRL_CFG_STRLEN]; /**< "" = listen_address:bootstrap_port */
	char pd_dataplane_region[CTRL_CFG_STRLEN]; /**< "" = no KV transfer */
	char pd_prefill[CTRL_CFG_STRLEN];  /**< decode: "host:port, ..." prefill bootstrap addresses */
	int64_t pd_heartbeat_interval;     /**< seconds */
	int64_t pd_heartbeat_failures;
	int64_t pd_room_timeout;           /**< seconds */
	int64_t pd_ship_chunk;             /**< prefill: tokens per chunk of a room's prompt, 0 = whole */
	int64_t pd_page_buffers;           /**< prefill: KV page messages on their way at once */
	int64_t pd_ship_taper;             /**< prefill: only the last chunks that small, the ones before wide */
	int64_t pd_first_early;            /**< decode: a room's first token out at its Success, before its last pages */
	int64_t pd_room_retries;           /**< decode: fresh rooms for a request whose room a dataplane restart lost */
	int64_t pd_worker_rx;              /**< decode: worker stages take their KV pages from the dataplane themselves */
};

struct ctrl_config;

/**
 * A configuration holding every key's default.
 * @return the configuration, or NULL with errno ENOMEM.
 */
struct ctrl_config *ctrl_config_new(void);

/** Free a configuration; NULL is a no-op. */
void ctrl_config_free(struct ctrl_config *c);

/** @return the effective values (valid until ctrl_config_free()). */
const struct ctrl_settings *ctrl_config_settings(const struct ctrl_config *c);

/**
 * Set one key from text, as layer @p src.
 * @param c       the configuration
 * @param key     a key of the table ("port")
 * @param value   its text ("8000", "64M", "yes", "cuda")
 * @param src     the layer
 * @param origin  where it was written ("/etc/kvferry/kvferry.conf:12",
 *                "KVFERRY_PORT", "--port"); copied
 * @param err     receives a message naming the key, the value and @p origin
 * @param errlen  size of @p err
 * @return 0 (also when a stronger layer already set the key: it keeps its
 *         value), -ENOENT (unknown key), -EINVAL (not of the key's type),
 *         -ERANGE (outside the key's range).
 */
int ctrl_config_set(struct ctrl_config *c, const char *key, const char *value,
		    enum ctrl_cfg_source src, const char *origin, char *err, size_t errlen);

/**
 * Read an INI file: `key = value` lines, `[section]` headers naming the
 * table's sections, `#` and `;` comments, values optionally in double quotes.
 * @param c          the configuration
 * @param path       the file
 * @param must_exist 0: a missing file is not an error (the default path)
 * @param err        receives "path:line: ..." on failure
 * @param errlen     size of @p err
 * @return 0, -ENOENT (missing and @p must_exist), -EIO (unreadable),
 *         -EINVAL (syntax, unknown key or section, bad value), -ERANGE.
 */
int ctrl_config_load_file(struct ctrl_config *c, const char *path, int must_exist,
			  char *err, size_t errlen);

/**
 * Apply every KVFERRY_* variable of @p envp that names a key. A KVFERRY_*
 * variable naming no key is an error (a typo would otherwise pass unseen),
 * except KVFERRY_CONFIG (the config file path, read by the daemon).
 * @param envp  NULL-terminated "NAME=value" strings (environ)
 * @return 0, or the first error as ctrl_config_set().
 */
int ctrl_config_load_env(struct ctrl_config *c, char *const *envp, char *err, size_t errlen);

/**
 * Apply command-line flags: `--key value`, `--key=value`, and for booleans
 * `--key` / `--no-key`. Arguments listed in @p skip (each with its value when
 * it takes one, e.g. "--config") are left to the caller.
 * @param argc,argv  the arguments (argv[0] is skipped)
 * @param skip       NULL-terminated names of the caller's flags that take a
 *                   value, or NULL
 * @param skip_bare  NULL-terminated names of the caller's flags without a
 *                   value (--help), or NULL
 * @return 0, -ENOENT (unknown flag), -EINVAL (missing value, bad value), -ERANGE.
 */
int ctrl_config_load_args(struct ctrl_config *c, int argc, char *const *argv,
			  const char *const *skip, const char *const *skip_bare,
			  char *err, size_t errlen);

/**
 * Check what no single key can: the stage list, and cross-key rules.
 * @return 0 or -EINVAL with @p err naming the keys.
 */
int ctrl_config_check(const struct ctrl_config *c, char *err, size_t errlen);

/**
 * Check a cors_allow_origins value: "", "*", or origins ("http://" or
 * "https://", a host and maybe a port, no path) separated by commas.
 * @return 0, or -EINVAL with @p err naming the bad entry and the fix.
 */
int ctrl_config_cors_check(const char *origins, char *err, size_t errlen);

/**
 * The next entry of a comma-separated list: @p *item and @p *len get it
 * (spaces around it left out), @p *p moves past it (NULL after the last).
 * @return 1, or 0 once @p *p is NULL. "" is one empty entry.
 */
int ctrl_config_list_next(const char **p, const char **item, size_t *len);

/**
 * Parse the stages key against a model of @p n_layers layers.
 * @param stages     "N" (split evenly) or "a-b,b-c,..." (contiguous, from 0)
 * @param n_layers   the model's layers, or 0 to check syntax only
 * @param ends       receives each stage's end layer (the last is n_layers)
 * @param n_stages   receives the stage count
 * @return 0, or -EINVAL with @p err saying what is wrong.
 */
/**
 * Parse the plans key: "auto" or up to 8 ascending widths in 1..4096,
 * comma-separated.
 * @param widths   receives the widths (untouched for "auto")
 * @param n        receives the count (0 for "auto")
 * @return 0, or -EINVAL with @p err naming the bad part.
 */
int ctrl_config_plans(const char *plans, int32_t widths[8], int32_t *n, char *err, size_t errlen);

int ctrl_config_stages(const char *stages, int32_t n_layers, int32_t ends[CTRL_CFG_MAX_STAGES],
		       int32_t *n_stages, char *err, size_t errlen);

/**
 * The effective configuration as JSON: an array of
 * {"key","section","value","source","origin","default","help"}.
 * @return a new reference, or NULL (ENOMEM).
 */
json_t *ctrl_config_json(const struct ctrl_config *c);

/**
 * Write a commented config file listing every key with its default and
 * help, all commented out (the packaged /etc/kvferry/kvferry.conf).
 * @return 0 or -errno of the write.
 */
int ctrl_config_print_defaults(FILE *f);

/**
 * Write the flag list with help (for --help).
 * @return 0 or -errno of the write.
 */
int ctrl_config_print_usage(FILE *f);

/** @return the name of a source ("default", "file", "env", "flag"). */
const char *ctrl_config_source_name(enum ctrl_cfg_source s);

/**
 * Where @p key's value came from.
 * @param origin  receives the origin text ("default" for defaults), or NULL
 * @return the source, or -ENOENT for an unknown key.
 */
int ctrl_config_source(const struct ctrl_config *c, const char *key, const char **origin);

struct ctrl_admin;

/** Register /ctrl/config (`ctrlctl config`) on @p a, reading @p c. @return 0 or ctrl_admin_register()'s error. */
int ctrl_config_admin_register(struct ctrl_admin *a, const struct ctrl_config *c);

#ifdef __cplusplus
}
#endif
#endif /* CTRL_CONFIG_H */
