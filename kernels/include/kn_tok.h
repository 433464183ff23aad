/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kn_tok.h
 * Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (plus
 * tokenizer_config.json for BOS/EOS and the chat template): added and special
 * tokens, the normalizer (none or NFC), the pre-tokenizer split regex (PCRE2
 * with Unicode properties), merges by rank, and the GPT-2 byte mapping.
 * Decoding is byte exact; a streaming decoder never emits a partial UTF-8
 * character. Chat prompts are rendered for the ChatML (Qwen) and Llama 3
 * header families, chosen from the chat_template string (or from a template
 * the caller gives: kn_tok_load_chat_template()).
 *
 * Threading: a kn_tok is read-only after kn_tok_open() and any
 * kn_tok_set_chat_template() / kn_tok_load_chat_template() call made before
 * it is shared; from then on any number of threads may encode, decode and
 * render chats with it at once. A kn_tok_stream belongs to one thread at a
 * time.
 */
#ifndef KN_TOK_H
#define KN_TOK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/** kn_tok_encode() flag: text spelling a special token becomes that token. */
#define KN_TOK_SPECIAL    0x1u
/** kn_tok_encode() flag: prepend the BOS token when the tokenizer has one. */
#define KN_TOK_ADD_BOS    0x2u
/** kn_tok_decode() / kn_tok_stream_new() flag: drop special tokens. */
#define KN_TOK_SKIP_SPECIAL 0x4u

/** Chat template families kn_tok_apply_chat() renders. */
enum kn_chat_family {
	KN_CHAT_NONE = 0,   /**< no chat_template in tokenizer_config.json */
	KN_CHAT_CHATML = 1, /**< ChatML, Qwen: <|im_start|>role\n...<|im_end|>\n */
	KN_CHAT_LLAMA3 = 2, /**< <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
	KN_CHAT_UNKNOWN = 3, /**< a chat_template of no family above: not rendered */
};

/**
 * One chat message; both strings are UTF-8 and NUL-terminated. Roles are
 * the template's: "system", "user", "assistant", and "tool" (Qwen 2.5/3: a
 * tool result in a user turn; Llama 3.1+: an ipython turn, as "ipython");
 * a template that writes every message as it comes (plain ChatML, Llama 3.0)
 * takes any role.
 */
struct kn_chat_msg {
	const char *role;
	const char *content;
	const struct kn_chat_call *calls; /**< an assistant turn's tool calls (may be NULL) */
	size_t n_calls;
};

/** A tool call of an assistant turn: the function's name and its arguments
 *  as JSON text (an object; written again as the template's tojson would). */
struct kn_chat_call {
	const char *name;
	const char *arguments;
};

struct kn_tok;
struct kn_tok_stream;

/**
 * Open the tokenizer of a model directory (tokenizer.json, and
 * tokenizer_config.json when present; a chat_template.jinja beside them
 * replaces the config's chat_template, as in transformers).
 * @param model_dir  directory holding tokenizer.json
 * @param err        receives a message naming the problem and the fix
 * @param errlen     size of @p err
 * @return the tokenizer, or NULL with errno set: ENOENT (no tokenizer.json),
 *         EINVAL (malformed JSON, unsupported model/normalizer/pre-tokenizer
 *         type, bad regex, merge naming a token missing from the vocab,
 *         chat_template.jinja not UTF-8), EACCES/EIO (chat_template.jinja
 *         unreadable), ENOMEM; @p err is filled.
 */
struct kn_tok *kn_tok_open(const char *model_dir, char *err, size_t errlen);

/**
 * Open a tokenizer from explicit file paths.
 * @param json_path    path of tokenizer.json
 * @param config_path  path of tokenizer_config.json, or NULL for none
 * @param err          receives a message on failure
 * @param errlen       size of @p err
 * @return as kn_tok_open().
 */
struct kn_tok *kn_tok_open_file(const char *json_path, const char *config_path,
				char *err, size_t errlen);

/**
 * Open a tokenizer from the text of its files, already in memory (a model
 * read from elsewhere than a directory; the fuzz targets). Messages name the
 * files "tokenizer.json" and "tokenizer_config.json".
 * @param json        the bytes of tokenizer.json (need not be NUL-terminated)
 * @param len         their number
 * @param config      the bytes of tokenizer_config.json, or NULL for none
 * @param config_len  their number
 * @param err         receives a message on failure
 * @param errlen      size of @p err
 * @return the tokenizer, or NULL with errno set: EINVAL (as kn_tok_open(),
 *         NULL @p json), ENOMEM; @p err is filled.
 */
struct kn_tok *kn_tok_open_buf(const char *json, size_t len, const char *config, size_t config_len,
			       char *err, size_t errlen);

/** Free a tokenizer; NULL is a no-op. No encode may be running on it. */
void kn_tok_close(struct kn_tok *tok);

