/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A model's configuration from its Hugging Face directory: config.json in
 * every spelling recent transformers releases have written (architectures or
 * model_type, text_config of multimodal wrappers, dtype or torch_dtype, the
 * llama3 rope scaling), and generation_config.json's stop and BOS ids.
 * A value out of range is refused naming the file and the key; the engines
 * rely on every shape being consistent (heads a multiple of KV heads, an
 * even head_dim).
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kn_err.h"
#include "kn_model.h"
#include "kn_model_int.h"

const char *kn_arch_name(enum kn_arch a)
{
	switch (a) {
	case KN_ARCH_LLAMA: return "llama";
	case KN_ARCH_QWEN2: return "qwen2";
	case KN_ARCH_QWEN3: return "qwen3";
	}
	return "unknown";
}

static int json_num(json_t *o, const char *key, double *out)
{
	json_t *v = json_object_get(o, key);
	if (!v || !json_is_number(v))
		return 0;
	*out = json_number_value(v);
	return 1;
}

static int get_int(json_t *o, const char *key, int32_t *out, int required,
		   char *err, size_t errlen)
{
	double d;
	if (!json_num(o, key, &d)) {
		if (required) {
			kn_seterr(err, errlen, "config.json: required integer key \"%s\" is missing or not a number", key);
			return -EINVAL;
		}
		return 0;
	}
	if (d < 0 || d > 1e9 || d != (double)(int64_t)d) {
		kn_seterr(err, errlen, "config.json: \"%s\" = %g is not a sane non-negative integer", key, d);
		return -EINVAL;
	}
	*out = (int32_t)d;
	return 1;
}

static void add_eos(struct kn_model_config *c, json_t *v)
{
	size_t i;
	json_t *e;
	if (json_is_integer(v)) {
		int32_t id = (int32_t)json_integer_value(v);
		for (int k = 0; k < c->n_eos; k++)
			if (c->eos_token_ids[k] == id)
				return;
		if (c->n_eos < KN_MAX_EOS)
			c->eos_token_ids[c->n_eos++] = id;
	} else if (json_is_array(v)) {
		json_array_foreach(v, i, e)
			add_eos(c, e);
	}
}

static int parse_dtype_name(const char *s, enum kn_dtype *d)
{
	if (!strcmp(s, "bfloat16") || !strcmp(s, "torch.bfloat16") || !strcmp(s, "BF16"))
		*d = KN_DT_BF16;
	else if (!strcmp(s, "float16") || !strcmp(s, "torch.float16") || !strcmp(s, "F16"))
		*d = KN_DT_F16;
	else if (!strcmp(s, "float32") || !strcmp(s, "torch.float32") || !strcmp(s, "F32"))
		*d = KN_DT_F32;
	else
		return -1;
	return 0;
}

/* Rope settings live in rope_theta + rope_scaling (transformers <= 4.x) or
 * in rope_parameters (5.x, which also moves rope_theta inside). */
