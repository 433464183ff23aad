/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tensor parallelism on the CUDA engine: how a stage's ranks sum their
 * partials of o and down (kn_stage.h, kn_stage_opts.tp_*).
 *
 * NCCL's all-reduce on the step's stream, inside its graphs, where every
 * rank has a GPU of its own: the ranks' devices are compared first (through
 * tp_reduce, one slot per device), since NCCL refuses two ranks on one GPU.
 * libnccl.so.2 is opened at run time (dlopen), so the engine module, the
 * package and a node without NCCL do without it until a stage has ranks.
 * Rank 0's id reaches the others through tp_share.
 *
 * Else through tp_reduce on host rows: the step's partial copied to pinned
 * memory, summed by the caller's reduce (the worker's region area, or a
 * test's threads), copied back. It waits for the device each time, so such a
 * stage runs its steps eagerly, not as graphs: ranks sharing one GPU, tests.
 */
#include <dlfcn.h>

#include "engine_int.cuh"

#if __has_include(<nccl.h>)
#include <nccl.h>
#define CU_HAVE_NCCL 1
#else
#define CU_HAVE_NCCL 0
#endif

/* Device slots of the devices check: at most this many GPUs a node. */
#define CU_TP_DEVS 64

#if CU_HAVE_NCCL
/* The NCCL calls the engine makes, looked up once. */
struct nccl_fns {
	ncclResult_t (*get_id)(ncclUniqueId *);
	ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
	ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
				   cudaStream_t);
	ncclResult_t (*destroy)(ncclComm_t);
	const char *(*err)(ncclResult_t);
};

static const struct nccl_fns *nccl_open(char *why, size_t n)
{
	static struct nccl_fns f;
	static int state; /* 0 not tried, 1 loaded, -1 not found */
	static char reason[256];

	if (state == 0) {
		void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);

		if (h == NULL) {
			snprintf(reason, sizeof(reason), "libnccl.so.2 not found (%s)", dlerror());
			state = -1;
		} else {
			f.get_id = (ncclResult_t(*)(ncclUniqueId *))dlsym(h, "ncclGetUniqueId");
			f.init_rank = (ncclResult_t(*)(ncclComm_t *, int, ncclUniqueId, int))dlsym(h, "ncclCommInitRank");
			f.all_reduce = (ncclResult_t(*)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
							ncclComm_t, cudaStream_t))dlsym(h, "ncclAllReduce");
			f.destroy = (ncclResult_t(*)(ncclComm_t))dlsym(h, "ncclCommDestroy");
			f.err = (const char *(*)(ncclResult_t))dlsym(h, "ncclGetErrorString");
			state = f.get_id && f.init_rank && f.all_reduce && f.destroy && f.err ? 1 : -1;
			if (state < 0)
				snprintf(reason, sizeof(reason), "libnccl.so.2 lacks ncclCommInitRank or ncclAllReduce");
		}
	}
	if (state < 0)
		snprintf(why, n, "%s", reason);
	return state > 0 ? &f : NULL;
}
#endif

/* Does any device hold two ranks? Every rank adds a one in its device's slot. */
static int shared_gpu(struct cu_stage *s, int *shared)
{
	const struct kn_stage_opts *o = &s->base.opts;
	float v[CU_TP_DEVS] = { 0 };

	v[s->dev % CU_TP_DEVS] = 1.f;
	if (o->tp_reduce(o->tp_arg, v, 1, CU_TP_DEVS, CU_TP_DEVS) < 0) {
		cu_seterr(s, "kn_stage_create(cuda): tensor parallelism: the ranks' reduce failed comparing devices");
		return -EIO;
	}
	*shared = 0;
	for (int i = 0; i < CU_TP_DEVS; i++)
		*shared |= v[i] > 1.5f;
	return 0;
}

