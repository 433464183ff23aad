/* SPDX-License-Identifier: Apache-2.0 */
/* Private to the model loader: kn_model.c (safetensors, validation, the
 * API) and kn_model_config.c (config.json and generation_config.json). */
#ifndef KN_MODEL_INT_H
#define KN_MODEL_INT_H

#include <stddef.h>

#include <jansson.h>

#include "kn_model.h"

/*
 * Read @p dir/config.json (every spelling recent transformers releases have
 * written, a multimodal wrapper's text_config included) and, when present,
 * generation_config.json's stop and BOS ids into @p c.
 * @return 0, -EINVAL (unknown architecture, inconsistent or unsupported
 *         values: @p err names the file and the key), or -errno when
 *         config.json cannot be read.
 */
int kn_model_parse_config(const char *dir, struct kn_model_config *c, char *err, size_t errlen);

/*
 * The same on a parsed config.json (@p path names it in messages; the fuzz
 * target feeds it bytes): everything but generation_config.json.
 * @return 0 or -EINVAL with @p err filled.
 */
int kn_model_config_from_json(json_t *root, const char *path, struct kn_model_config *c, char *err,
			      size_t errlen);

#endif /* KN_MODEL_INT_H */
