/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tokenizer kvferry-mkmodel writes: byte-level BPE in Hugging Face
 * tokenizer.json form (GPT-2 byte-to-character mapping), with merges learned
 * by plain BPE training on a short built-in corpus. Ties between equally
 * frequent pairs break on the pair's strings, so the same merges come out on
 * every machine.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_mkmodel.h"

static const char corpus[] =
	"The ferry leaves the north quay at seven in the morning and returns before the evening tide. "
	"Passengers carry bicycles, baskets of bread, letters for the island and news from the mainland. "
	"On calm days the crossing takes forty minutes; when the wind turns west it can take twice as long, "
	"and the captain keeps the engine slow so the cars on the lower deck do not shift. "
	"A ferry is a small promise kept many times: the same route, the same bell, the same rope thrown to the same post. "
	"Children learn the names of the buoys before they learn the names of the streets. "
	"In winter the boat runs three times a day, in summer six, and on the night of the harvest fair it runs until two. "
	"The engineer writes every departure in a book with a green cover, with the time, the weather and the number of people on board. "
	"Over the years the book has filled with small numbers that tell a long story about a town and its water. "
	"How many people crossed in 1998? What was the worst storm? Which day did the ferry carry the most cars? "
	"The answers are all there, in pencil, in a hand that changed three times as the engineers retired. "
	"Data moves the same way between machines: a request leaves one node, crosses a link, and arrives at another, "
	"where it is unpacked, checked and answered. If a packet is lost, it is sent again; if it arrives twice, "
	"the copy is dropped; if it arrives late, it waits in order until the ones before it are in. "
	"Models are served by splitting their layers into stages, each stage holding a range of layers, "
	"so that every stage works on a different group of requests at the same time. "
	"The first stage turns tokens into vectors, the middle stages transform them, and the last stage turns them back into tokens. "
	"Keys and values for each position are kept in pages, and a table says which page holds which positions for each sequence. "
	"When a sequence ends, its pages go back to the pool for the next request to use. "
	"Numbers such as 3, 14, 159, 2653 and 58979 appear in tests; so do words like alpha, beta, gamma and delta. "
	"She said: \"Don't forget the tickets!\" and he replied that he'd already packed them, along with the maps. "
	"It's a quiet trade, running a ferry, but nobody in town would want to live without it.\n"
	"def main():\n    print(\"hello, world\")\n    return 0\n";

/* GPT-2's byte -> code point map: printable Latin-1 bytes map to themselves,
 * the rest to 256 + n in byte order. `order` lists bytes in vocabulary order
 * (printables first), as GPT-2-style vocabularies number them. */
static void byte_map(uint32_t cp[256], int order[256])
{
	int n = 0, k = 0, in[256] = { 0 };
	for (int b = '!'; b <= '~'; b++)
		in[b] = 1;
	for (int b = 0xa1; b <= 0xac; b++)
		in[b] = 1;
	for (int b = 0xae; b <= 0xff; b++)
		in[b] = 1;
	for (int b = 0; b < 256; b++)
		if (in[b]) {
			cp[b] = (uint32_t)b;
			order[k++] = b;
		}
	for (int b = 0; b < 256; b++)
		if (!in[b]) {
			cp[b] = 256u + (uint32_t)n++;
			order[k++] = b;
		}
}

static char *utf8(uint32_t c)
{
	char *s = malloc(3);
	if (!s)
		return NULL;
	if (c < 0x80) {
		s[0] = (char)c;
		s[1] = 0;
	} else {
		s[0] = (char)(0xc0 | (c >> 6));
		s[1] = (char)(0x80 | (c & 0x3f));
		s[2] = 0;
	}
	return s;
}

struct word {
	int32_t *sym;
	int32_t n;
	int32_t count;
};

struct pair {
	int32_t a, b, c;
};

static int pair_cmp(const void *x, const void *y)
{
	const struct pair *p = x, *q = y;
	if (p->a != q->a)
		return p->a < q->a ? -1 : 1;
	return (p->b > q->b) - (p->b < q->b);
}

static int is_alpha(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}

static int vocab_add(struct kn_mk_vocab *v, char *tok, int32_t *cap)
{
	if (!tok)
		return -ENOMEM;
	if (v->n == *cap) {
		*cap = *cap ? 2 * *cap : 1024;
		char **t = realloc(v->tokens, (size_t)*cap * sizeof(*t));
		if (!t) {
			free(tok);
			return -ENOMEM;
		}
		v->tokens = t;
	}
	v->tokens[v->n++] = tok;
	return 0;
}

