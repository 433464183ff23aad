/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kn_model.h
 * A Hugging Face model directory, opened: config.json, *.safetensors
 * (mmapped, single file or sharded with model.safetensors.index.json),
 * tokenizer files and generation_config.json.
 *
 * Threading: a kn_model is read-only after kn_model_open(); any number of
 * threads and stage engines may read it at once.
 */
#ifndef KN_MODEL_H
#define KN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Architecture flavours the engines implement. */
enum kn_arch {
	KN_ARCH_LLAMA = 1, /**< LlamaForCausalLM, MistralForCausalLM */
	KN_ARCH_QWEN2 = 2, /**< Qwen2ForCausalLM: q/k/v projections carry bias */
	KN_ARCH_QWEN3 = 3, /**< Qwen3ForCausalLM: RMSNorm on q and k per head */
};

/** Tensor element types as stored in safetensors. */
enum kn_dtype {
	KN_DT_F32 = 1,
	KN_DT_F16 = 2,
	KN_DT_BF16 = 3,
};

#define KN_MAX_EOS 8

/** The model's shape and constants, normalised from every spelling of config.json. */
struct kn_model_config {
	enum kn_arch arch;
	int32_t vocab_size;
	int32_t hidden_size;
	int32_t intermediate_size;
	int32_t n_layers;
	int32_t n_heads;
	int32_t n_kv_heads;
	int32_t head_dim;          /**< explicit head_dim, else hidden/heads */
	int32_t max_position;      /**< max_position_embeddings */
	float rms_eps;
	float rope_theta;
	/* Llama-3 rope scaling (rope_type "llama3"); factor 0 means none. */
	float rope_factor;
	float rope_low_freq_factor;
	float rope_high_freq_factor;
	int32_t rope_orig_max_position;
	int tie_embeddings;        /**< lm_head shares embed_tokens */
	int qkv_bias;              /**< q/k/v projections have bias (Qwen2) */
	int qk_norm;               /**< per-head RMSNorm on q and k (Qwen3) */
	enum kn_dtype dtype;       /**< torch_dtype / dtype */
	int32_t bos_token_id;      /**< -1 if none */
	int32_t eos_token_ids[KN_MAX_EOS]; /**< from config and generation_config */
	int32_t n_eos;
};

/** One tensor as found in the safetensors files. */
struct kn_tensor {
	const char *name;
	enum kn_dtype dtype;
	int32_t n_dims;
	int64_t shape[4];
	const void *data;          /**< points into the mmapped file */
	size_t nbytes;
};

struct kn_model;

/**
 * Open a model directory.
 * @param dir     directory holding config.json and *.safetensors
 * @param err     receives a message naming the problem and the fix on failure
 * @param errlen  size of @p err
 * @return the model, or NULL with errno set (ENOENT missing file, EINVAL bad
 *         config or tensor: shape, dtype, truncated file, lying header,
 *         unknown architecture; ENOMEM) and @p err filled.
 */
struct kn_model *kn_model_open(const char *dir, char *err, size_t errlen);

/** Close a model opened by kn_model_open(); NULL is a no-op. */
void kn_model_close(struct kn_model *m);

/** @return the model's normalised configuration (valid until close). */
const struct kn_model_config *kn_model_config(const struct kn_model *m);

/** @return the directory the model was opened from. */
const char *kn_model_dir(const struct kn_model *m);

/**
 * Look up a tensor by its Hugging Face name.
 * @return the tensor, or NULL if absent.
 */
const struct kn_tensor *kn_model_tensor(const struct kn_model *m, const char *name);

/**
 * The tensors a stage holding layers [@p ls, @p le) reads from the model
 * files (Hugging Face Llama-family names; the first stage adds the
 * embedding, the last the final norm and the LM head, or the embedding again
 * when the head is tied), so a loader can say what it moves before it starts
 * and ctrld can show a stage's load without asking the worker.
 * @param n      receives the tensor count
 * @param bytes  receives their stored bytes
 * Threading: read-only on @p m; any thread.
 */
void kn_model_range_tensors(const struct kn_model *m, int32_t ls, int32_t le, int32_t *n, uint64_t *bytes);

/**
 * Read the weights of a stage holding layers [@p ls, @p le): every byte of
 * the tensors kn_model_range_tensors() counts, through the mapping, in
 * chunks read ahead from the file, so they sit in memory (page cache and
 * this process's page tables) before the stage's first step instead of
 * being faulted in during it, and a loader can time how fast they came.
 * An engine that reads its weights lazily (the CPU engine computes over
 * the mapping) calls this at load; one that uploads them reads them anyway.
 * @param progress  NULL, or called after each chunk (at most 16 MiB) with
 *                  the bytes read so far and the total; a nonzero return
 *                  stops the read (a daemon asked to stop mid-load)
 * @param arg       passed to @p progress
 * @param err       receives a message naming the tensor and file on failure
 * @param errlen    size of @p err
 * @return 0, or -errno: -EFAULT / -EIO a file could not be read (it shrank
 *         since kn_model_open(), or its disk failed), -ENOMEM, -ECANCELED
 *         @p progress stopped it.
 * Threading: read-only on @p m; any thread; @p progress runs on the caller's.
 */
int kn_model_read_range(const struct kn_model *m, int32_t ls, int32_t le,
			int (*progress)(void *arg, uint64_t done, uint64_t total), void *arg, char *err,
			size_t errlen);

/**
 * A stable 64-bit identity of the model (config + tensor names, shapes and a
 * sample of weight bytes): two processes holding different models disagree.
 */
uint64_t kn_model_fingerprint(const struct kn_model *m);

/** @return a short name for an architecture ("llama", "qwen2", "qwen3"). */
const char *kn_arch_name(enum kn_arch a);

#ifdef __cplusplus
}
#endif
#endif /* KN_MODEL_H */
