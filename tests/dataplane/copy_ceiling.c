/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cost of exactly one copy, for dp-bench's fair ceiling: one core
 * copies messages of --size bytes from one half of a buffer of
 * --region-mib MiB (hugepages when it can have them, as the dataplane's
 * region) to the other, each message from and to the next slot in turn so
 * that the bytes come from and go to DRAM, not cache, for --seconds.
 *   copy_ceiling --size BYTES [--region-mib 320] [--seconds 3]
 * Prints: copy: SIZE B messages, N MiB region, S s, X GB/s, M msg/s
 *
 * --piece BYTES copies each message as pieces of that size with DPDK's
 * rte_memcpy, compiled as the distribution builds DPDK (libdpdk's cflags:
 * -march=corei7, 16-byte moves): the copy a memif driver makes of each
 * frame, so dp-bench can show what bounds a path whose one copy is the
 * driver's. Without it, glibc's memcpy (the widest moves the CPU has).
 *
 * --crc (with --piece) reads each piece for its CRC32C first, a burst of 32
 * pieces at a time, then copies the burst: what a worker lcore does with a
 * burst of frames when the link carries payload CRCs (dataplane/port_txq.c,
 * fill_crcs() and then the driver's copy in rte_eth_tx_burst()). --crc-only
 * reads the pieces for their CRCs and copies nothing: the separate pass the
 * main lcore made before, over bytes still in memory.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <rte_memcpy.h>

#include "dp_wire.h"

#define CRC_BURST 32 /* port_txq.c TXQ_BURST */

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	size_t size = 0, piece = 0, region = (size_t)320 << 20;
	double seconds = 3.0;
	int crc = 0, copy = 1;
	volatile uint32_t sink = 0; /* the CRCs are used: not optimized away */

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--crc") || !strcmp(argv[i], "--crc-only")) {
			crc = 1;
			copy = !strcmp(argv[i], "--crc");
			continue;
		}
		if (i + 1 >= argc)
			break;
		if (!strcmp(argv[i], "--size"))
			size = strtoull(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--region-mib"))
			region = strtoull(argv[i + 1], NULL, 0) << 20;
		else if (!strcmp(argv[i], "--piece"))
			piece = strtoull(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--seconds"))
			seconds = strtod(argv[i + 1], NULL);
		i++;
	}
	if (size == 0 || region < 4 * size || seconds <= 0 || (crc && piece == 0)) {
		fprintf(stderr, "usage: copy_ceiling --size BYTES [--piece BYTES [--crc | --crc-only]] "
			"[--region-mib MIB >= 4 messages] [--seconds S > 0]\n");
		return 2;
	}
	int huge = 1;
	uint8_t *buf = mmap(NULL, region, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	if (buf == MAP_FAILED) {
		huge = 0;
		buf = mmap(NULL, region, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (buf == MAP_FAILED) {
			perror("mmap");
			return 1;
		}
	}
	memset(buf, 0x5a, region); /* fault every page in before timing */
	size_t half = region / 2, slots = half / size;
	uint64_t n = 0;
	double t0 = now_s(), t = t0;
	while (t - t0 < seconds) {
		for (int k = 0; k < 16; k++, n++) {
			size_t i = (size_t)(n % slots), j = (size_t)((n * 7 + 3) % slots);
			uint8_t *dst = buf + half + j * size, *src = buf + i * size;

			if (piece == 0) {
				memcpy(dst, src, size);
				continue;
			}
			/* bursts of pieces: their CRCs (--crc), then their copies */
			for (size_t b = 0; b < size; b += CRC_BURST * piece) {
				size_t end = size - b < CRC_BURST * piece ? size : b + CRC_BURST * piece;

				for (size_t o = b; crc && o < end; o += piece)
					sink ^= dp_crc32c(0, src + o, end - o < piece ? end - o : piece);
				for (size_t o = b; copy && o < end; o += piece)
					rte_memcpy(dst + o, src + o, end - o < piece ? end - o : piece);
			}
		}
		t = now_s();
	}
	double dt = t - t0;
	printf("copy: %zu B messages%s, %zu MiB region (%s), %.3f s, %.3f GB/s, %.0f msg/s\n", size,
	       !piece ? "" : !crc ? " (rte_memcpy pieces)" : copy ? " (CRC32C then rte_memcpy, bursts of pieces)"
	       : " (CRC32C of pieces, no copy)", region >> 20, huge ? "hugepages" : "4 KiB pages", dt,
	       (double)n * (double)size / dt / 1e9, (double)n / dt);
	munmap(buf, region);
	return 0;
}
