/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stage-chain dispatcher: every public ctrl_chain_* call goes through the
 * implementation's vtable. Kept out of line so the scheduler never depends on
 * which chain it drives.
 */
#include <errno.h>

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
	return c->vt->poll(c, out, max);
}

int ctrl_chain_stats(struct ctrl_chain *c, struct ctrl_chain_stats *st)
{
	if (c->vt->stats == NULL)
		return -ENOTSUP;
	return c->vt->stats(c, st);
}

void ctrl_chain_destroy(struct ctrl_chain *c)
{
	if (c != NULL)
		c->vt->destroy(c);
}
