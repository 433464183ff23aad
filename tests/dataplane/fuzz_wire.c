/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the frame parser and the ACK reader on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>

#include "dp_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct dp_wire_view v;
	/* Also exercise a short contiguous prefix (a scattered mbuf). */
	size_t hdr_len = size > 0 && (data[0] & 1) ? size / 2 : size;
	if (dp_wire_parse(data, size, hdr_len, 0, &v) == 0) {
		struct dp_wire_ack ack;
		if (v.h.type == DP_MT_ACK)
			(void)dp_wire_ack_read(data, &v, &ack);
		else if (v.payload_off + v.h.payload_len <= size)
			(void)dp_crc32c(0, data + v.payload_off, v.h.payload_len);
	}
	return 0;
}
