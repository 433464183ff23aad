/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-mkmodel: write a complete Hugging Face model directory with
 * deterministic random weights (config.json, generation_config.json,
 * safetensors — sharded with an index past --shard-mb — tokenizer.json and
 * tokenizer_config.json). No weights can be downloaded where kvferry is
 * built, so the real loader and engines are tested on these.
 *
 * Weights stream to disk a chunk at a time: an 8B preset never sits in RAM.
 *
 * Init: projections N(0, 1/fan_in) so every layer's output has unit scale
 * and the residual stream keeps changing with context; embeddings N(0, 1)
 * (N(0, 1/hidden) when tied, see below);
 * norm weights 1 + N(0, 0.1) so a missing norm multiply is caught by the
 * reference test. With N(0, 0.02) everywhere the residual stays dominated by
 * the input embedding and greedy decoding repeats one token.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kn_mkmodel.h"
#include "kvf_config.h"
#include "kn_model.h"
#include "kn_stage_impl.h"

struct preset {
	const char *name;
	const char *arch;
	int32_t hidden, inter, layers, heads, kv_heads, head_dim, vocab, max_pos;
	int tie;
	int rope_llama3; /* Llama 3.1 style scaling */
	float rope_factor, theta;
};

/* vocab 0: the generated tokenizer's own size. Full-size shapes follow the
 * published configs of the models they are named after. */
static const struct preset presets[] = {
	{ "tiny", "llama", 64, 128, 3, 4, 2, 16, 0, 2048, 0, 0, 0, 10000.0f },
	{ "small", "llama", 512, 1408, 16, 8, 4, 64, 0, 4096, 0, 0, 0, 500000.0f },
	/* hidden above 512 and gate_up and the LM head of more than four rows
	 * an input: the CUDA engine's one-chain family (gemm_wg.cu) checks on
	 * it, a chain over two 512-k windows */
	{ "medium", "llama", 768, 2048, 4, 12, 4, 64, 4000, 4096, 0, 0, 0, 500000.0f },
	{ "llama3-1b", "llama", 2048, 8192, 16, 32, 8, 64, 128256, 131072, 1, 1, 32.0f, 500000.0f },
	{ "llama3-3b", "llama", 3072, 8192, 28, 24, 8, 128, 128256, 131072, 1, 1, 32.0f, 500000.0f },
	{ "llama3-8b", "llama", 4096, 14336, 32, 32, 8, 128, 128256, 131072, 0, 1, 8.0f, 500000.0f },
	{ "qwen2.5-0.5b", "qwen2", 896, 4864, 24, 14, 2, 64, 151936, 32768, 1, 0, 0, 1000000.0f },
	{ "qwen2.5-7b", "qwen2", 3584, 18944, 28, 28, 4, 128, 152064, 32768, 0, 0, 0, 1000000.0f },
	{ "qwen3-0.6b", "qwen3", 1024, 3072, 28, 16, 8, 128, 151936, 40960, 1, 0, 0, 1000000.0f },
	{ "qwen3-8b", "qwen3", 4096, 12288, 36, 32, 8, 128, 151936, 40960, 0, 0, 0, 1000000.0f },
};

struct tdesc {
	char name[96];
	int32_t nd;
	int64_t shape[2];
	float std, mean;
	size_t bytes;
	int shard;
	size_t off;
};

