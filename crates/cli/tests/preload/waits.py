#!/usr/bin/env python3
"""A client that waits for each answer in epoll, poll or select, beside a
kernel fd (a pipe), as event loops do: `waits.py MODE PORT ROUNDS`.

MODE `out`: a non-blocking writer instead, which sends ROUNDS blocks of
64 KiB (byte i of the stream is i*7 mod 251) to a slow reader, waiting
in epoll for EPOLLOUT whenever a write gets EAGAIN; prints how many waits
it made.

Connects to 127.0.0.1:PORT, then ROUNDS times: waits until the socket is
readable (MODE: epoll, poll or select, over the socket and the read end of
a pipe that never becomes readable), reads one 100-byte message and sends
it back reversed. Prints the SHA-256 of everything it read. Under `tcps
run` each wait blocks (the peer answers only after a pause), which is what
the test counts round trips of.
"""
import hashlib
import os
import select
import socket
import sys


def wait_readable(mode, s, r, ep):
    if mode == "epoll":
        while not any(fd == s.fileno() for fd, _ in ep.poll(5)):
            pass
    elif mode == "poll":
        p = select.poll()
        p.register(s, select.POLLIN)
        p.register(r, select.POLLIN)
        while not any(fd == s.fileno() for fd, _ in p.poll(5000)):
            pass
    else:
        while s not in select.select([s, r], [], [], 5)[0]:
            pass


def writer(s, rounds):
    # A small buffer (kernel sockets would otherwise autotune to MiBs and
    # take everything at once): the writer must wait for room.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
    s.setblocking(False)
    r, _ = os.pipe()
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLOUT)
    ep.register(r, select.EPOLLIN)
    block = bytes((i * 7) % 251 for i in range(251)) * 263
    total, waits, off = rounds * 65536, 0, 0
    while off < total:
        start = off % 251
        n = min(65536, total - off)
        try:
            off += s.send(block[start:start + n])
        except BlockingIOError:
            waits += 1
            while not any(fd == s.fileno() for fd, _ in ep.poll(5)):
                pass
    print("waits", waits, flush=True)
    s.setblocking(True)
    s.recv(1)


def main():
    mode, port, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    s = socket.create_connection(("127.0.0.1", port))
    if mode == "out":
        return writer(s, rounds)
    r, w = os.pipe()
    ep = None
    if mode == "epoll":
        ep = select.epoll()
        ep.register(s.fileno(), select.EPOLLIN)
        ep.register(r, select.EPOLLIN)
    h = hashlib.sha256()
    for _ in range(rounds):
        wait_readable(mode, s, r, ep)
        msg = b""
        while len(msg) < 100:
            part = s.recv(100 - len(msg))
            if not part:
                sys.exit("EOF")
            msg += part
        h.update(msg)
        s.sendall(msg[::-1])
    print(h.hexdigest(), flush=True)
    # Stay attached until the test has read the server's counters (it
    # kills us, or closes the connection).
    s.recv(1)


if __name__ == "__main__":
    main()
