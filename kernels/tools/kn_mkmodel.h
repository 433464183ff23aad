/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kn_mkmodel.h
 * Private to kvferry-mkmodel: the byte-level BPE tokenizer it writes.
 */
#ifndef KN_MKMODEL_H
#define KN_MKMODEL_H

#include <stdint.h>

/** Special tokens of a family, with their ids once built. */
struct kn_mk_vocab {
	char **tokens;        /**< [n] token strings in byte-level form, by id */
	int32_t n;            /**< vocab size */
	char **merges;        /**< [n_merges] "a b" */
	int32_t n_merges;
	int32_t first_special; /**< ids >= this are added (special) tokens */
	int32_t bos, eos, eot; /**< -1 if the family has none */
	int qwen;             /**< ChatML specials and pattern instead of Llama 3's */
};

/**
 * Build the vocabulary: 256 byte tokens, up to @p max_merges merges learned
 * deterministically from a built-in corpus, "<|reserved_N|>" fillers up to
 * @p min_vocab, then the family's special tokens.
 * @return 0 or -ENOMEM.
 */
int kn_mk_vocab_build(struct kn_mk_vocab *v, int qwen, int32_t max_merges, int32_t min_vocab);

/** Free what kn_mk_vocab_build() allocated. */
void kn_mk_vocab_free(struct kn_mk_vocab *v);

/**
 * Write tokenizer.json and tokenizer_config.json into @p dir.
 * @return 0 or -errno (message on stderr).
 */
int kn_mk_vocab_write(const struct kn_mk_vocab *v, const char *dir, int32_t max_len);

#endif /* KN_MKMODEL_H */
