/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private to the tokenizer: the layout of struct kn_tok shared by
 * kn_tok.c (load, encode, decode) and kn_tok_chat.c (chat templates).
 * Never installed, never included outside kernels/kn_tok*.c and their tests.
 */
#ifndef KN_TOK_INT_H
#define KN_TOK_INT_H

#include <stdint.h>
#include <stddef.h>

#include "kn_tok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* A growable byte string; all helpers return 0 or -ENOMEM. */
struct kn_tok_buf {
	char *p;
	size_t n, cap;
};

int kn_tok_buf_add(struct kn_tok_buf *b, const void *s, size_t n);
int kn_tok_buf_str(struct kn_tok_buf *b, const char *s);

/* Split behaviours of the "Split" pre-tokenizer, as tokenizers names them. */
enum kn_tok_split_beh {
	KN_SPLIT_ISOLATED,
	KN_SPLIT_REMOVED,
	KN_SPLIT_MERGED_PREV,
	KN_SPLIT_MERGED_NEXT,
	KN_SPLIT_CONTIGUOUS,
};

struct kn_tok_pretok {
	pcre2_code *re;
	enum kn_tok_split_beh beh;
	int invert;
};

struct kn_tok_added {
	const char *content;  /* points into the token pool */
	uint32_t len;
	int32_t id;
	uint8_t special, lstrip, rstrip;
};

/* One entry of the merge table: (left id, right id) -> rank, merged id. */
struct kn_tok_merge {
	uint64_t key;        /* UINT64_MAX marks an empty slot */
	int32_t rank;
	int32_t id;
};

struct kn_tok {
	int32_t n_ids;            /* one past the largest id */
	char *pool;               /* spellings and decoded bytes of every id */
	size_t pool_len;
	uint32_t *spell_off, *spell_len;   /* tokenizer.json spelling per id */
	uint32_t *bytes_off, *bytes_len;   /* raw bytes per id (byte map undone) */
	uint8_t *present;         /* id has a token */
	uint8_t *special;         /* id is a special added token */
	size_t max_token_bytes;

	uint32_t *spell_map;      /* open addressing: id + 1, 0 empty */
	size_t spell_mask;
	uint32_t *bytes_map;      /* model vocab only: raw bytes -> id + 1 */
	size_t bytes_mask;
	struct kn_tok_merge *merges;
	size_t merge_mask;
	int32_t byte_id[256];     /* single-byte token, -1 if the vocab lacks it */
	int byte_fallback;        /* use <0xXX> tokens for bytes missing from vocab */
	int ignore_merges;        /* a whole pre-token found in vocab is emitted as is */

	int nfc;                  /* normalizer is NFC */
	int add_prefix_space;     /* ByteLevel pre-tokenizer prepends a space */
	struct kn_tok_pretok *pretok;
	size_t n_pretok;

	struct kn_tok_added *added;
	size_t n_added;
	/* Added tokens bucketed by first byte, longest first: [start, end) into
	 * added_order for each byte value. */
	uint32_t *added_order;
	uint32_t added_start[257];

	int32_t bos_id, eos_id, eot_id;
	char *bos_text;
	enum kn_chat_family chat;
	char *chat_system;        /* ChatML default system prompt, or NULL */
	int chat_think;           /* ChatML template splits <think> off replies (Qwen3) */
	int chat_gen_always;      /* template ends with the assistant header always */
	int chat_dated;           /* Llama 3.1+ template: dated system block */
	char chat_err[256];
};

#endif /* KN_TOK_INT_H */
