#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/): a few valid and
near-valid inputs each. The layouts mirror transport/bootstrap/wire.h and transport/net/tcp/tcp_net.h
(little-endian x86-64). Re-run after changing a wire format."""
import os
import socket
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ID_MAGIC, HELLO_MAGIC, PEER_MAGIC = 0x44494C4E524B4D2E, 0x4F4C4C45484B4D2E, 0x524545504B4D2E2E
NONCE = 0x0123456789ABCDEF  # fuzz_bootstrap_wire's nonce
TCP_HELLO, TCP_MSG = 0x4D4B4845, 0x4D4B4D53


def sockaddr_in(port, ip="127.0.0.1"):
    raw = struct.pack("<H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton(ip)
    return raw.ljust(28, b"\0")  # union with sockaddr_in6


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def id_wire(magic=ID_MAGIC, version=1, port=29500):
    return (struct.pack("<QIIQ", magic, version, 0, NONCE) + sockaddr_in(port)).ljust(56, b"\0")


def hello(rank, nranks, nonce=NONCE, port=40000, magic=HELLO_MAGIC):
    return (struct.pack("<QIiiiQ", magic, 1, rank, nranks, 0, nonce) + sockaddr_in(port)).ljust(64, b"\0")


w = "fuzz_bootstrap_wire"
write(w, "id_valid", b"\0" + id_wire().ljust(128, b"\0"))
write(w, "id_truncated", b"\0" + id_wire()[:20])
write(w, "id_bad_version", b"\0" + id_wire(version=7))
write(w, "id_port_zero", b"\0" + id_wire(port=0))
write(w, "hello_first", b"\1" + hello(0, 2) + b"\0")
write(w, "hello_known_taken", b"\1" + hello(1, 4) + b"\x03\x00\x01\x00")
write(w, "hello_bad_nonce", b"\1" + hello(0, 2, nonce=5))
write(w, "hello_rank_out_of_range", b"\1" + hello(9, 2))
write(w, "peer_valid", b"\2" + struct.pack("<QQii", PEER_MAGIC, NONCE, 1, 0) + b"\x03")
write(w, "peer_negative_rank", b"\2" + struct.pack("<QQii", PEER_MAGIC, NONCE, -1, 0))
write(w, "frame_small", b"\3" + struct.pack("<iIQ", -1, 0, 64))
write(w, "frame_oversize", b"\3" + struct.pack("<iIQ", 3, 0, (1 << 30) + 1))
write(w, "table_two", b"\4" + sockaddr_in(1000) + sockaddr_in(1001))
write(w, "table_bad_family", b"\4" + sockaddr_in(1000) + b"\x07" + b"\0" * 27)

r = "fuzz_bootstrap_root"
write(r, "hello_foreign_nonce", hello(0, 2, nonce=1))
write(r, "hello_truncated", hello(0, 2)[:30])
write(r, "hello_bad_magic", hello(0, 2, magic=1))
write(r, "hello_huge_nranks", hello(0, 1 << 30))
write(r, "empty", b"")
write(r, "hello_then_junk", hello(1, 2) + b"\xff" * 100)

t = "fuzz_tcp_net"
write(t, "raw_garbage", b"\0" + b"GET / HTTP/1.0\r\n\r\n")
write(t, "raw_bad_magic_hello", b"\0" + struct.pack("<IHHHHIQQ", 0x12345678, 1, 0, 1, 0, 0, 0, 1))
write(t, "raw_hello_wrong_nonce", b"\0" + struct.pack("<IHHHHIQQ", TCP_HELLO, 1, 0, 1, 0, 0, 99, 1))
# mode 1: version, sockIndex, nSocks, connId (u16 each), then trailing bytes
write(t, "hello_valid", b"\1" + struct.pack("<HHHH", 1, 0, 1, 7))
write(t, "hello_bad_version", b"\1" + struct.pack("<HHHH", 2, 0, 1, 7))
write(t, "hello_bad_index", b"\1" + struct.pack("<HHHH", 1, 3, 1, 7) + b"junk")
# mode 2: n-1, then per receive (u16 posted size, i8 tag), then the stream
def msg(tag, payload, magic=TCP_MSG, size=None):
    return struct.pack("<IiQ", magic, tag, len(payload) if size is None else size) + payload
write(t, "stream_one_message", b"\2\0" + struct.pack("<Hb", 100, 5) + msg(5, bytes(range(100))))
write(t, "stream_grouped_two", b"\2\1" + struct.pack("<HbHb", 64, 1, 32, 2) + msg(2, b"b" * 32) + msg(1, b"a" * 60))
write(t, "stream_truncated", b"\2\0" + struct.pack("<Hb", 100, 5) + msg(5, b"x" * 40, size=100))
write(t, "stream_oversize", b"\2\0" + struct.pack("<Hb", 16, 5) + msg(5, b"y" * 64))
write(t, "stream_bad_magic", b"\2\0" + struct.pack("<Hb", 16, 5) + msg(5, b"z" * 16, magic=0xdead))
write(t, "stream_huge_size", b"\2\0" + struct.pack("<Hb", 16, 5) + msg(5, b"", size=1 << 62))
write(t, "stream_unknown_tag", b"\2\0" + struct.pack("<Hb", 16, 5) + msg(9, b"q" * 16))
# mode 3: as mode 2, then u16 = how many of the stream's last bytes go to socket 1 (4 KiB chunks:
# a message above 4 KiB sends its header and first chunk on socket 0, its second on socket 1)
write(t, "half_closed_idle", b"\3\0" + struct.pack("<HbH", 100, 5, 0))
data = bytes(i % 251 for i in range(8192))
write(t, "half_closed_striped", b"\3\0" + struct.pack("<HbH", 8192, 5, 4096) + msg(5, data[:4096]) + data[4096:])
write(t, "half_closed_short_stripe", b"\3\0" + struct.pack("<HbH", 8192, 5, 1000) + msg(5, data[:4096]) + data[4096:5096])
write(t, "half_closed_small_then_quiet", b"\3\0" + struct.pack("<HbH", 64, 7, 0) + msg(7, b"s" * 64))
