/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stage-chain dispatcher: every public ctrl_chain_* call goes through the
 * implementation's vtable. Kept out of line so the scheduler never depends on
 * which chain it drives.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ctrl_chain.h"

int ctrl_chain_info(struct ctrl_chain *c, struct ctrl_chain_info *info)
{
	return c->vt->info(c, info);
}

int ctrl_chain_submit(struct ctrl_chain *c, uint32_t group, const struct kn_column *cols,
		      int32_t n_cols, const struct kn_op *ops, int32_t n_ops)
{
	return c->vt->submit(c, group, cols, n_cols, ops, n_ops);
}

int ctrl_chain_poll(struct ctrl_chain *c, struct ctrl_chain_result *out, int max)
{
	if (max > 0)
		memset(out, 0, sizeof(*out) * (size_t)max);
	return c->vt->poll(c, out, max);
}

int ctrl_chain_ready(struct ctrl_chain *c, char *why, size_t whylen)
{
	if (why != NULL && whylen > 0)
		why[0] = '\0';
	return c->vt->ready != NULL ? c->vt->ready(c, why, whylen) : 1;
}

int ctrl_chain_stats(struct ctrl_chain *c, struct ctrl_chain_stats *st)
{
	if (c->vt->stats == NULL)
		return -ENOTSUP;
	return c->vt->stats(c, st);
}

int ctrl_chain_kv_format(struct ctrl_chain *c, int32_t stage, struct kn_kv_format *f)
{
	return c->vt->kv_format != NULL ? c->vt->kv_format(c, stage, f) : -ENOTSUP;
}

int ctrl_chain_kv_export(struct ctrl_chain *c, int32_t stage, const int32_t *blocks, int32_t n, void *dst,
			 size_t len)
{
	return c->vt->kv_export != NULL ? c->vt->kv_export(c, stage, blocks, n, dst, len) : -ENOTSUP;
}

int ctrl_chain_kv_import(struct ctrl_chain *c, int32_t stage, const int32_t *blocks, int32_t n,
			 const void *src, size_t len, const struct kn_kv_format *f)
{
	return c->vt->kv_import != NULL ? c->vt->kv_import(c, stage, blocks, n, src, len, f) : -ENOTSUP;
}

void ctrl_chain_destroy(struct ctrl_chain *c)
{
	if (c != NULL)
		c->vt->destroy(c);
}

int ctrl_chain_layers(int32_t n_layers, int32_t n, int32_t *ends, char *err, size_t errlen)
{
	if (n < 1 || n > CTRL_CHAIN_MAX_STAGES || n > n_layers) {
		snprintf(err, errlen, "%d stages for a %d-layer model: use 1..%d", n, n_layers,
			 n_layers < CTRL_CHAIN_MAX_STAGES ? n_layers : CTRL_CHAIN_MAX_STAGES);
		return -EINVAL;
	}
	if (ends[0] == 0) {
		for (int32_t k = 0; k < n; k++)
			ends[k] = (int32_t)((int64_t)n_layers * (k + 1) / n);
		return 0;
	}
	for (int32_t k = 0; k < n; k++) {
		int32_t start = k == 0 ? 0 : ends[k - 1];

		if (ends[k] <= start) {
			snprintf(err, errlen, "stage %d ends at layer %d, not after its start %d: ranges must "
				 "be consecutive and non-empty", k, ends[k], start);
			return -EINVAL;
		}
	}
	if (ends[n - 1] != n_layers) {
		snprintf(err, errlen, "the stages cover layers 0..%d but the model has %d layers: the last "
			 "range must end at %d", ends[n - 1], n_layers, n_layers);
		return -EINVAL;
	}
	return 0;
}
