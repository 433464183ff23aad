/* SPDX-License-Identifier: Apache-2.0 */
/* Frame build/parse: round trip, integrity checks, truncation. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dp_crc32c.h"
#include "dp_wire.h"

static const struct dp_wire_addr A = {{0x02, 0, 0, 0, 0, 1}, 0x0a000001, 47474};
static const struct dp_wire_addr B = {{0x02, 0, 0, 0, 0, 2}, 0x0a000002, 47474};

static size_t make_frame(uint8_t *buf, uint16_t plen, uint8_t type)
{
	struct dp_wire_hdr h = {0};
	h.type = type;
	h.flags = DP_WF_PCSUM;
	h.src_node = 1;
	h.dst_node = 2;
	h.stream = 7;
	h.payload_len = plen;
	h.src_epoch = 0x1122334455667788ull;
	h.dst_epoch = 0x99;
	h.msg_id = 42;
	h.seq = 0xfffffff0u;
	h.msg_len = 100000;
	h.frag_off = 8192;
	h.frag_idx = 1;
	h.frag_count = 13;
	h.tsval = 123456789;
	for (unsigned i = 0; i < plen; i++)
		buf[DP_FRAME_HLEN + i] = (uint8_t)(i * 7 + 3);
	h.payload_csum = dp_crc32c(0, buf + DP_FRAME_HLEN, plen);
	assert_int_equal(dp_wire_build(buf, &A, &B, &h), (int)DP_FRAME_HLEN);
	return DP_FRAME_HLEN + plen;
}

static void crc32c_matches_the_published_check_value(void **state)
{
	(void)state;
	assert_int_equal(dp_crc32c(0, "123456789", 9), 0xe3069283u);
	/* incremental == one shot */
	uint32_t c = dp_crc32c(0, "1234", 4);
	assert_int_equal(dp_crc32c(c, "56789", 5), 0xe3069283u);
}

/* Bit-at-a-time CRC32C: the definition, against which the fast path is held. */
static uint32_t crc32c_ref(uint32_t crc, const uint8_t *p, size_t len)
{
	crc = ~crc;
	while (len--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = (crc & 1) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
	}
	return ~crc;
}

static void crc32c_agrees_with_the_definition_at_every_length_alignment_and_split(void **state)
{
	(void)state;
	static uint8_t buf[9100];
	uint64_t x = 0x243f6a8885a308d3ull;
	for (size_t i = 0; i < sizeof(buf); i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		buf[i] = (uint8_t)(x >> 56);
	}
	static const size_t lens[] = {0, 1, 7, 8, 15, 16, 31, 63, 64, 65, 127, 255, 256, 257,
				      1000, 1023, 1024, 4095, 4096, 8878, 9000};
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		for (size_t a = 0; a < 9; a++) {
			uint32_t want = crc32c_ref(0, buf + a, lens[i]);
			assert_int_equal(dp_crc32c(0, buf + a, lens[i]), want);
			size_t cut = lens[i] / 3;
			uint32_t c = dp_crc32c(0, buf + a, cut);
			assert_int_equal(dp_crc32c(c, buf + a + cut, lens[i] - cut), want);
		}
}

/* A producer's trailer (dp_ipc_tx_crcs_fill()): frame i's CRC is the one the
 * dataplane would compute over bytes [i * stride, ...), whether the frames
 * are filled all at once or run by run as they are written. */
static void a_producers_crc_trailer_holds_each_frames_payload_crc(void **state)
{
	(void)state;
	static uint8_t buf[40000];
	const uint32_t len = 20001, stride = 8878, n = 3;
	for (uint32_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(i * 131u + (i >> 7));
	assert_int_equal(dp_ipc_tx_crcs_count(len, stride), n);
	assert_true(dp_ipc_tx_crcs_room(len, stride) == 20008 + 16 + 4 * n);
	assert_int_equal(dp_ipc_tx_crcs_fill(buf, len, stride, 0, 1), n);
	assert_int_equal(dp_ipc_tx_crcs_fill(buf, len, stride, 1, UINT32_MAX), n);
	const struct dp_tx_crcs *t = (const struct dp_tx_crcs *)(buf + dp_ipc_tx_crcs_off(len));
	assert_int_equal(t->magic, DP_TX_CRCS_MAGIC);
	assert_int_equal(t->stride, stride);
	assert_int_equal(t->n, n);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t at = i * stride, fl = len - at < stride ? len - at : stride;
		assert_int_equal(t->crc[i], dp_crc32c(0, buf + at, fl));
	}
	assert_int_equal(dp_ipc_tx_crcs_fill(buf, len, 0, 0, n), 0); /* no payload CRC on the link: none */
}

