/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared numerics every backend must agree on bit for bit: token choice from
 * a logit row, RoPE frequencies, f16 decoding.
 *
 * Sampling follows kn_sample_core.h (integer weights, one draw keyed by
 * (seed, pos)): a column's token depends only on its own logits, seed and
 * position, never on which other columns share the micro-batch, and the
 * CUDA engine's device sampler draws the same token.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kn_sample_core.h"
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

/* Descending key: the sampling order of kn_sample_core.h. */
static int key_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x < y) - (x > y);
}

int32_t kn_sample_column(const float *logits, int32_t vocab, const struct kn_column *c,
			 int32_t n_logprobs, float *tok_lp, int32_t *top_ids, float *top_lps,
			 void *scratch)
{
	uint64_t *cd = scratch, best_k = kn_sc_key(logits[0], 0);
	int32_t best = 0;

	for (int32_t i = 1; i < vocab; i++) {
		uint64_t k = kn_sc_key(logits[i], i);
		if (k > best_k) {
			best_k = k;
			best = i;
		}
	}
	float mx = logits[best];
	int32_t tok = best;

	if ((c->flags & KN_COL_FORCE) && c->seed < (uint32_t)vocab) {
		tok = (int32_t)c->seed; /* a given token: scored, not drawn */
	} else if (c->temperature > 0) {
		float t = c->temperature;
		/* Only tokens of non-zero weight can be drawn, and they are a prefix
		 * of the order (the weight grows with the logit): sort just them. */
		int32_t n = 0;
		for (int32_t i = 0; i < vocab; i++)
			if (kn_sc_weight(logits[i], mx, t) > 0)
				cd[n++] = kn_sc_key(logits[i], i);
		qsort(cd, (size_t)n, sizeof(*cd), key_cmp);
		if (c->top_k > 0 && c->top_k < n)
			n = c->top_k;
		uint64_t sum = 0, acc = 0;
		for (int32_t i = 0; i < n; i++)
			sum += kn_sc_weight(logits[kn_sc_key_id(cd[i])], mx, t);
		if (c->top_p > 0 && c->top_p < 1) {
			uint64_t need = kn_sc_top_p_mass(c->top_p, sum);
			for (int32_t i = 0; i < n; i++) {
				acc += kn_sc_weight(logits[kn_sc_key_id(cd[i])], mx, t);
				if (acc >= need) {
					n = i + 1;
					sum = acc;
					break;
				}
			}
		}
		uint64_t target = kn_sc_target(c->seed, c->pos, sum);
		acc = 0;
		tok = kn_sc_key_id(cd[n - 1]);
		for (int32_t i = 0; i < n; i++) {
			acc += kn_sc_weight(logits[kn_sc_key_id(cd[i])], mx, t);
			if (acc > target) {
				tok = kn_sc_key_id(cd[i]);
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
			/* Keep the n best keys in a small sorted array: n is tiny (<= 20). */
			int32_t k = n_logprobs < vocab ? n_logprobs : vocab, have = 0;
			for (int32_t i = 0; i < vocab; i++) {
				uint64_t x = kn_sc_key(logits[i], i);
				if (have == k && x <= cd[k - 1])
					continue;
				int32_t p = have < k ? have++ : k - 1;
				while (p > 0 && x > cd[p - 1]) {
					cd[p] = cd[p - 1];
					p--;
				}
				cd[p] = x;
			}
			for (int32_t i = 0; i < n_logprobs; i++) {
				int32_t id = i < k ? kn_sc_key_id(cd[i]) : -1;
				top_ids[i] = id;
				top_lps[i] = i < k ? (float)((double)logits[id] - lse) : -INFINITY;
			}
		}
	}
	return tok;
}
