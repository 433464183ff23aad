/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvferry-worker's two hops: where micro-batch messages come from (a shm
 * ring on this node, or the dataplane's receive ring) and where they go (the
 * next stage's ring on this node, ctrld's return ring, or the dataplane's
 * send ring toward another node). Private to the worker.
 *
 * Specs:  in:  "ring:NAME" | "dp"
 *         out: "ring:NAME" | "peer:NODE[/STREAM]"
 *
 * Threading: one thread (the worker's loop) uses a hop.
 */
#ifndef KN_WORKER_HOP_H
#define KN_WORKER_HOP_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "shm_region.h"
#include "shm_ring.h"

/** Ring capacity of every serving ring: well above any chain's groups in flight. */
#define WK_RING_COUNT 256u

struct wk_in;
struct wk_out;

/**
 * Find a ring by name, creating it if nobody has yet (whichever side starts
 * first creates it; the other looks it up, retrying while it is being set up).
 * @return the handle, or NULL with errno and @p err filled.
 */
struct shm_ring *wk_ring_open(struct shm_region *r, const char *name, char *err, size_t errlen);

/** Open the input hop @p spec. @return the hop or NULL with @p err filled. */
struct wk_in *wk_in_open(struct shm_region *r, const char *spec, char *err, size_t errlen);

/**
 * Take the next message, sleeping up to @p timeout_ns when there is none;
 * a message on any of the @p n_also rings @p also (the worker's other
 * inputs, NULL entries skipped) ends the sleep too, and is left there.
 * @return 1 (a message in @p d), 0 (none yet), -EINTR.
 */
int wk_in_get(struct wk_in *in, struct shm_desc *d, int64_t timeout_ns, struct shm_ring *const *also,
	      unsigned n_also);

/** Give back what wk_in_get() returned (the dataplane's receive buffer). */
void wk_in_done(struct wk_in *in, const struct shm_desc *d);

/** Close; NULL is a no-op. */
void wk_in_close(struct wk_in *in);

/** Open the output hop @p spec. @return the hop or NULL with @p err filled. */
struct wk_out *wk_out_open(struct shm_region *r, const char *spec, char *err, size_t errlen);

/**
 * Send the message at region offset @p off, @p len bytes, of message type
 * @p kind; waits while the ring is full (the next stage is behind) unless
 * @p stop becomes non-zero.
 * A send the dataplane later fails is counted by wk_out_poll(); ctrld fails
 * the group (its deadline, or the dataplane's peer event).
 * @return 0, or -EINTR (stopped before the ring took it).
 */
int wk_out_send(struct wk_out *o, uint64_t off, uint32_t len, uint16_t kind, uint64_t seq,
		volatile const sig_atomic_t *stop);

/**
 * Wait until no send from the buffer at @p off is still unacknowledged (the
 * dataplane reads the buffer until its peer acknowledged it), reaping
 * completions. Immediate for a ring hop.
 */
void wk_out_quiesce(struct wk_out *o, uint64_t off, volatile const sig_atomic_t *stop);

/** Reap send completions without waiting. @return failed sends seen. */
unsigned wk_out_poll(struct wk_out *o);

/** @return 1 if the hop goes through the dataplane. */
int wk_out_is_dp(const struct wk_out *o);

/** Close; NULL is a no-op. */
void wk_out_close(struct wk_out *o);

/**
 * Describe what the two hops hold now, as key=value words a script can
 * check: "in_queued=N out_queued=N pending_sends=N rx_bufs=N rx_free=N"
 * (rx_* count the dataplane's receive pools on a dp input, else 0). At rest
 * every queue is 0 and rx_free == rx_bufs.
 */
void wk_hop_report(const struct wk_in *in, const struct wk_out *o, char *buf, size_t n);

#endif /* KN_WORKER_HOP_H */