int kn_mk_vocab_build(struct kn_mk_vocab *v, int qwen, int32_t max_merges, int32_t min_vocab)
{
	uint32_t cp[256];
	int order[256], id_of_byte[256];
	int32_t cap = 0;
	struct word *w = NULL;
	struct pair *pairs = NULL;
	int32_t nw = 0, capw = 0;
	int rc = -ENOMEM;

	memset(v, 0, sizeof(*v));
	v->qwen = qwen;
	byte_map(cp, order);
	for (int i = 0; i < 256; i++) {
		id_of_byte[order[i]] = i;
		if (vocab_add(v, utf8(cp[order[i]]), &cap))
			goto out;
	}
	/* Pre-split the corpus: optional space + letters, digits, other runs. */
	const unsigned char *p = (const unsigned char *)corpus;
	while (*p) {
		const unsigned char *s = p;
		if (*p == ' ' && is_alpha(p[1]))
			p++;
		if (is_alpha(*p))
			while (is_alpha(*p))
				p++;
		else if (*p >= '0' && *p <= '9')
			while (*p >= '0' && *p <= '9')
				p++;
		else
			p++;
		int32_t len = (int32_t)(p - s), k;
		for (k = 0; k < nw; k++) {
			if (w[k].n != len)
				continue;
			int same = 1;
			for (int32_t i = 0; i < len && same; i++)
				same = w[k].sym[i] == id_of_byte[s[i]];
			if (same)
				break;
		}
		if (k < nw) {
			w[k].count++;
			continue;
		}
		if (nw == capw) {
			capw = capw ? 2 * capw : 256;
			struct word *nwp = realloc(w, (size_t)capw * sizeof(*w));
			if (!nwp)
				goto out;
			w = nwp;
		}
		w[nw].sym = malloc((size_t)len * sizeof(int32_t));
		if (!w[nw].sym)
			goto out;
		for (int32_t i = 0; i < len; i++)
			w[nw].sym[i] = id_of_byte[s[i]];
		w[nw].n = len;
		w[nw].count = 1;
		nw++;
	}
	v->merges = calloc((size_t)(max_merges > 0 ? max_merges : 1), sizeof(char *));
	pairs = malloc(sizeof(corpus) * sizeof(*pairs));
	if (!v->merges || !pairs)
		goto out;
	for (int32_t m = 0; m < max_merges; m++) {
		/* Count pairs: list every adjacent pair with its word's count, sort,
		 * and sum runs (a few thousand pairs per round). */
		int32_t np = 0, best_a = -1, best_b = -1, best_c = 0;
		for (int32_t k = 0; k < nw; k++)
			for (int32_t i = 0; i + 1 < w[k].n; i++)
				pairs[np++] = (struct pair){ w[k].sym[i], w[k].sym[i + 1], w[k].count };
		qsort(pairs, (size_t)np, sizeof(*pairs), pair_cmp);
		for (int32_t i = 0; i < np;) {
			int32_t a = pairs[i].a, b = pairs[i].b, c = 0;
			for (; i < np && pairs[i].a == a && pairs[i].b == b; i++)
				c += pairs[i].c;
			int better = c > best_c;
			if (c == best_c && c > 0) {
				int d = strcmp(v->tokens[a], v->tokens[best_a]);
				better = d < 0 || (d == 0 && strcmp(v->tokens[b], v->tokens[best_b]) < 0);
			}
			if (better) {
				best_a = a;
				best_b = b;
				best_c = c;
			}
		}
		if (best_c < 2)
			break; /* nothing left worth merging */
		size_t la = strlen(v->tokens[best_a]), lb = strlen(v->tokens[best_b]);
		char *tok = malloc(la + lb + 1), *mg = malloc(la + lb + 2);
		if (!tok || !mg) {
			free(tok);
			free(mg);
			goto out;
		}
		memcpy(tok, v->tokens[best_a], la);
		memcpy(tok + la, v->tokens[best_b], lb + 1);
		memcpy(mg, v->tokens[best_a], la);
		mg[la] = ' ';
		memcpy(mg + la + 1, v->tokens[best_b], lb + 1);
		v->merges[v->n_merges++] = mg;
		int32_t id = v->n;
		if (vocab_add(v, tok, &cap))
			goto out;
		for (int32_t k = 0; k < nw; k++) {
			int32_t o = 0;
			for (int32_t i = 0; i < w[k].n; i++) {
				if (i + 1 < w[k].n && w[k].sym[i] == best_a && w[k].sym[i + 1] == best_b) {
					w[k].sym[o++] = id;
					i++;
				} else {
					w[k].sym[o++] = w[k].sym[i];
				}
			}
			w[k].n = o;
		}
	}
	static const char *llama_sp[] = { "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
					   "<|end_header_id|>", "<|eot_id|>" };
	static const char *qwen_sp[] = { "<|endoftext|>", "<|im_start|>", "<|im_end|>" };
	const char **sp = qwen ? qwen_sp : llama_sp;
	int32_t nsp = qwen ? 3 : 5;
	char buf[64];
	for (int32_t r = 0; v->n + nsp < min_vocab; r++) {
		snprintf(buf, sizeof(buf), "<|reserved_%d|>", r);
		if (vocab_add(v, strdup(buf), &cap))
			goto out;
	}
	v->first_special = v->n;
	for (int32_t i = 0; i < nsp; i++)
		if (vocab_add(v, strdup(sp[i]), &cap))
			goto out;
	if (qwen) {
		v->bos = -1;
		v->eos = v->first_special;     /* <|endoftext|> */
		v->eot = v->first_special + 2; /* <|im_end|> */
	} else {
		v->bos = v->first_special;
		v->eos = v->first_special + 1;
		v->eot = v->first_special + 4;
	}
	rc = 0;
out:
	for (int32_t k = 0; k < nw; k++)
		free(w[k].sym);
	free(w);
	free(pairs);
	if (rc)
		kn_mk_vocab_free(v);
	return rc;
}