static int parse_rope(json_t *root, struct kn_model_config *c, char *err, size_t errlen)
{
	double d;
	json_t *sc = json_object_get(root, "rope_parameters");
	if (!sc || !json_is_object(sc))
		sc = json_object_get(root, "rope_scaling");
	c->rope_theta = 10000.0f;
	if (json_num(root, "rope_theta", &d))
		c->rope_theta = (float)d;
	if (!sc || json_is_null(sc))
		return 0;
	if (!json_is_object(sc)) {
		kn_seterr(err, errlen, "config.json: rope_scaling/rope_parameters is not an object");
		return -EINVAL;
	}
	if (json_num(sc, "rope_theta", &d))
		c->rope_theta = (float)d;
	json_t *t = json_object_get(sc, "rope_type");
	if (!t)
		t = json_object_get(sc, "type");
	const char *type = json_is_string(t) ? json_string_value(t) : "default";
	if (!strcmp(type, "default"))
		return 0;
	if (strcmp(type, "llama3") != 0) {
		kn_seterr(err, errlen, "config.json: rope type \"%s\" is not supported (supported: default, llama3)", type);
		return -EINVAL;
	}
	c->rope_factor = 8.0f;
	c->rope_low_freq_factor = 1.0f;
	c->rope_high_freq_factor = 4.0f;
	c->rope_orig_max_position = 8192;
	if (json_num(sc, "factor", &d))
		c->rope_factor = (float)d;
	if (json_num(sc, "low_freq_factor", &d))
		c->rope_low_freq_factor = (float)d;
	if (json_num(sc, "high_freq_factor", &d))
		c->rope_high_freq_factor = (float)d;
	if (json_num(sc, "original_max_position_embeddings", &d))
		c->rope_orig_max_position = d > 0 && d <= 1e9 ? (int32_t)d : -1; /* refused below */
	if (!(c->rope_factor > 0) || !(c->rope_high_freq_factor > c->rope_low_freq_factor)
	    || c->rope_orig_max_position <= 0) {
		kn_seterr(err, errlen, "config.json: llama3 rope scaling needs factor > 0, high_freq_factor > low_freq_factor and original_max_position_embeddings > 0");
		return -EINVAL;
	}
	return 0;
}

/* The configuration of a parsed config.json (@p path names it in messages).
 * @return 0 or -EINVAL with @p err filled. */
int kn_model_config_from_json(json_t *root, const char *path, struct kn_model_config *c, char *err,
			      size_t errlen)
{
	json_t *v;
	double d;

	/* Multimodal wrappers nest the text model; plain decoders do not. */
	v = json_object_get(root, "text_config");
	json_t *cfg = json_is_object(v) ? v : root;

	const char *archname = NULL;
	v = json_object_get(root, "architectures");
	if (json_is_array(v) && json_array_size(v) > 0 && json_is_string(json_array_get(v, 0)))
		archname = json_string_value(json_array_get(v, 0));
	const char *mtype = json_string_value(json_object_get(cfg, "model_type"));
	if (archname && (!strcmp(archname, "LlamaForCausalLM") || !strcmp(archname, "MistralForCausalLM")))
		c->arch = KN_ARCH_LLAMA;
	else if (archname && !strcmp(archname, "Qwen2ForCausalLM"))
		c->arch = KN_ARCH_QWEN2;
	else if (archname && !strcmp(archname, "Qwen3ForCausalLM"))
		c->arch = KN_ARCH_QWEN3;
	else if (!archname && mtype && (!strcmp(mtype, "llama") || !strcmp(mtype, "mistral")))
		c->arch = KN_ARCH_LLAMA;
	else if (!archname && mtype && !strcmp(mtype, "qwen2"))
		c->arch = KN_ARCH_QWEN2;
	else if (!archname && mtype && !strcmp(mtype, "qwen3"))
		c->arch = KN_ARCH_QWEN3;
	else {
		kn_seterr(err, errlen, "%s: unknown architecture \"%s\" (model_type \"%s\"); supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM",
		       path, archname ? archname : "(none)", mtype ? mtype : "(none)");
		return -EINVAL;
	}
	c->qkv_bias = c->arch == KN_ARCH_QWEN2;
	c->qk_norm = c->arch == KN_ARCH_QWEN3;

	if (get_int(cfg, "vocab_size", &c->vocab_size, 1, err, errlen) < 0
	    || get_int(cfg, "hidden_size", &c->hidden_size, 1, err, errlen) < 0
	    || get_int(cfg, "intermediate_size", &c->intermediate_size, 1, err, errlen) < 0
	    || get_int(cfg, "num_hidden_layers", &c->n_layers, 1, err, errlen) < 0
	    || get_int(cfg, "num_attention_heads", &c->n_heads, 1, err, errlen) < 0)
		return -EINVAL;
	c->n_kv_heads = c->n_heads;
	if (get_int(cfg, "num_key_value_heads", &c->n_kv_heads, 0, err, errlen) < 0)
		return -EINVAL;
	if (c->n_heads <= 0 || c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads || c->hidden_size <= 0
	    || c->vocab_size <= 0 || c->n_layers <= 0 || c->intermediate_size <= 0) {
		kn_seterr(err, errlen, "%s: inconsistent shape: hidden_size %d, vocab_size %d, layers %d, heads %d, kv heads %d (heads must be a multiple of kv heads; all > 0)",
		       path, c->hidden_size, c->vocab_size, c->n_layers, c->n_heads, c->n_kv_heads);
		return -EINVAL;
	}
	c->head_dim = c->hidden_size / c->n_heads;
	if (get_int(cfg, "head_dim", &c->head_dim, 0, err, errlen) < 0)
		return -EINVAL;
	if (c->head_dim <= 0 || c->head_dim % 2) {
		kn_seterr(err, errlen, "%s: head_dim %d must be even and > 0", path, c->head_dim);
		return -EINVAL;
	}
	c->max_position = 8192;
	if (get_int(cfg, "max_position_embeddings", &c->max_position, 0, err, errlen) < 0)
		return -EINVAL;
	c->rms_eps = 1e-6f;
	if (json_num(cfg, "rms_norm_eps", &d))
		c->rms_eps = (float)d;
	if (parse_rope(cfg, c, err, errlen) < 0)
		return -EINVAL;
	v = json_object_get(cfg, "tie_word_embeddings");
	if (!v)
		v = json_object_get(root, "tie_word_embeddings");
	c->tie_embeddings = json_is_true(v);
	if (c->arch == KN_ARCH_LLAMA && (json_is_true(json_object_get(cfg, "attention_bias"))
					 || json_is_true(json_object_get(cfg, "mlp_bias")))) {
		kn_seterr(err, errlen, "%s: attention_bias/mlp_bias true is not supported for llama models", path);
		return -EINVAL;
	}
	c->dtype = KN_DT_BF16;
	v = json_object_get(cfg, "dtype");
	if (!json_is_string(v))
		v = json_object_get(cfg, "torch_dtype");
	if (!json_is_string(v))
		v = json_object_get(root, "torch_dtype");
	if (json_is_string(v) && parse_dtype_name(json_string_value(v), &c->dtype) < 0) {
		kn_seterr(err, errlen, "%s: dtype \"%s\" is not supported (bfloat16, float16, float32)", path, json_string_value(v));
		return -EINVAL;
	}
	c->bos_token_id = -1;
	v = json_object_get(cfg, "bos_token_id");
	if (json_is_integer(v))
		c->bos_token_id = (int32_t)json_integer_value(v);
	add_eos(c, json_object_get(cfg, "eos_token_id"));
	return 0;
}