int cu_tp_init(struct cu_stage *s)
{
	const struct kn_stage_opts *o = &s->base.opts;
	const char *force = getenv("KVFERRY_CUDA_TP");
	char why[300] = "";
	int shared = 0, rc;

	/* one rank over NCCL only when asked (a check of NCCL on one GPU) */
	if (s->tp == 1 && !(force != NULL && !strcmp(force, "nccl") && o->tp_share != NULL))
		return 0;
	if (s->tp > 1 && o->tp_reduce == NULL) {
		cu_seterr(s, "kn_stage_create(cuda): tensor parallelism (tp_size %d) needs a reduce "
			     "(kn_stage_opts.tp_reduce)", s->tp);
		return -EINVAL;
	}
	if (s->tp > 1 && (rc = shared_gpu(s, &shared)) < 0)
		return rc;
	if (shared)
		snprintf(why, sizeof(why), "ranks share a GPU");
	else if (o->tp_share == NULL)
		snprintf(why, sizeof(why), "no tp_share to hand NCCL's id to the ranks");
	else if (force != NULL && !strcmp(force, "host"))
		snprintf(why, sizeof(why), "KVFERRY_CUDA_TP=host");
#if CU_HAVE_NCCL
	const struct nccl_fns *f = why[0] ? NULL : nccl_open(why, sizeof(why));
	if (f != NULL) {
		ncclUniqueId id;
		ncclResult_t r = ncclSuccess;
		ncclComm_t comm = NULL;
		float ok;

		memset(&id, 0, sizeof(id));
		if (s->rank == 0)
			r = f->get_id(&id);
		/* every rank calls tp_share, also after a failure, with the id zeroed:
		 * the others then see it failed */
		if (o->tp_share(o->tp_arg, &id, sizeof(id)) < 0 || r != ncclSuccess) {
			snprintf(why, sizeof(why), "ncclGetUniqueId or its hand-over failed");
		} else {
			ncclUniqueId zero;
			memset(&zero, 0, sizeof(zero));
			if (!memcmp(&id, &zero, sizeof(id)))
				snprintf(why, sizeof(why), "rank 0 had no NCCL id to give");
			else if ((r = f->init_rank(&comm, s->tp, id, s->rank)) != ncclSuccess)
				snprintf(why, sizeof(why), "ncclCommInitRank: %s", f->err(r));
		}
		/* every rank must use the same transport: NCCL only if all came up */
		ok = why[0] ? 0.f : 1.f;
		if (s->tp > 1 && o->tp_reduce(o->tp_arg, &ok, 1, 1, 1) < 0) {
			if (comm != NULL)
				f->destroy(comm);
			cu_seterr(s, "kn_stage_create(cuda): tensor parallelism: the ranks' reduce failed");
			return -EIO;
		}
		if (ok > s->tp - 0.5f) {
			s->nccl = comm;
			return 0;
		}
		if (comm != NULL)
			f->destroy(comm);
		if (!why[0])
			snprintf(why, sizeof(why), "NCCL did not come up on another rank");
	}
#else
	if (!why[0])
		snprintf(why, sizeof(why), "built without nccl.h");
#endif
	if (force != NULL && !strcmp(force, "nccl")) {
		cu_seterr(s, "kn_stage_create(cuda): KVFERRY_CUDA_TP=nccl, but NCCL cannot sum this stage's %d ranks: "
			     "%s; give each rank a GPU of its own (device), or unset KVFERRY_CUDA_TP", s->tp, why);
		return -EINVAL;
	}
	if (s->tp == 1)
		return 0; /* one rank: nothing to sum */
	s->tp_host = 1;
	snprintf(s->tp_why, sizeof(s->tp_why), "%s", why);
	CK(cudaHostAlloc((void **)&s->h_red, (size_t)s->wmax * s->hidden * 4, cudaHostAllocDefault));
	return 0;
}

bool cu_tp_reduces(const struct cu_stage *s)
{
	return !(s->tp == 1 && s->nccl == NULL);
}

int cu_tp_reduce(struct cu_stage *s, float *d, int W)
{
	const size_t bytes = (size_t)W * s->hidden * 4;

	if (!cu_tp_reduces(s))
		return 0;
#if CU_HAVE_NCCL
	if (s->nccl != NULL) {
		char why[300];
		const struct nccl_fns *f = nccl_open(why, sizeof(why));
		ncclResult_t r = f->all_reduce(d, d, (size_t)W * s->hidden, ncclFloat, ncclSum, (ncclComm_t)s->nccl, s->st);

		if (r != ncclSuccess) {
			cu_seterr(s, "ncclAllReduce(%d x %d floats, rank %d of %d) failed: %s", W, s->hidden, s->rank,
				  s->tp, f->err(r));
			return -EIO;
		}
		return 0;
	}
#endif
	CK(cudaMemcpyAsync(s->h_red, d, bytes, cudaMemcpyDeviceToHost, s->st));
	CK(cudaStreamSynchronize(s->st));
	if (s->base.opts.tp_reduce(s->base.opts.tp_arg, s->h_red, W, s->hidden, s->hidden) < 0) {
		cu_seterr(s, "tensor-parallel reduce (rank %d of %d, %d rows) failed", s->rank, s->tp, W);
		return -EIO;
	}
	CK(cudaMemcpyAsync(d, s->h_red, bytes, cudaMemcpyHostToDevice, s->st));
	return 0;
}

void cu_tp_fini(struct cu_stage *s)
{
#if CU_HAVE_NCCL
	if (s->nccl != NULL) {
		char why[300];
		const struct nccl_fns *f = nccl_open(why, sizeof(why));

		if (f != NULL)
			f->destroy((ncclComm_t)s->nccl);
		s->nccl = NULL;
	}
#endif
	cudaFreeHost(s->h_red);
	s->h_red = NULL;
}

const char *cu_tp_transport(const struct cu_stage *s)
{
	return s->nccl != NULL ? "nccl" : s->tp == 1 ? "" : "host";
}