static void a_built_frame_parses_back_to_every_field(void **state)
{
	(void)state;
	uint8_t buf[2048];
	size_t len = make_frame(buf, 1000, DP_MT_KVPAGE);
	struct dp_wire_view v;
	assert_int_equal(dp_wire_parse(buf, len, len, 47474, &v), 0);
	assert_int_equal(v.h.type, DP_MT_KVPAGE);
	assert_int_equal(v.h.src_node, 1);
	assert_int_equal(v.h.dst_node, 2);
	assert_int_equal(v.h.stream, 7);
	assert_int_equal(v.h.payload_len, 1000);
	assert_true(v.h.src_epoch == 0x1122334455667788ull);
	assert_true(v.h.dst_epoch == 0x99);
	assert_true(v.h.msg_id == 42);
	assert_int_equal(v.h.seq, 0xfffffff0u);
	assert_int_equal(v.h.msg_len, 100000);
	assert_int_equal(v.h.frag_off, 8192);
	assert_int_equal(v.h.frag_idx, 1);
	assert_int_equal(v.h.frag_count, 13);
	assert_true(v.h.tsval == 123456789);
	assert_memory_equal(v.src.mac, A.mac, 6);
	assert_memory_equal(v.dst.mac, B.mac, 6);
	assert_int_equal(v.src.ip, A.ip);
	assert_int_equal(v.dst.ip, B.ip);
	assert_int_equal(v.payload_off, DP_FRAME_HLEN);
	assert_int_equal(dp_crc32c(0, buf + v.payload_off, 1000), v.h.payload_csum);
	/* The kvferry header sits where WIRE.md says, magic bytes "KVFR". */
	assert_memory_equal(buf + 42, "KVFR", 4);
}

static void every_single_bit_flip_in_the_ip_udp_or_kvferry_header_is_refused(void **state)
{
	(void)state;
	uint8_t buf[256];
	size_t len = make_frame(buf, 64, DP_MT_MBATCH);
	struct dp_wire_view v;
	/* IP (14..34), UDP length/dst port (38..40 excluded: src port/csum are free), kvferry header. */
	for (size_t byte = DP_ETH_HLEN; byte < DP_FRAME_HLEN; byte++) {
		if (byte >= 34 && byte < 36) /* UDP source port: any value is legal */
			continue;
		if (byte >= 40 && byte < 42) /* UDP checksum: unused (0) */
			continue;
		for (int bit = 0; bit < 8; bit++) {
			buf[byte] ^= (uint8_t)(1u << bit);
			int r = dp_wire_parse(buf, len, len, 47474, &v);
			buf[byte] ^= (uint8_t)(1u << bit);
			if (r == 0)
				fail_msg("flip of bit %d in byte %zu was accepted", bit, byte);
		}
	}
	assert_int_equal(dp_wire_parse(buf, len, len, 47474, &v), 0);
}

static void a_payload_bit_flip_is_caught_by_the_payload_crc(void **state)
{
	(void)state;
	uint8_t buf[2048];
	size_t len = make_frame(buf, 1500, DP_MT_MBATCH);
	struct dp_wire_view v;
	buf[DP_FRAME_HLEN + 777] ^= 0x10;
	assert_int_equal(dp_wire_parse(buf, len, len, 47474, &v), 0);
	assert_int_not_equal(dp_crc32c(0, buf + v.payload_off, v.h.payload_len), v.h.payload_csum);
}

/* A worker lcore fills in the payload CRC of a frame built without it:
 * the frame then parses with every other field as built and the CRC of its
 * payload, and is byte for byte the frame built with the CRC from the start. */
