/* SPDX-License-Identifier: Apache-2.0 */
/* kvferry-ctrld's configuration table (config_table.c), over the floor's engine (kvf_cfg.h). */
#ifndef CTRL_CONFIG_INT_H
#define CTRL_CONFIG_INT_H

#include "kvf_cfg.h"

extern const struct cfg_key g_cfg_keys[];
extern const size_t g_cfg_n_keys;
extern const char *const g_cfg_sections[];
extern const struct cfg_table g_cfg_table;

#endif /* CTRL_CONFIG_INT_H */
