/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kvf_mix.h
 * One 64-bit mixer for every hash, id and derived seed (headers only):
 * splitmix64's finalizer, a bijection of 64-bit words whose every output
 * bit depends on every input bit. Not for secrets.
 */
#ifndef KVF_MIX_H
#define KVF_MIX_H

#include <stdint.h>

/** The golden-ratio step splitmix64 adds before mixing. */
#define KVF_MIX_GOLDEN 0x9e3779b97f4a7c15ull

/** splitmix64's finalizer of @p x. */
static inline uint64_t kvf_mix64(uint64_t x)
{
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

#endif /* KVF_MIX_H */
