/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private to the tokenizer: the layout of struct kn_tok and the calls its
 * files make on one another: kn_tok.c (open, close, accessors),
 * kn_tok_table.c (lookup tables), kn_tok_pretok.c (normalizer and
 * pre-tokenizer), kn_tok_encode.c, kn_tok_decode.c and kn_tok_chat.c (chat
 * templates). Never installed, never included outside kernels/kn_tok*.c and
 * their tests.
 */
#ifndef KN_TOK_INT_H
#define KN_TOK_INT_H

#include <stdint.h>
#include <stddef.h>

#include <jansson.h>

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
	int chat_think_switch;    /* ... and reads enable_thinking: false opens the answer with an
	                             empty <think> block (Qwen3) */
	int chat_tool_defs;       /* ChatML template lists `tools` in a <tools> block and writes
	                             tool calls as <tool_call> JSON (Qwen 2.5, 3) */
	int chat_tools;           /* ChatML: Qwen 2.5/3 tool turns; unknown roles refused */
	int chat_gen_always;      /* template ends with the assistant header always */
	int chat_dated;           /* Llama 3.1+ template: dated system block */
	int chat_today;           /* ... dated today (strftime_now, Llama 3.2) */
	char chat_err[512];       /* why kn_tok_apply_chat() says -ENOTSUP */
};

/* ---- chat templates (kn_tok_chat.c) ------------------------------------ */

/* Read the family and its variants off a chat template (NULL: none) and
 * reset every chat field of @p t to them: t->chat (KN_CHAT_UNKNOWN for a
 * template of no family we render), the flags, chat_system, eot_id and
 * chat_err, whose messages name @p origin (the file it came from). Returns
 * 0 or -ENOMEM. */
int kn_tok_chat_detect(struct kn_tok *t, const char *tmpl, const char *origin);

/* ---- lookup tables (kn_tok_table.c) ------------------------------------ */

/* FNV-1a of p[0..n), high bits folded in: the hash of the spelling and bytes
 * maps and of encode's per-call cache. */
uint64_t kn_tok_hash_bytes(const void *p, size_t n);

/* Fill spell_map (added tokens, then vocab_ids: the first id per spelling
 * wins) and bytes_map (vocab_ids only). Returns 0 or -ENOMEM. */
int kn_tok_build_maps(struct kn_tok *t, size_t n_vocab_ids, const int32_t *vocab_ids);

/* The model-vocab id whose raw bytes are s[0..n), or -1. */
int32_t kn_tok_bytes_lookup(const struct kn_tok *t, const char *s, size_t n);

/* An empty merge table sized for @p n merges. Returns 0 or -ENOMEM. */
int kn_tok_merges_alloc(struct kn_tok *t, size_t n);

/* Record merge (a, b) -> id at rank; a pair already present keeps its first
 * (lowest) rank. Returns 0. */
int kn_tok_merge_insert(struct kn_tok *t, int32_t a, int32_t b, int32_t rank, int32_t id);

/* The merge of the pair (a, b), or NULL when the pair does not merge. */
const struct kn_tok_merge *kn_tok_merge_find(const struct kn_tok *t, int32_t a, int32_t b);

/* ---- normalizer and pre-tokenizer (kn_tok_pretok.c) -------------------- */

/* Read tokenizer.json's "normalizer" (null, NFC or a Sequence of them) into
 * t->nfc. Returns 0 or -EINVAL with @p err naming the unsupported type. */
int kn_tok_load_normalizer(struct kn_tok *t, const json_t *n, char *err, size_t errlen);

/* Append the rules of one "pre_tokenizer" object (Sequence, Split,
 * ByteLevel) to t->pretok; @p first: it is the first pre-tokenizer, the
 * only place add_prefix_space is accepted. Returns 0, -ENOMEM, or -EINVAL
 * with @p err filled. */
int kn_tok_add_pretok(struct kn_tok *t, const json_t *pt, int first, char *err, size_t errlen);

/* One encode call's pre-tokenizer state, reused from segment to segment. */
struct kn_tok_pre {
	pcre2_match_data *md;
	struct kn_tok_buf seg;    /* normalised segment */
	uint32_t *pieces, *pieces2; /* (off, len) pairs */
	size_t np, pcap, pcap2;
};

/* Zero @p c and give it match data. Returns 0 or -ENOMEM. */
int kn_tok_pre_init(struct kn_tok_pre *c);

/* Release what kn_tok_pre_init() and kn_tok_pretokenize() allocated. */
void kn_tok_pre_free(struct kn_tok_pre *c);

/* Normalise s[0..n) (n > 0) into c->seg and split it into the pre-tokens
 * c->pieces[0 .. 2 * c->np), (offset, length) pairs into c->seg.p.
 * Returns 0, -ENOMEM, -EILSEQ (NFC refused the text) or -EINVAL (a regex
 * match failed). */
int kn_tok_pretokenize(const struct kn_tok *t, struct kn_tok_pre *c, const char *s, size_t n);

#endif /* KN_TOK_INT_H */