static uint64_t splitmix(uint64_t *s)
{
	uint64_t x = (*s += 0x9e3779b97f4a7c15ull);
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static double unif(uint64_t *s)
{
	return ((double)(splitmix(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvferry-mkmodel --out DIR [--preset NAME] [--arch llama|qwen2|qwen3] [--dtype bf16|f16|f32]\n"
		"                       [--seed N] [--tie|--no-tie] [--rope-scaling|--no-rope-scaling] [--layers N]\n"
		"                       [--config-style 4|5] [--tokenizer FILE] [--shard-mb N] [--merges N] [--embed-std S]\n"
		"presets:");
	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
		fprintf(f, " %s", presets[i].name);
	fprintf(f, "\n");
}

static const char *dt_st(enum kn_dtype d)
{
	return d == KN_DT_F32 ? "F32" : d == KN_DT_F16 ? "F16" : "BF16";
}

static uint16_t f32_to_f16(float f)
{
	/* Round to nearest even through the hardware-free path: fine for init. */
	union { float f; uint32_t u; } v = { .f = f };
	uint32_t sign = (v.u >> 16) & 0x8000u;
	float a = fabsf(f);
	if (a >= 65520.0f)
		return (uint16_t)(sign | 0x7c00u);
	if (a < 6.103515625e-05f)
		return (uint16_t)(sign | (uint16_t)lrintf(a * 16777216.0f));
	int e;
	float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
	uint32_t man = (uint32_t)lrintf((m * 2.0f - 1.0f) * 1024.0f);
	int32_t ex = e - 1 + 15;
	if (man == 1024) {
		man = 0;
		ex++;
	}
	return (uint16_t)(sign | ((uint32_t)ex << 10) | man);
}

/* Chunks of CH elements, each drawn from its own stream keyed by (tensor,
 * chunk): the bytes do not depend on how many threads fill them. One batch
 * of MK_BATCH chunks is filled by MK_THREADS threads, then written. Measured:
 * llama3-1b 52 s single-threaded on the 2-vCPU build machine. */
enum { CH = 1 << 16, MK_BATCH = 64, MK_THREADS = 16 };

struct fill_job {
	const struct tdesc *t;
	enum kn_dtype dt;
	uint64_t st;
	int64_t n, first_chunk, n_chunks;
	uint8_t *out;      /* [MK_BATCH][CH * 4] */
	int next;          /* chunk index within the batch, claimed atomically */
};

static void fill_chunk(const struct fill_job *j, int64_t ci, uint8_t *out)
{
	uint64_t st = j->st ^ (0x9e3779b97f4a7c15ull * (uint64_t)(ci + 1));
	int64_t base = ci * CH, c = j->n - base < CH ? j->n - base : CH;
	for (int64_t i = 0; i < c; i += 2) {
		double u1 = unif(&st), u2 = unif(&st), r = sqrt(-2.0 * log(u1));
		float v[2] = { j->t->mean + j->t->std * (float)(r * cos(2 * M_PI * u2)),
			       j->t->mean + j->t->std * (float)(r * sin(2 * M_PI * u2)) };
		for (int k = 0; k < 2 && i + k < c; k++) {
			if (j->dt == KN_DT_F32) {
				memcpy(out + 4 * (i + k), &v[k], 4);
			} else {
				uint16_t h = j->dt == KN_DT_BF16 ? kn_f32_to_bf16(v[k]) : f32_to_f16(v[k]);
				memcpy(out + 2 * (i + k), &h, 2);
			}
		}
	}
}

static void *fill_thread(void *arg)
{
	struct fill_job *j = arg;
	int k;
	while ((k = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->n_chunks)
		fill_chunk(j, j->first_chunk + k, j->out + (size_t)k * CH * 4);
	return NULL;
}

static int write_tensor(FILE *f, const struct tdesc *t, enum kn_dtype dt, uint64_t seed)
{
	static uint8_t *out;
	uint64_t h = 0xcbf29ce484222325ull;
	for (const char *p = t->name; *p; p++)
		h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
	struct fill_job j = { .t = t, .dt = dt, .st = seed * 0x2545f4914f6cdd1dull ^ h,
			      .n = t->shape[0] * (t->nd > 1 ? t->shape[1] : 1) };
	const size_t esz = dt == KN_DT_F32 ? 4 : 2;
	const int64_t chunks = (j.n + CH - 1) / CH;
	long nproc = sysconf(_SC_NPROCESSORS_ONLN);
	int nt = nproc < 1 ? 1 : nproc > MK_THREADS ? MK_THREADS : (int)nproc;
	if (!out && !(out = malloc((size_t)MK_BATCH * CH * 4)))
		return -ENOMEM;
	j.out = out;
	for (int64_t c0 = 0; c0 < chunks; c0 += MK_BATCH) {
		pthread_t th[MK_THREADS];
		int started = 0;
		j.first_chunk = c0;
		j.n_chunks = chunks - c0 < MK_BATCH ? chunks - c0 : MK_BATCH;
		j.next = 0;
		for (int i = 1; i < nt && i < j.n_chunks; i++)
			if (pthread_create(&th[started], NULL, fill_thread, &j) == 0)
				started++;
		fill_thread(&j);
		for (int i = 0; i < started; i++)
			pthread_join(th[i], NULL);
		int64_t last = c0 + j.n_chunks == chunks ? j.n - (chunks - 1) * CH : CH;
		size_t nb = ((size_t)(j.n_chunks - 1) * CH + (size_t)last) * esz;
		/* chunks sit CH * 4 bytes apart; pack them for the write */
		for (int64_t k = 1; k < j.n_chunks && esz < 4; k++)
			memmove(out + (size_t)k * CH * esz, out + (size_t)k * CH * 4, (size_t)CH * esz);
		if (fwrite(out, 1, nb, f) != nb)
			return -EIO;
	}
	return 0;
}

static int dump(json_t *j, const char *dir, const char *file)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	if (!j || json_dump_file(j, path, JSON_PRESERVE_ORDER | JSON_INDENT(2) | JSON_REAL_PRECISION(9))) {
		fprintf(stderr, "kvferry-mkmodel: writing %s failed\n", path);
		json_decref(j);
		return -EIO;
	}
	json_decref(j);
	return 0;
}

/* Special ids from a copied tokenizer.json's added_tokens. */
static int32_t find_added(json_t *tok, const char *content)
{
	size_t i;
	json_t *a;
	json_array_foreach(json_object_get(tok, "added_tokens"), i, a)
		if (json_is_string(json_object_get(a, "content"))
		    && !strcmp(json_string_value(json_object_get(a, "content")), content))
			return (int32_t)json_integer_value(json_object_get(a, "id"));
	return -1;
}

static int copy_file(const char *from, const char *dir, const char *name)
{
	char path[4096], buf[1 << 16];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *in = fopen(from, "rb"), *out = in ? fopen(path, "wb") : NULL;
	size_t n;
	int rc = 0;
	if (!in || !out) {
		fprintf(stderr, "kvferry-mkmodel: copying %s to %s failed: %s\n", from, path, strerror(errno));
		rc = -EIO;
	}
	while (!rc && (n = fread(buf, 1, sizeof(buf), in)) > 0)
		if (fwrite(buf, 1, n, out) != n)
			rc = -EIO;
	if (in)
		fclose(in);
	if (out && fclose(out))
		rc = -EIO;
	return rc;
}

int main(int argc, char **argv)
{
	const char *out = NULL, *preset_name = "tiny", *arch = NULL, *tok_file = NULL;
	enum kn_dtype dt = KN_DT_BF16;
	uint64_t seed = 1;
	int tie = -1, rope = -1, layers = -1, style = 5, merges = -1;
	long shard_mb = 4096;
	double embed_std = 0;
	static const struct option lo[] = {
		{ "out", required_argument, 0, 'o' }, { "preset", required_argument, 0, 'p' },
		{ "arch", required_argument, 0, 'a' }, { "dtype", required_argument, 0, 'd' },
		{ "seed", required_argument, 0, 's' }, { "tie", no_argument, 0, 'T' },
		{ "no-tie", no_argument, 0, 'N' }, { "rope-scaling", no_argument, 0, 'R' },
		{ "no-rope-scaling", no_argument, 0, 'r' }, { "layers", required_argument, 0, 'l' },
		{ "config-style", required_argument, 0, 'c' }, { "tokenizer", required_argument, 0, 't' },
		{ "shard-mb", required_argument, 0, 'm' }, { "merges", required_argument, 0, 'M' },
		{ "embed-std", required_argument, 0, 'e' },
		{ "help", no_argument, 0, 'h' }, { "version", no_argument, 0, 'V' }, { 0, 0, 0, 0 }
	};
	int ch;
	while ((ch = getopt_long(argc, argv, "o:p:a:d:s:h", lo, NULL)) != -1) {
		switch (ch) {
		case 'o': out = optarg; break;
		case 'p': preset_name = optarg; break;
		case 'a': arch = optarg; break;
		case 'd':
			if (!strcmp(optarg, "bf16"))
				dt = KN_DT_BF16;
			else if (!strcmp(optarg, "f16"))
				dt = KN_DT_F16;
			else if (!strcmp(optarg, "f32"))
				dt = KN_DT_F32;
			else {
				fprintf(stderr, "kvferry-mkmodel: --dtype %s: use bf16, f16 or f32\n", optarg);
				return 2;
			}
			break;
		case 's': seed = strtoull(optarg, NULL, 0); break;
		case 'T': tie = 1; break;
		case 'N': tie = 0; break;
		case 'R': rope = 1; break;
		case 'r': rope = 0; break;
		case 'l': layers = atoi(optarg); break;
		case 'c': style = atoi(optarg); break;
		case 't': tok_file = optarg; break;
		case 'm': shard_mb = atol(optarg); break;
		case 'M': merges = atoi(optarg); break;
		case 'e': embed_std = atof(optarg); break;
		case 'h': usage(stdout); return 0;
		case 'V': printf("kvferry-mkmodel %s\n", KVF_VERSION); return 0;
		default: usage(stderr); return 2;
		}
	}
	const struct preset *p = NULL;
	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
		if (!strcmp(presets[i].name, preset_name))
			p = &presets[i];
	if (!out || !p || shard_mb < 1 || (style != 4 && style != 5)) {
		fprintf(stderr, "kvferry-mkmodel: need --out DIR and a known --preset (got \"%s\"); --shard-mb >= 1; --config-style 4 or 5\n",
			preset_name);
		usage(stderr);
		return 2;
	}
	if (!arch)
		arch = p->arch;
	int qwen2 = !strcmp(arch, "qwen2"), qwen3 = !strcmp(arch, "qwen3");
	if (!qwen2 && !qwen3 && strcmp(arch, "llama")) {
		fprintf(stderr, "kvferry-mkmodel: --arch %s: use llama, qwen2 or qwen3\n", arch);
		return 2;
	}
	struct preset P = *p;
	if (tie >= 0)
		P.tie = tie;
	if (rope >= 0) {
		P.rope_llama3 = rope;
		if (rope && P.rope_factor == 0)
			P.rope_factor = 8.0f;
	}
	if (layers > 0)
		P.layers = layers;
	if (mkdir(out, 0755) && errno != EEXIST) {
		fprintf(stderr, "kvferry-mkmodel: mkdir(%s) failed: %s\n", out, strerror(errno));
		return 1;
	}

	/* Tokenizer first: its size is the vocab of the small presets. */
	struct kn_mk_vocab v = { 0 };
	int32_t bos = -1, eos = -1, eot = -1;
	if (tok_file) {
		json_error_t je;
		json_t *tj = json_load_file(tok_file, 0, &je);
		if (!tj) {
			fprintf(stderr, "kvferry-mkmodel: --tokenizer %s: %s (line %d)\n", tok_file, je.text, je.line);
			return 1;
		}
		int32_t maxid = (int32_t)json_object_size(json_object_get(json_object_get(tj, "model"), "vocab")) - 1;
		size_t i;
		json_t *a;
		json_array_foreach(json_object_get(tj, "added_tokens"), i, a)
			if (json_integer_value(json_object_get(a, "id")) > maxid)
				maxid = (int32_t)json_integer_value(json_object_get(a, "id"));
		bos = find_added(tj, "<|begin_of_text|>");
		eos = find_added(tj, "<|end_of_text|>");
		eot = find_added(tj, "<|eot_id|>");
		if (eos < 0)
			eos = find_added(tj, "<|endoftext|>");
		if (eot < 0)
			eot = find_added(tj, "<|im_end|>");
		json_decref(tj);
		if (P.vocab < maxid + 1)
			P.vocab = maxid + 1;
		if (copy_file(tok_file, out, "tokenizer.json"))
			return 1;
		char cfgp[4096];
		snprintf(cfgp, sizeof(cfgp), "%.*s/tokenizer_config.json",
			 (int)(strrchr(tok_file, '/') ? strrchr(tok_file, '/') - tok_file : 1),
			 strrchr(tok_file, '/') ? tok_file : ".");
		FILE *probe = fopen(cfgp, "r");
		if (probe) {
			fclose(probe);
			if (copy_file(cfgp, out, "tokenizer_config.json"))
				return 1;
		}
	} else {
		int32_t nm = merges >= 0 ? merges : !strcmp(P.name, "tiny") ? 220 : 4000;
		if (kn_mk_vocab_build(&v, qwen2 || qwen3, nm, P.vocab)) {
			fprintf(stderr, "kvferry-mkmodel: out of memory building the tokenizer\n");
			return 1;
		}
		P.vocab = v.n;
		bos = v.bos;
		eos = v.eos;
		eot = v.eot;
		int rc = kn_mk_vocab_write(&v, out, P.max_pos);
		kn_mk_vocab_free(&v);
		if (rc)
			return 1;
	}

	/* config.json: transformers 5 spelling (dtype, rope_parameters) or 4's
	 * (torch_dtype, rope_theta + rope_scaling). */
	const char *dtname = dt == KN_DT_F32 ? "float32" : dt == KN_DT_F16 ? "float16" : "bfloat16";
	json_t *cfg = json_object();
	json_object_set_new(cfg, "architectures", json_pack("[s]", qwen3 ? "Qwen3ForCausalLM" : qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
	json_object_set_new(cfg, "attention_bias", json_boolean(qwen2));
	json_object_set_new(cfg, "attention_dropout", json_real(0.0));
	json_object_set_new(cfg, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
	json_object_set_new(cfg, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null());
	json_object_set_new(cfg, "head_dim", json_integer(P.head_dim));
	json_object_set_new(cfg, "hidden_act", json_string("silu"));
	json_object_set_new(cfg, "hidden_size", json_integer(P.hidden));
	json_object_set_new(cfg, "initializer_range", json_real(0.02));
	json_object_set_new(cfg, "intermediate_size", json_integer(P.inter));
	json_object_set_new(cfg, "max_position_embeddings", json_integer(P.max_pos));
	if (!qwen2 && !qwen3)
		json_object_set_new(cfg, "mlp_bias", json_false());
	json_object_set_new(cfg, "model_type", json_string(qwen3 ? "qwen3" : qwen2 ? "qwen2" : "llama"));
	json_object_set_new(cfg, "num_attention_heads", json_integer(P.heads));
	json_object_set_new(cfg, "num_hidden_layers", json_integer(P.layers));
	json_object_set_new(cfg, "num_key_value_heads", json_integer(P.kv_heads));
	json_object_set_new(cfg, "rms_norm_eps", json_real(1e-6));
	json_t *rs = P.rope_llama3
		? json_pack("{s:f, s:f, s:f, s:i, s:s}", "factor", (double)P.rope_factor, "low_freq_factor", 1.0,
			    "high_freq_factor", 4.0, "original_max_position_embeddings", 8192, "rope_type", "llama3")
		: NULL;
	if (style == 5) {
		json_t *rp = rs ? rs : json_pack("{s:s}", "rope_type", "default");
		json_object_set_new(rp, "rope_theta", json_real(P.theta));
		json_object_set_new(cfg, "rope_parameters", rp);
		json_object_set_new(cfg, "dtype", json_string(dtname));
	} else {
		json_object_set_new(cfg, "rope_scaling", rs ? rs : json_null());
		json_object_set_new(cfg, "rope_theta", json_real(P.theta));
		json_object_set_new(cfg, "torch_dtype", json_string(dtname));
	}
	if (qwen2 || qwen3) {
		json_object_set_new(cfg, "use_sliding_window", json_false());
		json_object_set_new(cfg, "sliding_window", json_null());
		json_object_set_new(cfg, "max_window_layers", json_integer(P.layers));
	}
	json_object_set_new(cfg, "tie_word_embeddings", json_boolean(P.tie));
	json_object_set_new(cfg, "transformers_version", json_string(style == 5 ? "5.0.0" : "4.51.3"));
	json_object_set_new(cfg, "use_cache", json_true());
	json_object_set_new(cfg, "vocab_size", json_integer(P.vocab));
	if (dump(cfg, out, "config.json"))
		return 1;
	json_t *gen = json_pack("{s:b, s:o, s:[], s:s}", "do_sample", 0, "bos_token_id",
				bos >= 0 ? json_integer(bos) : json_null(), "eos_token_id", "transformers_version",
				"4.51.3");
	if (eos >= 0)
		json_array_append_new(json_object_get(gen, "eos_token_id"), json_integer(eos));
	if (eot >= 0 && eot != eos)
		json_array_append_new(json_object_get(gen, "eos_token_id"), json_integer(eot));
	if (dump(gen, out, "generation_config.json"))
		return 1;

	/* Tensor list, then shard assignment. */
	size_t esz = dt == KN_DT_F32 ? 4 : 2;
	size_t cap = 3 + (size_t)P.layers * 14, nt = 0;
	struct tdesc *t = calloc(cap, sizeof(*t));
	if (!t)
		return 1;
	int64_t H = P.hidden, Q = (int64_t)P.heads * P.head_dim, KV = (int64_t)P.kv_heads * P.head_dim;
#define ADD(nm, d0, d1, sd, mn)                                                                        \
	do {                                                                                           \
		struct tdesc *x = &t[nt++];                                                            \
		snprintf(x->name, sizeof(x->name), "%s", nm);                                          \
		x->nd = (d1) ? 2 : 1;                                                                  \
		x->shape[0] = (d0);                                                                    \
		x->shape[1] = (d1);                                                                    \
		x->std = (float)(sd);                                                                  \
		x->mean = (float)(mn);                                                                 \
		x->bytes = (size_t)(d0) * (size_t)((d1) ? (d1) : 1) * esz;                             \
	} while (0)
	char nm[96];
	/* A tied head scores the hidden state against the embeddings: at std 1
	 * the input token's own embedding dominates the residual and greedy
	 * decoding repeats it forever (measured: 1 distinct token of 64 on the
	 * tiny preset); at 1/sqrt(H) the layers' outputs dominate (40-55 of 64). */
	ADD("model.embed_tokens.weight", P.vocab, H, embed_std > 0 ? embed_std : P.tie ? 1.0 / sqrt((double)H) : 1.0, 0);
	for (int32_t l = 0; l < P.layers; l++) {
#define L(s, d0, d1, sd, mn)                                                                           \
	do {                                                                                           \
		snprintf(nm, sizeof(nm), "model.layers.%d.%s", l, s);                                  \
		ADD(nm, d0, d1, sd, mn);                                                               \
	} while (0)
		L("input_layernorm.weight", H, 0, 0.1, 1.0);
		L("self_attn.q_proj.weight", Q, H, 1.0 / sqrt((double)H), 0);
		L("self_attn.k_proj.weight", KV, H, 1.0 / sqrt((double)H), 0);
		L("self_attn.v_proj.weight", KV, H, 1.0 / sqrt((double)H), 0);
		if (qwen2) {
			L("self_attn.q_proj.bias", Q, 0, 0.1, 0);
			L("self_attn.k_proj.bias", KV, 0, 0.1, 0);
			L("self_attn.v_proj.bias", KV, 0, 0.1, 0);
		}
		if (qwen3) {
			L("self_attn.q_norm.weight", P.head_dim, 0, 0.1, 1.0);
			L("self_attn.k_norm.weight", P.head_dim, 0, 0.1, 1.0);
		}
		L("self_attn.o_proj.weight", H, Q, 1.0 / sqrt((double)Q), 0);
		L("post_attention_layernorm.weight", H, 0, 0.1, 1.0);
		L("mlp.gate_proj.weight", P.inter, H, 1.0 / sqrt((double)H), 0);
		L("mlp.up_proj.weight", P.inter, H, 1.0 / sqrt((double)H), 0);
		L("mlp.down_proj.weight", H, P.inter, 1.0 / sqrt((double)P.inter), 0);
#undef L
	}
	ADD("model.norm.weight", H, 0, 0.1, 1.0);
	if (!P.tie)
		ADD("lm_head.weight", P.vocab, H, 1.0 / sqrt((double)H), 0);
#undef ADD
	size_t shard_bytes = (size_t)shard_mb << 20, acc = 0, total = 0;
	int n_shards = 1;
	for (size_t i = 0; i < nt; i++) {
		if (acc > 0 && acc + t[i].bytes > shard_bytes) {
			n_shards++;
			acc = 0;
		}
		t[i].shard = n_shards - 1;
		t[i].off = acc;
		acc += t[i].bytes;
		total += t[i].bytes;
	}
	json_t *wmap = json_object();
	for (int sh = 0; sh < n_shards; sh++) {
		char fname[128], path[4096];
		if (n_shards == 1)
			snprintf(fname, sizeof(fname), "model.safetensors");
		else
			snprintf(fname, sizeof(fname), "model-%05d-of-%05d.safetensors", sh + 1, n_shards);
		json_t *hdr = json_object();
		json_object_set_new(hdr, "__metadata__", json_pack("{s:s}", "format", "pt"));
		for (size_t i = 0; i < nt; i++) {
			if (t[i].shard != sh)
				continue;
			json_t *shape = t[i].nd == 2 ? json_pack("[I, I]", (json_int_t)t[i].shape[0], (json_int_t)t[i].shape[1])
						     : json_pack("[I]", (json_int_t)t[i].shape[0]);
			json_object_set_new(hdr, t[i].name,
					    json_pack("{s:s, s:o, s:[I, I]}", "dtype", dt_st(dt), "shape", shape,
						      "data_offsets", (json_int_t)t[i].off,
						      (json_int_t)(t[i].off + t[i].bytes)));
			json_object_set_new(wmap, t[i].name, json_string(fname));
		}
		char *hs = json_dumps(hdr, JSON_PRESERVE_ORDER | JSON_COMPACT);
		json_decref(hdr);
		if (!hs)
			return 1;
		size_t hl = strlen(hs), padded = (hl + 7) / 8 * 8;
		snprintf(path, sizeof(path), "%s/%s", out, fname);
		FILE *f = fopen(path, "wb");
		if (!f) {
			fprintf(stderr, "kvferry-mkmodel: fopen(%s) failed: %s\n", path, strerror(errno));
			return 1;
		}
		uint64_t le = padded;
		int bad = fwrite(&le, 8, 1, f) != 1 || fwrite(hs, 1, hl, f) != hl;
		for (size_t i = hl; i < padded && !bad; i++)
			bad = fputc(' ', f) == EOF;
		free(hs);
		for (size_t i = 0; i < nt && !bad; i++)
			if (t[i].shard == sh)
				bad = write_tensor(f, &t[i], dt, seed) != 0;
		if (fclose(f) || bad) {
			fprintf(stderr, "kvferry-mkmodel: writing %s failed (disk full?)\n", path);
			return 1;
		}
	}
	if (n_shards > 1) {
		json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wmap);
		if (dump(idx, out, "model.safetensors.index.json"))
			return 1;
	} else {
		json_decref(wmap);
	}
	size_t params = 0;
	for (size_t i = 0; i < nt; i++)
		params += t[i].bytes / esz;
	printf("wrote %s: %s %s, %d layers, hidden %d, vocab %d, %zu parameters, %d shard(s)\n", out, arch,
	       preset_name, P.layers, P.hidden, P.vocab, params, n_shards);
	free(t);
	return 0;
}
