/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Private to kernels/: fill a caller's error buffer (NULL or 0 length is
 * fine). One helper for the loader, the stage dispatcher, the CPU engine and
 * the tokenizer, which all report through char *err / size_t errlen.
 */
#ifndef KN_ERR_H
#define KN_ERR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

__attribute__((format(printf, 3, 4)))
static inline void kn_seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

#endif /* KN_ERR_H */
