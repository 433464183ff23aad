/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared numerics every backend must agree on bit for bit: token choice from
 * a logit row, RoPE frequencies, f16 decoding.
 *
 * Sampling draws one uniform number from splitmix64(seed, pos): a column's
 * token depends only on its own logits, seed and position, never on which
 * other columns share the micro-batch.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kn_stage_impl.h"

float kn_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	union { uint32_t u; float f; } v;
	if (exp == 0) {
		float f = ldexpf((float)man, -24);
		return sign ? -f : f;
	}
	if (exp == 31)
		v.u = sign | 0x7f800000u | (man << 13);
	else
		v.u = sign | ((exp + 112) << 23) | (man << 13);
	return v.f;
}

void kn_rope_inv_freq(const struct kn_model_config *cfg, float *inv_freq)
{
	int half = cfg->head_dim / 2;
	for (int i = 0; i < half; i++) {
		/* Same expression order as transformers: theta ** (2i / dim) in f32. */
		float e = (float)(2 * i) / (float)cfg->head_dim;
		float f = 1.0f / powf(cfg->rope_theta, e);
		if (cfg->rope_factor > 0) {
			float lo_wl = (float)cfg->rope_orig_max_position / cfg->rope_low_freq_factor;
			float hi_wl = (float)cfg->rope_orig_max_position / cfg->rope_high_freq_factor;
			float wl = 2.0f * (float)M_PI / f;
			if (wl > lo_wl) {
				f = f / cfg->rope_factor;
			} else if (!(wl < hi_wl)) {
				float sm = ((float)cfg->rope_orig_max_position / wl - cfg->rope_low_freq_factor)
					   / (cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
				f = (1.0f - sm) * f / cfg->rope_factor + sm * f;
			}
		}
		inv_freq[i] = f;
	}
}

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

struct cand {
	float l;
	int32_t id;
};

/* Descending logit, then ascending id: a total order, so qsort's result is
 * unique whatever its algorithm. */
static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->l != y->l)
		return x->l > y->l ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

int32_t kn_sample_column(const float *logits, int32_t vocab, const struct kn_column *c,
			 int32_t n_logprobs, float *tok_lp, int32_t *top_ids, float *top_lps,
			 void *scratch)
{
	struct cand *cd = scratch;
	int32_t best = 0;
	float mx = logits[0];
	for (int32_t i = 1; i < vocab; i++)
		if (logits[i] > mx) {
			mx = logits[i];
			best = i;
		}
	int32_t tok = best;

	if (c->temperature > 0) {
		float t = c->temperature;
		/* Tokens more than 40 nats (scaled) below the best have probability
		 * < 4e-18 and cannot change a draw; dropping them keeps the sort short. */
		int32_t n = 0;
		for (int32_t i = 0; i < vocab; i++)
			if ((logits[i] - mx) / t > -40.0f)
				cd[n++] = (struct cand){ logits[i], i };
		qsort(cd, (size_t)n, sizeof(*cd), cand_cmp);
		if (c->top_k > 0 && c->top_k < n)
			n = c->top_k;
		double sum = 0;
		for (int32_t i = 0; i < n; i++)
			sum += exp((double)(cd[i].l - mx) / t);
		if (c->top_p > 0 && c->top_p < 1) {
			double acc = 0;
			int32_t k;
			for (k = 0; k < n; k++) {
				acc += exp((double)(cd[k].l - mx) / t) / sum;
				if (acc >= c->top_p)
					break;
			}
			n = k < n ? k + 1 : n;
			sum = 0;
			for (int32_t i = 0; i < n; i++)
				sum += exp((double)(cd[i].l - mx) / t);
		}
		uint64_t r = splitmix64(((uint64_t)c->seed << 32) ^ (uint32_t)c->pos);
		double u = (double)(r >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
		tok = cd[n - 1].id;
		for (int32_t i = 0; i < n; i++) {
			acc += exp((double)(cd[i].l - mx) / t);
			if (u < acc) {
				tok = cd[i].id;
				break;
			}
		}
	}

	if (tok_lp || n_logprobs > 0) {
		/* Logprobs of the model's distribution (temperature 1). */
		double sum = 0;
		for (int32_t i = 0; i < vocab; i++)
			sum += exp((double)(logits[i] - mx));
		double lse = (double)mx + log(sum);
		if (tok_lp)
			*tok_lp = (float)((double)logits[tok] - lse);
		if (n_logprobs > 0) {
			/* Keep the n best in a small sorted array: n is tiny (<= 20). */
			int32_t k = n_logprobs < vocab ? n_logprobs : vocab, have = 0;
			for (int32_t i = 0; i < vocab; i++) {
				struct cand x = { logits[i], i };
				if (have == k && cand_cmp(&x, &cd[k - 1]) >= 0)
					continue;
				int32_t p = have < k ? have++ : k - 1;
				while (p > 0 && cand_cmp(&x, &cd[p - 1]) < 0) {
					cd[p] = cd[p - 1];
					p--;
				}
				cd[p] = x;
			}
			for (int32_t i = 0; i < n_logprobs; i++) {
				top_ids[i] = i < k ? cd[i].id : -1;
				top_lps[i] = i < k ? (float)((double)cd[i].l - lse) : -INFINITY;
			}
		}
	}
	return tok;
}
