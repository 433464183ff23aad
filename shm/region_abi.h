/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The layout at offset 0 of every region: a shared-memory ABI. Fixed-width
 * fields, offsets not pointers; any change bumps SHM_ABI_VERSION, and a
 * process attaching with another version is refused with both named.
 */
#ifndef SHM_REGION_ABI_H
#define SHM_REGION_ABI_H

#include <assert.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SHM_REGION_MAGIC 0x314752595246564bull /* "KVFRYRG1" little-endian */
#define SHM_ABI_VERSION 1u
#define SHM_MAX_AREAS 128
#define SHM_HDR_BYTES 16384u /* header + area table; areas start here */

struct shm_area_ent {
	char name[32];
	uint64_t off;
	uint64_t size;
	uint32_t kind;
	uint32_t reserved0;
	uint64_t reserved1;
};
static_assert(sizeof(struct shm_area_ent) == 64, "area entry is 64 bytes");

struct shm_region_hdr {
	uint64_t magic;
	uint32_t abi_version;
	uint32_t hdr_bytes;
	uint64_t size;
	uint64_t page_size;
	int32_t creator_pid;
	uint32_t n_areas;        /* published with release after the entry is written */
	uint64_t epoch;
	_Atomic uint32_t lock;   /* serialises add_area across processes: 0, or the holder's pid */
	uint32_t huge;
	uint64_t next_free;      /* bump pointer for areas (under lock) */
	uint8_t reserved[64];
	struct shm_area_ent areas[SHM_MAX_AREAS];
};
static_assert(offsetof(struct shm_region_hdr, magic) == 0, "magic at 0");
static_assert(offsetof(struct shm_region_hdr, abi_version) == 8, "abi_version at 8");
static_assert(offsetof(struct shm_region_hdr, size) == 16, "size at 16");
static_assert(offsetof(struct shm_region_hdr, page_size) == 24, "page_size at 24");
static_assert(offsetof(struct shm_region_hdr, creator_pid) == 32, "creator_pid at 32");
static_assert(offsetof(struct shm_region_hdr, n_areas) == 36, "n_areas at 36");
static_assert(offsetof(struct shm_region_hdr, epoch) == 40, "epoch at 40");
static_assert(offsetof(struct shm_region_hdr, lock) == 48, "lock at 48");
static_assert(offsetof(struct shm_region_hdr, next_free) == 56, "next_free at 56");
static_assert(offsetof(struct shm_region_hdr, areas) == 128, "areas at 128");
static_assert(sizeof(struct shm_region_hdr) <= SHM_HDR_BYTES, "header fits its reserve");

#endif /* SHM_REGION_ABI_H */