int kn_model_parse_config(const char *dir, struct kn_model_config *c, char *err, size_t errlen)
{
	char path[4096];
	json_error_t je;
	json_t *root, *v;
	int rc;

	memset(c, 0, sizeof(*c));
	snprintf(path, sizeof(path), "%s/config.json", dir);
	root = json_load_file(path, 0, &je);
	if (!root) {
		if (access(path, R_OK)) {
			int e = errno;
			kn_seterr(err, errlen, "%s: %s; a model directory needs a Hugging Face config.json", path, strerror(e));
			return -e;
		}
		kn_seterr(err, errlen, "json_load_file(%s) failed: %s (line %d)", path, je.text, je.line);
		return -EINVAL;
	}
	rc = kn_model_config_from_json(root, path, c, err, errlen);
	json_decref(root);
	if (rc)
		return rc;

	/* generation_config.json is optional; it adds stop ids (e.g. <|eot_id|>). */
	snprintf(path, sizeof(path), "%s/generation_config.json", dir);
	root = json_load_file(path, 0, &je);
	if (root) {
		add_eos(c, json_object_get(root, "eos_token_id"));
		v = json_object_get(root, "bos_token_id");
		if (c->bos_token_id < 0 && json_is_integer(v))
			c->bos_token_id = (int32_t)json_integer_value(v);
		json_decref(root);
	}
	return 0;
}