static void a_payload_crc_filled_in_later_makes_the_frame_built_with_it(void **state)
{
	(void)state;
	uint8_t want[2048], buf[2048];
	size_t len = make_frame(want, 1500, DP_MT_KVPAGE);
	struct dp_wire_view v, w;

	memcpy(buf, want, len);
	assert_int_equal(dp_wire_parse(want, len, len, 47474, &w), 0);
	/* as the main lcore leaves it: DP_WF_PCSUM, the CRC 0, the header CRC over that */
	w.h.payload_csum = 0;
	assert_int_equal(dp_wire_build(buf, &A, &B, &w.h), (int)DP_FRAME_HLEN);
	assert_int_equal(dp_wire_parse(buf, len, len, 47474, &v), 0);
	assert_int_equal(v.h.payload_csum, 0);

	dp_wire_set_payload_csum(buf, dp_crc32c(0, buf + DP_FRAME_HLEN, 1500));
	assert_int_equal(dp_wire_parse(buf, len, len, 47474, &v), 0);
	assert_int_equal(v.h.payload_csum, dp_crc32c(0, buf + v.payload_off, 1500));
	assert_memory_equal(buf, want, len);
	/* a damaged header is still refused after the refresh */
	buf[DP_KVF_OFF + 40] ^= 1;
	assert_int_equal(dp_wire_parse(buf, len, len, 47474, &v), DP_DROP_HDR_CSUM);
}

static void every_truncation_is_refused_without_reading_past_the_end(void **state)
{
	(void)state;
	uint8_t buf[512];
	size_t len = make_frame(buf, 200, DP_MT_CONTROL);
	struct dp_wire_view v;
	for (size_t l = 0; l < len; l++)
		assert_int_not_equal(dp_wire_parse(buf, l, l, 0, &v), 0);
	/* Ethernet padding after the IP datagram is legal. */
	assert_int_equal(dp_wire_parse(buf, len + 10, len + 10, 0, &v), 0);
}

static void another_port_and_inconsistent_fragments_are_refused(void **state)
{
	(void)state;
	uint8_t buf[512];
	size_t len = make_frame(buf, 100, DP_MT_MBATCH);
	struct dp_wire_view v;
	assert_int_equal(dp_wire_parse(buf, len, len, 1234, &v), DP_DROP_PORT);

	struct dp_wire_hdr h;
	memcpy(&h, buf + DP_KVF_OFF, sizeof(h));
	h.frag_idx = h.frag_count; /* out of range, CRC recomputed so only the field is wrong */
	dp_wire_build(buf, &A, &B, &h);
	assert_int_equal(dp_wire_parse(buf, len, len, 0, &v), DP_DROP_BAD_FIELD);

	h.frag_idx = 0;
	h.frag_off = h.msg_len - 10; /* payload runs past the message */
	dp_wire_build(buf, &A, &B, &h);
	assert_int_equal(dp_wire_parse(buf, len, len, 0, &v), DP_DROP_BAD_FIELD);

	h.frag_off = 0;
	h.type = DP_MT_MAX_;
	dp_wire_build(buf, &A, &B, &h);
	assert_int_equal(dp_wire_parse(buf, len, len, 0, &v), DP_DROP_BAD_FIELD);
}

static void an_ack_carries_its_body_and_a_short_ack_is_refused(void **state)
{
	(void)state;
	uint8_t buf[256];
	struct dp_wire_hdr h = {0};
	struct dp_wire_ack ack = {.cum_seq = 77, .msg_limit = 9, .ts_echo = 5, .sack = {3, 0, 0, 1}};
	h.type = DP_MT_ACK;
	int len = dp_wire_build_ctl(buf, &A, &B, &h, &ack, sizeof(ack));
	assert_int_equal(len, (int)(DP_FRAME_HLEN + sizeof(ack)));
	struct dp_wire_view v;
	struct dp_wire_ack got;
	assert_int_equal(dp_wire_parse(buf, len, len, 0, &v), 0);
	assert_int_equal(dp_wire_ack_read(buf, &v, &got), 0);
	assert_memory_equal(&got, &ack, sizeof(ack));

	/* A flipped SACK bit must not reach the sender. */
	buf[DP_FRAME_HLEN + 24] ^= 1;
	assert_int_equal(dp_wire_parse(buf, len, len, 0, &v), DP_DROP_PAYLOAD_CSUM);

	h.flags = 0;
	dp_wire_build_ctl(buf, &A, &B, &h, &ack, 8);
	assert_int_equal(dp_wire_parse(buf, DP_FRAME_HLEN + 8, DP_FRAME_HLEN + 8, 0, &v),
			 DP_DROP_BAD_FIELD);
}