void kn_mk_vocab_free(struct kn_mk_vocab *v)
{
	for (int32_t i = 0; i < v->n; i++)
		free(v->tokens[i]);
	for (int32_t i = 0; i < v->n_merges; i++)
		free(v->merges[i]);
	free(v->tokens);
	free(v->merges);
	memset(v, 0, sizeof(*v));
}

/* Pre-tokenizer patterns of the two families (their published tokenizer.json). */
static const char llama3_pattern[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char qwen2_pattern[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char llama_template[] =
	"{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
	"'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
	"{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
static const char chatml_template[] =
	"{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
	"'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

static json_t *byte_level(int prefix, int regex)
{
	return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", prefix, "trim_offsets", 1,
			 "use_regex", regex);
}

int kn_mk_vocab_write(const struct kn_mk_vocab *v, const char *dir, int32_t max_len)
{
	char path[4096];
	int rc = -ENOMEM;
	json_t *root = NULL, *tc = NULL;
	json_t *added = json_array(), *vocab = json_object(), *merges = json_array();
	if (!added || !vocab || !merges)
		goto out;
	for (int32_t i = 0; i < v->first_special; i++)
		if (json_object_set_new(vocab, v->tokens[i], json_integer(i)))
			goto out;
	for (int32_t i = 0; i < v->n_merges; i++)
		if (json_array_append_new(merges, json_string(v->merges[i])))
			goto out;
	json_t *atd = json_object();
	if (!atd)
		goto out;
	for (int32_t i = v->first_special; i < v->n; i++) {
		json_t *a = json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", i, "content", v->tokens[i],
				      "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
		char key[16];
		snprintf(key, sizeof(key), "%d", i);
		json_object_set_new(atd, key, json_pack("{s:s, s:b, s:b, s:b, s:b, s:b}", "content", v->tokens[i],
							"single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
							"special", 1));
		json_array_append_new(added, a);
	}
	json_t *pre = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence", "pretokenizers", "type",
				"Split", "pattern", "Regex", v->qwen ? qwen2_pattern : llama3_pattern, "behavior",
				"Isolated", "invert", 0, byte_level(0, 0));
	json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
				  "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
				  "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges);
	vocab = merges = NULL;
	root = json_pack("{s:s, s:n, s:n, s:o, s:o, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation", "padding",
			 "added_tokens", added,
			 "normalizer", v->qwen ? json_pack("{s:s}", "type", "NFC") : json_null(),
			 "pre_tokenizer", pre, "post_processor", byte_level(1, 1), "decoder", byte_level(1, 1),
			 "model", model);
	added = NULL;
	if (!root) {
		json_decref(atd);
		goto out;
	}
	snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
	if (json_dump_file(root, path, JSON_PRESERVE_ORDER | JSON_INDENT(1))) {
		fprintf(stderr, "json_dump_file(%s) failed\n", path);
		rc = -EIO;
		json_decref(atd);
		goto out;
	}
	tc = json_pack("{s:o, s:s, s:o, s:s, s:i, s:s, s:b, s:b}",
		       "added_tokens_decoder", atd,
		       "chat_template", v->qwen ? chatml_template : llama_template,
		       "bos_token", v->bos >= 0 ? json_string(v->tokens[v->bos]) : json_null(),
		       "eos_token", v->tokens[v->eot],
		       "model_max_length", max_len, "tokenizer_class", "PreTrainedTokenizerFast",
		       "clean_up_tokenization_spaces", 0, "add_bos_token", v->bos >= 0);
	if (!tc)
		goto out;
	snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
	if (json_dump_file(tc, path, JSON_PRESERVE_ORDER | JSON_INDENT(1))) {
		fprintf(stderr, "json_dump_file(%s) failed\n", path);
		rc = -EIO;
		goto out;
	}
	rc = 0;
out:
	json_decref(tc);
	json_decref(root);
	json_decref(added);
	json_decref(vocab);
	json_decref(merges);
	return rc;
}
