/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The floor's byte buffer (kvf_buf.h). Capacity starts at 256 bytes and
 * doubles, so building n bytes costs about log2(n / 256) reallocations.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvf_buf.h"

int kvf_buf_add(struct kvf_buf *b, const void *data, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		char *p;

		while (cap < b->len + n + 1)
			cap *= 2;
		p = realloc(b->p, cap);
		if (p == NULL)
			return -ENOMEM;
		b->p = p;
		b->cap = cap;
	}
	if (n > 0)
		memcpy(b->p + b->len, data, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

int kvf_buf_str(struct kvf_buf *b, const char *s)
{
	return kvf_buf_add(b, s, strlen(s));
}

void kvf_buf_free(struct kvf_buf *b)
{
	free(b->p);
	b->p = NULL;
	b->len = 0;
	b->cap = 0;
}
