/* SPDX-License-Identifier: Apache-2.0 */
/* Private: the configuration table (config_table.c) as config.c reads it. */
#ifndef CTRL_CONFIG_INT_H
#define CTRL_CONFIG_INT_H

#include <stddef.h>
#include <stdint.h>

#include "ctrl_config.h"

enum cfg_type {
	CFG_INT,    /* int64_t, decimal */
	CFG_SIZE,   /* int64_t bytes, with K/M/G/T suffixes (powers of 1024) */
	CFG_FLOAT,  /* double */
	CFG_BOOL,   /* int: yes/no, true/false, on/off, 1/0 */
	CFG_ENUM,   /* int64_t index into names[] */
	CFG_STRING, /* char[CTRL_CFG_STRLEN] */
};

/* A string key's extra check; returns 0 or -EINVAL with err filled. */
typedef int (*cfg_check_fn)(const char *value, char *err, size_t errlen);

struct cfg_key {
	const char *name;     /* the INI key */
	const char *section;  /* INI section it belongs in */
	enum cfg_type type;
	size_t offset;        /* into struct ctrl_settings */
	const char *def;      /* default, as text */
	double min, max;      /* numeric range (inclusive) */
	const char *env;      /* KVFERRY_* variable */
	const char *flag;     /* --flag */
	const char *const *names; /* CFG_ENUM: NULL-terminated spellings */
	cfg_check_fn check;   /* CFG_STRING: optional */
	const char *help;
};

extern const struct cfg_key g_cfg_keys[];
extern const size_t g_cfg_n_keys;
extern const char *const g_cfg_sections[];

#endif /* CTRL_CONFIG_INT_H */
