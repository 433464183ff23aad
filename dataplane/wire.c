/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Frame build and parse (see dp_wire.h, WIRE.md). Pure C, no DPDK: the
 * fuzz target and the corpus test link this file alone.
 *
 * Invariant: dp_wire_parse() reads only [frame, frame + hdr_len) and never
 * trusts a length field before checking it against both len and hdr_len.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "dp_crc32c.h"
#include "dp_wire.h"

static const char *const drop_names[DP_DROP_MAX_] = {
	[DP_DROP_NONE] = "none",
	[DP_DROP_SHORT] = "short",
	[DP_DROP_NOT_IP4UDP] = "not_ip4udp",
	[DP_DROP_PORT] = "port",
	[DP_DROP_MAGIC] = "magic",
	[DP_DROP_HDR_CSUM] = "hdr_csum",
	[DP_DROP_BAD_FIELD] = "bad_field",
	[DP_DROP_PAYLOAD_CSUM] = "payload_csum",
	[DP_DROP_NOT_FOR_US] = "not_for_us",
	[DP_DROP_UNKNOWN_PEER] = "unknown_peer",
	[DP_DROP_STALE_EPOCH] = "stale_epoch",
	[DP_DROP_DUP] = "dup",
	[DP_DROP_WINDOW] = "window",
	[DP_DROP_NOBUF] = "nobuf",
	[DP_DROP_IMPAIR] = "impair",
	[DP_DROP_TXFULL] = "txfull",
};

const char *dp_drop_reason_name(unsigned r)
{
	return r < DP_DROP_MAX_ ? drop_names[r] : "?";
}

/* CRC32C: dp_crc32c.h, shared with the producers that compute their frames' CRCs. */
uint32_t dp_crc32c(uint32_t crc, const void *buf, size_t len)
{
	return dp_ipc_crc32c(crc, buf, len);
}