/**
 * Encode UTF-8 text into token ids.
 * @param tok    the tokenizer
 * @param text   UTF-8 text (need not be NUL-terminated)
 * @param len    bytes in @p text
 * @param flags  KN_TOK_SPECIAL, KN_TOK_ADD_BOS
 * @param ids    receives a malloc'd array (free() it); NULL when *n is 0
 * @param n      receives the number of ids
 * @return 0, -EILSEQ (text is not valid UTF-8), -ENOMEM, or -EINVAL (NULL
 *         argument, or the pre-tokenizer regex failed to match, e.g. its
 *         backtracking limit).
 */
int kn_tok_encode(const struct kn_tok *tok, const char *text, size_t len,
		  unsigned flags, int32_t **ids, size_t *n);

/**
 * Decode ids to text. Bytes that do not form valid UTF-8 become U+FFFD, as
 * Hugging Face tokenizers do.
 * @param tok    the tokenizer
 * @param ids    token ids
 * @param n      number of ids
 * @param flags  KN_TOK_SKIP_SPECIAL
 * @param out    receives a malloc'd NUL-terminated string (free() it)
 * @param len    receives its length without the NUL (may be NULL)
 * @return 0, -ERANGE (an id outside the vocabulary), -ENOMEM, -EINVAL.
 */
int kn_tok_decode(const struct kn_tok *tok, const int32_t *ids, size_t n,
		  unsigned flags, char **out, size_t *len);

/**
 * The raw bytes a token stands for (byte mapping undone).
 * @param tok  the tokenizer
 * @param id   token id
 * @param len  receives the number of bytes
 * @return the bytes (not NUL-terminated; valid until close), or NULL for an
 *         id outside the vocabulary.
 */
const char *kn_tok_token_bytes(const struct kn_tok *tok, int32_t id, size_t *len);

/**
 * Start a streaming decoder: tokens pushed one at a time come out as text
 * that is always whole UTF-8 characters.
 * @param tok    the tokenizer (must outlive the stream)
 * @param flags  KN_TOK_SKIP_SPECIAL
 * @return the stream, or NULL with errno ENOMEM/EINVAL.
 */
struct kn_tok_stream *kn_tok_stream_new(const struct kn_tok *tok, unsigned flags);

/**
 * Push one token; write the text that is now complete. A character whose
 * bytes are split across tokens is held back until its last byte arrives;
 * bytes that can never form a character come out as U+FFFD.
 * @param st   the stream
 * @param id   token id
 * @param buf  output buffer (not NUL-terminated)
 * @param cap  its size; kn_tok_max_token_bytes() + 8 is always enough
 * @return bytes written, -ENOBUFS (@p cap too small; nothing consumed),
 *         -ERANGE (id outside the vocabulary), -EINVAL.
 */
ssize_t kn_tok_stream_push(struct kn_tok_stream *st, int32_t id, char *buf, size_t cap);

/**
 * End the stream: a held-back partial character comes out as U+FFFD and the
 * stream is ready for a new sequence.
 * @param st   the stream
 * @param buf  output buffer
 * @param cap  its size (4 is always enough)
 * @return bytes written, -ENOBUFS, -EINVAL.
 */
ssize_t kn_tok_stream_flush(struct kn_tok_stream *st, char *buf, size_t cap);

/** Free a stream; NULL is a no-op. */
void kn_tok_stream_free(struct kn_tok_stream *st);

/** @return the number of ids (one past the largest id, added tokens included). */
int32_t kn_tok_vocab_size(const struct kn_tok *tok);

/** @return the longest byte string any token decodes to. */
size_t kn_tok_max_token_bytes(const struct kn_tok *tok);

/**
 * Look a token up by its tokenizer.json spelling (byte-mapped, e.g. "Ġthe",
 * or an added token's content, e.g. "<|im_end|>").
 * @return its id, or -1 if absent.
 */
int32_t kn_tok_token_to_id(const struct kn_tok *tok, const char *token);

/** @return 1 if @p id is a special added token, else 0. */
int kn_tok_is_special(const struct kn_tok *tok, int32_t id);

/** @return the BOS id from tokenizer_config.json, or -1 if none. */
int32_t kn_tok_bos_id(const struct kn_tok *tok);

/**
 * End-of-sequence ids: the configured eos_token, then the chat family's
 * end-of-turn token (<|im_end|>, <|eot_id|>) when distinct.
 * @param tok  the tokenizer
 * @param out  receives up to @p cap ids
 * @param cap  capacity of @p out
 * @return the number of EOS ids (may exceed @p cap).
 */
size_t kn_tok_eos_ids(const struct kn_tok *tok, int32_t *out, size_t cap);

