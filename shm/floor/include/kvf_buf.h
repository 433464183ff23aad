/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file kvf_buf.h
 * The byte buffer kvferry's processes build text in (HTTP bodies, event
 * streams, /metrics pages): it grows by doubling and keeps a NUL after the
 * last byte, so its bytes can be read as a C string at any time.
 *
 * Start from a zeroed struct (`struct kvf_buf b = {0};`); kvf_buf_free()
 * returns it to that state.
 *
 * Threading: a buffer is one thread's at a time; no locking inside.
 */
#ifndef KVF_BUF_H
#define KVF_BUF_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/** A growable byte buffer. */
struct kvf_buf {
	char *p;       /**< the bytes, NUL after the last; NULL until the first add */
	size_t len;    /**< bytes held, the NUL not counted */
	size_t cap;    /**< bytes allocated */
};

/**
 * Append @p n bytes of @p data (which may hold NULs). Adding 0 bytes to an
 * empty buffer allocates it, so that p is an empty string.
 * @return 0, or -ENOMEM (the buffer is left as it was).
 */
int kvf_buf_add(struct kvf_buf *b, const void *data, size_t n);

/**
 * Append the C string @p s, without its NUL.
 * @return 0, or -ENOMEM (the buffer is left as it was).
 */
int kvf_buf_str(struct kvf_buf *b, const char *s);

/** Free the bytes and zero @p b; a zeroed buffer is a no-op. */
void kvf_buf_free(struct kvf_buf *b);

#ifdef __cplusplus
}
#endif
#endif /* KVF_BUF_H */