static uint16_t get_be16(const uint8_t *p)
{
	return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t get_be32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void put_be16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static uint16_t ip4_csum(const uint8_t *ip)
{
	uint32_t sum = 0;
	for (unsigned i = 0; i < DP_IP4_HLEN; i += 2)
		sum += get_be16(ip + i);
	while (sum >> 16)
		sum = (sum & 0xffffu) + (sum >> 16);
	return (uint16_t)~sum;
}

static uint32_t hdr_crc(const struct dp_wire_hdr *h)
{
	return dp_crc32c(0, h, offsetof(struct dp_wire_hdr, hdr_csum));
}

int dp_wire_build(void *buf, const struct dp_wire_addr *src, const struct dp_wire_addr *dst,
		  struct dp_wire_hdr *h)
{
	uint8_t *f = buf;
	size_t flen = (size_t)DP_FRAME_HLEN + h->payload_len;
	if (flen > DP_FRAME_MAX)
		return -EINVAL;

	memcpy(f, dst->mac, 6);
	memcpy(f + 6, src->mac, 6);
	put_be16(f + 12, 0x0800);

	uint8_t *ip = f + DP_ETH_HLEN;
	ip[0] = 0x45;
	ip[1] = 0;
	put_be16(ip + 2, (uint16_t)(flen - DP_ETH_HLEN));
	put_be16(ip + 4, 0);      /* id: never fragmented */
	put_be16(ip + 6, 0x4000); /* DF */
	ip[8] = 64;
	ip[9] = 17;
	put_be16(ip + 10, 0);
	put_be32(ip + 12, src->ip);
	put_be32(ip + 16, dst->ip);
	put_be16(ip + 10, ip4_csum(ip));

	uint8_t *udp = ip + DP_IP4_HLEN;
	put_be16(udp, dp_wire_sport(src->port, h));
	put_be16(udp + 2, dst->port);
	put_be16(udp + 4, (uint16_t)(flen - DP_ETH_HLEN - DP_IP4_HLEN));
	put_be16(udp + 6, 0); /* no UDP checksum: see dp_wire.h */

	h->magic = DP_WIRE_MAGIC;
	h->version = DP_WIRE_VERSION;
	h->reserved = 0;
	h->hdr_csum = hdr_crc(h);
	memcpy(f + DP_KVF_OFF, h, sizeof(*h));
	return (int)DP_FRAME_HLEN;
}

void dp_wire_set_payload_csum(void *buf, uint32_t payload_csum)
{
	uint8_t *kvf = (uint8_t *)buf + DP_KVF_OFF;
	struct dp_wire_hdr h;

	memcpy(&h, kvf, sizeof(h)); /* the frame may be unaligned */
	h.payload_csum = payload_csum;
	h.hdr_csum = hdr_crc(&h);
	/* payload_csum then hdr_csum: the header's last 8 bytes */
	memcpy(kvf + offsetof(struct dp_wire_hdr, payload_csum), &h.payload_csum, sizeof(h.payload_csum));
	memcpy(kvf + offsetof(struct dp_wire_hdr, hdr_csum), &h.hdr_csum, sizeof(h.hdr_csum));
}

int dp_wire_parse(const void *frame, size_t len, size_t hdr_len, uint16_t port,
		  struct dp_wire_view *out)
{
	const uint8_t *f = frame;
	if (hdr_len > len)
		hdr_len = len;
	if (hdr_len < DP_FRAME_HLEN)
		return DP_DROP_SHORT;
	if (get_be16(f + 12) != 0x0800)
		return DP_DROP_NOT_IP4UDP;

	const uint8_t *ip = f + DP_ETH_HLEN;
	if (ip[0] != 0x45 || ip[9] != 17)
		return DP_DROP_NOT_IP4UDP;
	if ((get_be16(ip + 6) & 0x3fffu) != 0) /* MF set or fragment offset: refuse */
		return DP_DROP_NOT_IP4UDP;
	if (ip4_csum(ip) != 0) /* a correct header sums to 0xffff, complemented 0 */
		return DP_DROP_NOT_IP4UDP;
	size_t ip_len = get_be16(ip + 2);
	if (ip_len < DP_IP4_HLEN + DP_UDP_HLEN + DP_KVF_HLEN || ip_len + DP_ETH_HLEN > len)
		return DP_DROP_NOT_IP4UDP;

	const uint8_t *udp = ip + DP_IP4_HLEN;
	size_t udp_len = get_be16(udp + 4);
	if (udp_len != ip_len - DP_IP4_HLEN)
		return DP_DROP_NOT_IP4UDP;
	uint16_t dport = get_be16(udp + 2);
	if (port && dport != port)
		return DP_DROP_PORT;

	struct dp_wire_hdr h;
	memcpy(&h, f + DP_KVF_OFF, sizeof(h));
	if (h.magic != DP_WIRE_MAGIC || h.version != DP_WIRE_VERSION)
		return DP_DROP_MAGIC;
	if (hdr_crc(&h) != h.hdr_csum)
		return DP_DROP_HDR_CSUM;
	if (h.type == 0 || h.type >= DP_MT_MAX_ || h.reserved != 0)
		return DP_DROP_BAD_FIELD;
	if ((size_t)h.payload_len != udp_len - DP_UDP_HLEN - DP_KVF_HLEN)
		return DP_DROP_BAD_FIELD;
	if (h.type == DP_MT_ACK || h.type == DP_MT_HELLO) {
		/* A control body is acted on as a whole (a flipped SACK bit would
		 * make the sender skip a frame forever): it must be contiguous
		 * and carry its CRC. */
		if (h.type == DP_MT_ACK && h.payload_len < sizeof(struct dp_wire_ack))
			return DP_DROP_BAD_FIELD;
		if (hdr_len < (size_t)DP_FRAME_HLEN + h.payload_len || !(h.flags & DP_WF_PCSUM))
			return DP_DROP_BAD_FIELD;
		if (dp_crc32c(0, f + DP_FRAME_HLEN, h.payload_len) != h.payload_csum)
			return DP_DROP_PAYLOAD_CSUM;
	} else {
		if (h.frag_count == 0 || h.frag_idx >= h.frag_count || h.msg_id == 0)
			return DP_DROP_BAD_FIELD;
		if ((uint64_t)h.frag_off + h.payload_len > h.msg_len)
			return DP_DROP_BAD_FIELD;
		if (h.msg_len > 0 && h.payload_len == 0)
			return DP_DROP_BAD_FIELD;
	}

	out->h = h;
	memcpy(out->dst.mac, f, 6);
	memcpy(out->src.mac, f + 6, 6);
	out->src.ip = get_be32(ip + 12);
	out->dst.ip = get_be32(ip + 16);
	out->src.port = get_be16(udp);
	out->dst.port = dport;
	out->payload_off = DP_FRAME_HLEN;
	return DP_DROP_NONE;
}

int dp_wire_build_ctl(void *buf, const struct dp_wire_addr *src, const struct dp_wire_addr *dst,
		      struct dp_wire_hdr *h, const void *body, uint16_t body_len)
{
	if ((size_t)DP_FRAME_HLEN + body_len > DP_FRAME_MAX)
		return -EINVAL;
	memcpy((uint8_t *)buf + DP_FRAME_HLEN, body, body_len);
	h->payload_len = body_len;
	h->flags |= DP_WF_PCSUM;
	h->payload_csum = dp_crc32c(0, (uint8_t *)buf + DP_FRAME_HLEN, body_len);
	int r = dp_wire_build(buf, src, dst, h);
	return r < 0 ? r : r + body_len;
}

int dp_wire_ack_read(const void *frame, const struct dp_wire_view *v, struct dp_wire_ack *ack)
{
	if (v->h.type != DP_MT_ACK || v->h.payload_len < sizeof(*ack))
		return DP_DROP_BAD_FIELD;
	memcpy(ack, (const uint8_t *)frame + v->payload_off, sizeof(*ack));
	return 0;
}