static void a_frame_over_64_kib_cannot_be_built(void **state)
{
	(void)state;
	uint8_t buf[256];
	struct dp_wire_hdr h = {0};
	h.type = DP_MT_KVPAGE;
	h.payload_len = 65535;
	assert_int_equal(dp_wire_build(buf, &A, &B, &h), -EINVAL);
	assert_string_equal(dp_drop_reason_name(DP_DROP_HDR_CSUM), "hdr_csum");
	assert_string_equal(dp_drop_reason_name(1000), "?");
}

/* RSS needs entropy in the 4-tuple: every stream its own source port, the
 * same for every frame (and ACK) of it; a hello's is the node's port; the
 * destination port is the receiver's, and parse matches only that. */
static void each_stream_carries_its_own_udp_source_port_and_a_hello_the_nodes(void **state)
{
	(void)state;
	uint8_t buf[512];
	struct dp_wire_view v;
	uint16_t seen[64];

	for (uint16_t s = 0; s < 64; s++) {
		static const uint8_t types[] = {DP_MT_KVPAGE, DP_MT_CONTROL, DP_MT_ACK};

		for (size_t t = 0; t < sizeof(types); t++) {
			struct dp_wire_hdr h = {.type = types[t], .flags = DP_WF_PCSUM, .src_node = 1, .dst_node = 2,
						.stream = s, .msg_id = 1, .msg_len = 128, .frag_count = 1,
						.payload_len = 128};

			memset(buf + DP_FRAME_HLEN, 0, 128);
			h.payload_csum = dp_crc32c(0, buf + DP_FRAME_HLEN, 128);
			assert_int_equal(dp_wire_build(buf, &A, &B, &h), (int)DP_FRAME_HLEN);
			assert_int_equal(dp_wire_parse(buf, DP_FRAME_HLEN + 128, DP_FRAME_HLEN + 128, 47474, &v), 0);
			assert_int_equal(v.dst.port, 47474);
			assert_true(v.src.port >= 0xC000);
			if (t == 0)
				seen[s] = v.src.port;
			assert_int_equal(v.src.port, seen[s]); /* data and ACKs of a stream alike */
			for (uint16_t o = 0; o < s; o++)
				assert_int_not_equal(seen[o], seen[s]);
		}
	}
	{
		struct dp_wire_hdr h = {.type = DP_MT_HELLO, .flags = DP_WF_PCSUM, .src_node = 1, .dst_node = 2,
					.stream = 9, .payload_len = 0};

		h.payload_csum = dp_crc32c(0, buf + DP_FRAME_HLEN, 0);
		assert_int_equal(dp_wire_build(buf, &A, &B, &h), (int)DP_FRAME_HLEN);
		assert_int_equal(dp_wire_parse(buf, DP_FRAME_HLEN, DP_FRAME_HLEN, 47474, &v), 0);
		assert_int_equal(v.src.port, A.port);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(crc32c_matches_the_published_check_value),
		cmocka_unit_test(crc32c_agrees_with_the_definition_at_every_length_alignment_and_split),
		cmocka_unit_test(a_producers_crc_trailer_holds_each_frames_payload_crc),
		cmocka_unit_test(a_built_frame_parses_back_to_every_field),
		cmocka_unit_test(each_stream_carries_its_own_udp_source_port_and_a_hello_the_nodes),
		cmocka_unit_test(every_single_bit_flip_in_the_ip_udp_or_kvferry_header_is_refused),
		cmocka_unit_test(a_payload_bit_flip_is_caught_by_the_payload_crc),
		cmocka_unit_test(a_payload_crc_filled_in_later_makes_the_frame_built_with_it),
		cmocka_unit_test(every_truncation_is_refused_without_reading_past_the_end),
		cmocka_unit_test(another_port_and_inconsistent_fragments_are_refused),
		cmocka_unit_test(an_ack_carries_its_body_and_a_short_ack_is_refused),
		cmocka_unit_test(a_frame_over_64_kib_cannot_be_built),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
