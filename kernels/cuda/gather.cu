/* SPDX-License-Identifier: Apache-2.0 */
#include "gather.cuh"

static __global__ void __launch_bounds__(256) gather_kernel(const struct cu_piece *pc)
{
	const struct cu_piece p = pc[blockIdx.x];
	/* the destination's head bytes up to a 4-byte boundary, then whole
	 * words, then the tail bytes */
	uint64_t head = (4u - ((uintptr_t)p.dst & 3u)) & 3u;

	if (head > p.len)
		head = p.len;
	for (uint64_t i = threadIdx.x; i < head; i += blockDim.x)
		p.dst[i] = p.src[i];
	const uint8_t *s = p.src + head;
	uint32_t *d = (uint32_t *)(p.dst + head);
	const uint64_t nw = (p.len - head) / 4;
	const unsigned sh = (unsigned)((uintptr_t)s & 3u);
	const uint32_t *w = (const uint32_t *)((uintptr_t)s & ~(uintptr_t)3);

	/* word i's bytes lie in source words i and i + 1 (only when the
	 * source is misaligned, and then the bytes read of word i + 1 are
	 * the piece's own: no read past it beyond that word) */
	if (sh == 0) {
		for (uint64_t i = threadIdx.x; i < nw; i += blockDim.x)
			d[i] = w[i];
	} else {
		for (uint64_t i = threadIdx.x; i < nw; i += blockDim.x)
			d[i] = __funnelshift_r(w[i], w[i + 1], sh * 8u);
	}
	for (uint64_t i = head + nw * 4 + threadIdx.x; i < p.len; i += blockDim.x)
		p.dst[i] = p.src[i];
}

cudaError_t kn_cuda_gather(const struct cu_piece *pc, int n, cudaStream_t st)
{
	if (n <= 0)
		return cudaSuccess;
	gather_kernel<<<n, 256, 0, st>>>(pc);
	return cudaGetLastError();
}