/** @return the chat template family detected at open (or set since). */
enum kn_chat_family kn_tok_chat_family(const struct kn_tok *tok);

/**
 * Replace the chat template read from tokenizer_config.json, e.g. with one
 * an operator gives; its family is read off the text as at open, and the
 * chat family's end-of-turn id (kn_tok_eos_ids()) follows it.
 * Threading: only before @p tok is shared with other threads.
 * @param tok     the tokenizer
 * @param tmpl    the Jinja template text, or NULL for none (chat is then
 *                refused as for a model without a template)
 * @param origin  where it came from (a path), named in kn_tok_chat_error()
 * @return 0 — also for a template of an unknown family, which
 *         kn_tok_chat_family() then reports as KN_CHAT_UNKNOWN —, -EINVAL
 *         (NULL @p tok), -ENOMEM.
 */
int kn_tok_set_chat_template(struct kn_tok *tok, const char *tmpl, const char *origin);

/**
 * kn_tok_set_chat_template() with a template read from a file: Jinja text,
 * or a JSON object with a "chat_template" string (a tokenizer_config.json).
 * Threading: only before @p tok is shared with other threads.
 * @param tok     the tokenizer
 * @param path    the file
 * @param err     receives a message naming the file and the problem
 * @param errlen  size of @p err
 * @return 0, -errno of fopen() (ENOENT, EACCES, ...), -EIO, -EINVAL (not
 *         UTF-8 text, or JSON without a chat_template string), -ENOMEM.
 */
int kn_tok_load_chat_template(struct kn_tok *tok, const char *path, char *err, size_t errlen);

/**
 * Render a conversation as the model's chat template would (byte for byte
 * what transformers' apply_chat_template renders with it).
 * @param tok                    the tokenizer
 * @param msgs                   messages in order
 * @param n                      number of messages
 * @param add_generation_prompt  nonzero: end with the assistant header
 * @param out                    receives a malloc'd NUL-terminated prompt;
 *                               encode it with KN_TOK_SPECIAL
 * @return 0, -ENOTSUP (no chat template, or one of an unknown family: the
 *         message is available from kn_tok_chat_error()), -EINVAL (NULL
 *         argument, or — Qwen 2.5/3 templates — a role other than system,
 *         user, assistant and tool, which the template would silently drop),
 *         -ENOMEM.
 */
int kn_tok_apply_chat(const struct kn_tok *tok, const struct kn_chat_msg *msgs,
		      size_t n, int add_generation_prompt, char **out);

/** kn_tok_apply_chat_flags(): end with the assistant header (add_generation_prompt). */
#define KN_CHAT_GEN 0x1u
/** kn_tok_apply_chat_flags(): enable_thinking false (a chat_template_kwargs key):
 *  a template that reads it (Qwen 3) opens the answer with an empty
 *  <think></think> block, so the model answers without reasoning; the
 *  others ignore it, as their Jinja does. */
#define KN_CHAT_NO_THINKING 0x2u

/** kn_tok_apply_chat() with KN_CHAT_* @p flags. */
int kn_tok_apply_chat_flags(const struct kn_tok *tok, const struct kn_chat_msg *msgs, size_t n, unsigned flags,
			    char **out);

/**
 * kn_tok_apply_chat_flags() with tools: @p tools_json, a JSON array of the
 * tool definitions as an OpenAI client sends them ({"type": "function",
 * "function": {...}}), rendered as the template renders its `tools`
 * (each through tojson), and the messages' tool calls. NULL: none; "[]"
 * is none to the Qwen templates and an empty list to the Llama ones, as in
 * their Jinja.
 * @return as kn_tok_apply_chat(), and -ENOTSUP (kn_tok_chat_error() says
 *         why) for tools or tool calls on a template that kvferry does not
 *         render them for (Qwen 2.5 and 3, Llama 3.1+ only), -EBADMSG for tools or
 *         arguments that are not JSON of the right shape.
 */
int kn_tok_apply_chat_tools(const struct kn_tok *tok, const struct kn_chat_msg *msgs, size_t n,
			    const char *tools_json, unsigned flags, char **out);

/** @return 1 when the chat template renders tools (kn_tok_apply_chat_tools()). */
int kn_tok_chat_has_tools(const struct kn_tok *tok);

/** How the template's model writes a tool call: 0 none (no tools), 1
 *  <tool_call>{"name", "arguments"}</tool_call> (Qwen 2.5/3, hermes), 2 a
 *  bare {"name", "parameters"} JSON object (Llama 3.1+). */
int kn_tok_chat_tool_style(const struct kn_tok *tok);

/** @return why kn_tok_apply_chat() returns -ENOTSUP, or "" when it does not. */
const char *kn_tok_chat_error(const struct kn_tok *tok);

#ifdef __cplusplus
}
#endif
#endif /* KN_TOK_H */
