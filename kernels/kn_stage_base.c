/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What every stage backend builds on (kn_stage_impl.h): default options, the
 * error buffer, and the shared base (options, layer range, the host block
 * table). The dispatcher (kn_stage.c) and the backends (kn_cpu.c,
 * cuda/engine.cu) call down into it; it calls neither.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kn_err.h"
#include "kn_stage_impl.h"

void kn_stage_opts_init(struct kn_stage_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->layer_start = 0;
	o->layer_end = -1; /* whole model */
	o->n_blocks = -1;
	o->kv_budget_bytes = (size_t)256 << 20;
	o->kv_mem_fraction = 0.8f;
	o->n_slots = 64;
	o->max_blocks_per_slot = 256;
	o->plan_widths[0] = 8;
	o->plan_widths[1] = 64;
	o->n_plans = 2;
	o->n_threads = 0;
	o->device = 0;
	o->cuda_gemv = 0;
	o->cuda_wide_x = 0;
	o->cuda_attn = 0;
	o->cuda_batch_invariant = 0;
	o->cuda_module = NULL;
}

void kn_stage_seterr(struct kn_stage *s, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->err, sizeof(s->err), fmt, ap);
	va_end(ap);
}


int kn_stage_base_init(struct kn_stage *s, const struct kn_stage_vtbl *vt,
		       const struct kn_model *m, const struct kn_stage_opts *o,
		       char *err, size_t errlen)
{
	s->vt = vt;
	s->model = m;
	s->cfg = kn_model_config(m);
	s->opts = *o;
	if (s->opts.layer_end < 0)
		s->opts.layer_end = s->cfg->n_layers;
	s->first = s->opts.layer_start == 0;
	s->last = s->opts.layer_end == s->cfg->n_layers;
	s->max_plan = s->opts.plan_widths[s->opts.n_plans - 1];
	size_t n = (size_t)o->n_slots * (size_t)o->max_blocks_per_slot;
	s->table = malloc(n * sizeof(*s->table));
	if (!s->table) {
		kn_seterr(err, errlen, "kn_stage_create: out of memory for a %d x %d block table",
		     o->n_slots, o->max_blocks_per_slot);
		return -ENOMEM;
	}
	memset(s->table, 0xff, n * sizeof(*s->table));
	return 0;
}

void kn_stage_base_fini(struct kn_stage *s)
{
	free(s->table);
	s->table = NULL;
}
