#!/usr/bin/env python3
# Writes the frame-parser corpus: ok-* frames the parser must accept and
# bad-* frames it must refuse (one defect each), plus the seeds the libFuzzer
# target starts from. Layout per dataplane/WIRE.md.
#   tests/dataplane/gen_corpus.py tests/dataplane/corpus
import os
import struct
import sys


def crc32c(data, crc=0):
    crc ^= 0xffffffff
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82f63b78 if crc & 1 else crc >> 1
    return crc ^ 0xffffffff


def ip_csum(h):
    s = sum(struct.unpack('!10H', h))
    while s >> 16:
        s = (s & 0xffff) + (s >> 16)
    return (~s) & 0xffff


def frame(mtype=1, payload=b'x' * 100, flags=1, msg_len=None, frag_off=0, frag_idx=0,
          frag_count=1, msg_id=1, seq=0, port=47474, version=1, magic=0x5246564b,
          break_hdr_csum=False, break_ip=False, ip_len_delta=0, udp_len_delta=0,
          payload_len=None, ethertype=0x0800, ihl=0x45, frag_field=0x4000):
    if msg_len is None:
        msg_len = len(payload)
    if payload_len is None:
        payload_len = len(payload)
    pcs = crc32c(payload) if flags & 1 else 0
    hdr = struct.pack('<IBBHHHHHQQQIIIIIIQI', magic, version, mtype, flags, 1, 2, 3,
                      payload_len, 0x100, 0x200, msg_id, seq, msg_len, frag_off, frag_idx,
                      frag_count, 0, 12345, pcs)
    hc = crc32c(hdr)
    if break_hdr_csum:
        hc ^= 1
    hdr += struct.pack('<I', hc)
    assert len(hdr) == 80
    udp_len = 8 + 80 + len(payload) + udp_len_delta
    udp = struct.pack('!HHHH', port, port, udp_len, 0)
    ip_len = 20 + 8 + 80 + len(payload) + ip_len_delta
    ip = bytearray(struct.pack('!BBHHHBBH4s4s', ihl, 0, ip_len, 0, frag_field, 64, 17, 0,
                               bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])))
    c = ip_csum(bytes(ip))
    if break_ip:
        c ^= 0x0100
    ip[10:12] = struct.pack('!H', c)
    eth = bytes([2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]) + struct.pack('!H', ethertype)
    return eth + bytes(ip) + udp + hdr + payload


def ack_body():
    return struct.pack('<IIQQ4Q', 17, 0, 9, 12345, 1, 0, 0, 0)


cases = {
    'ok-mbatch': frame(),
    'ok-kvpage-frag': frame(mtype=2, payload=b'k' * 1000, msg_len=5000, frag_off=2000,
                            frag_idx=2, frag_count=5),
    'ok-control-empty': frame(mtype=3, payload=b'', msg_len=0),
    'ok-ack': frame(mtype=4, payload=ack_body()),
    'ok-hello': frame(mtype=5, payload=b'hello'),
    'ok-padded': frame(payload=b'p') + b'\0' * 40,
    'bad-empty': b'',
    'bad-eth-only': frame()[:14],
    'bad-truncated-hdr': frame()[:100],
    'bad-ethertype': frame(ethertype=0x86dd),
    'bad-ip-options': frame(ihl=0x46),
    'bad-ip-fragment': frame(frag_field=0x2000),
    'bad-ip-csum': frame(break_ip=True),
    'bad-ip-len-long': frame(ip_len_delta=50),
    'bad-udp-len': frame(udp_len_delta=-4),
    'bad-port': frame(port=53),
    'bad-magic': frame(magic=0x12345678),
    'bad-version': frame(version=9),
    'bad-hdr-csum': frame(break_hdr_csum=True),
    'bad-type-zero': frame(mtype=0),
    'bad-type-high': frame(mtype=200),
    'bad-frag-idx': frame(frag_idx=3, frag_count=3),
    'bad-frag-count-zero': frame(frag_count=0),
    'bad-frag-past-msg': frame(payload=b'z' * 64, msg_len=100, frag_off=50),
    'bad-payload-len': frame(payload_len=99),
    'bad-msg-id-zero': frame(msg_id=0),
    'bad-ack-short': frame(mtype=4, payload=b'\0' * 8),
    'bad-ack-no-csum': frame(mtype=4, payload=ack_body(), flags=0),
    'bad-hello-body-csum': None,
}
h = bytearray(frame(mtype=5, payload=b'hello'))
h[-1] ^= 0x40
cases['bad-hello-body-csum'] = bytes(h)

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), 'corpus')
os.makedirs(out, exist_ok=True)
for name, data in cases.items():
    with open(os.path.join(out, name + '.bin'), 'wb') as f:
        f.write(data)
