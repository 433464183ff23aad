/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file dp_crc32c.h
 * CRC32C (Castagnoli), the wire's checksum, for the dataplane and for the
 * processes that hand it messages: a producer that computes its message's
 * per-frame payload CRCs where it writes the bytes spares the dataplane its
 * own pass over them (dp_ipc.h, "payload CRCs from the producer";
 * dp_ipc_tx_crcs_fill()). Headers only, as dp_ipc.h: ISA-L's crc32_iscsi()
 * where the build found it (DP_HAVE_ISAL: libdpdk-dev depends on
 * libisal-dev), else the SSE4.2 crc32 instruction, else a table.
 *
 * Why three ways: ISA-L folds several streams with carry-less multiplies,
 * 9.4 GB/s against 3.9 for the crc32 chain on 8878-byte payloads, but it
 * reads tables of constants: beside the dataplane's 9 KB copies, which keep
 * evicting them, each call on a 76-byte header cost ~130 ns (14% of both
 * cores at 10 GB/s over memif, every frame's header CRC on each end)
 * against ~10 ns for the chain. So short inputs take the chain and long
 * ones ISA-L.
 */
#ifndef DP_CRC32C_H
#define DP_CRC32C_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(DP_HAVE_ISAL)
#include <isa-l/crc.h>
#endif
#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "dp_ipc.h"

#define DP_CRC_SHORT 256

static inline uint32_t dp_crc32c_by_table(uint32_t c, const uint8_t *p, size_t len)
{
	static uint32_t table[256];
	static int ready;

	if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
		for (uint32_t i = 0; i < 256; i++) {
			uint32_t v = i;
			for (int k = 0; k < 8; k++)
				v = (v & 1) ? (v >> 1) ^ 0x82f63b78u : v >> 1;
			table[i] = v; /* threads racing here store the same values */
		}
		__atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
	}
	while (len--)
		c = table[(c ^ *p++) & 0xffu] ^ (c >> 8);
	return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static inline uint32_t dp_crc32c_by_insn(uint32_t crc, const uint8_t *p,
									      size_t len)
{
	uint64_t c = crc;

	while (len >= 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		c = _mm_crc32_u64(c, v);
		p += 8;
		len -= 8;
	}
	crc = (uint32_t)c;
	while (len--)
		crc = _mm_crc32_u8(crc, *p++);
	return crc;
}
#endif

/** CRC32C of @p len bytes at @p buf, continuing @p crc (0 to start). */
static inline uint32_t dp_ipc_crc32c(uint32_t crc, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint32_t c = ~crc;

#if defined(DP_HAVE_ISAL)
	if (len >= DP_CRC_SHORT) {
		/* crc32_iscsi() takes and returns the register without the final
		 * inversion, and its length is an int */
		while (len > (size_t)INT32_MAX) {
			c = crc32_iscsi((unsigned char *)(uintptr_t)p, INT32_MAX, c);
			p += INT32_MAX;
			len -= INT32_MAX;
		}
		return ~crc32_iscsi((unsigned char *)(uintptr_t)p, (int)len, c);
	}
#endif
#if defined(__x86_64__)
	if (__builtin_cpu_supports("sse4.2"))
		return ~dp_crc32c_by_insn(c, p, len);
#endif
	return ~dp_crc32c_by_table(c, p, len);
}

/**
 * The payload CRCs of frames [@p from, @p to) of a message of @p len bytes
 * at @p msg, into the trailer that follows it (struct dp_tx_crcs at
 * @p msg + dp_ipc_tx_crcs_off(@p len), which must have
 * dp_ipc_tx_crcs_room(@p len, @p stride) bytes), frame i covering bytes
 * [i * stride, (i + 1) * stride). Call it on each run of frames as soon as
 * their bytes are written, while they are still in this core's cache (a
 * producer that writes a message front to back: every frame of it as it
 * goes), then send the message with DP_TX_CRCS. @p stride is
 * dp_ipc_tx_crc_stride() of the dataplane it goes to (0: it checks no
 * payload CRC, so compute none). @return the frames' count, or 0 if
 * @p stride is 0.
 */
static inline uint32_t dp_ipc_tx_crcs_fill(void *msg, uint32_t len, uint32_t stride, uint32_t from, uint32_t to)
{
	if (stride == 0)
		return 0;
	uint32_t n = dp_ipc_tx_crcs_count(len, stride);
	struct dp_tx_crcs *t = (struct dp_tx_crcs *)((uint8_t *)msg + dp_ipc_tx_crcs_off(len));

	if (to > n)
		to = n;
	for (uint32_t i = from; i < to; i++) {
		uint64_t at = (uint64_t)i * stride;
		uint32_t fl = len - at < stride ? (uint32_t)(len - at) : stride;

		t->crc[i] = dp_ipc_crc32c(0, (const uint8_t *)msg + at, fl);
	}
	t->stride = stride;
	t->n = n;
	t->reserved = 0;
	t->magic = DP_TX_CRCS_MAGIC;
	return n;
}

#endif /* DP_CRC32C_H */
