/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kvf_clock.h
 * The monotonic clock every kvferry process reads (headers only): what
 * timeouts, step times and heartbeats are measured in.
 */
#ifndef KVF_CLOCK_H
#define KVF_CLOCK_H

#include <stdint.h>
#include <time.h>

/** CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t kvf_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/** CLOCK_MONOTONIC in seconds. */
static inline double kvf_mono_s(void)
{
	return (double)kvf_mono_ns() * 1e-9;
}

#endif /* KVF_CLOCK_H */
