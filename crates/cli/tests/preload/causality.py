#!/usr/bin/env python3
"""Causality across connections (issue 14 item 7), driven against redis.

Three raw RESP connections: `c3` first (so redis gives it the lowest fd),
then `c1`, `c2`. Each round, with fresh keys:

    c1: BRPOPLPUSH A<i> TA<i> 1
    c2: BRPOPLPUSH B<i> TB<i> 1
    c3: LPUSH A<i> x; LPUSH B<i> y; RPOP A<i>; RPOP B<i>

c1's and c2's bytes are in redis' (or the tcps server's) kernel sockets
before c3 sends, so redis must read both blocking commands before c3's
pushes: both pushed elements go to the blocked clients, c3's RPOPs find
nothing, c1 gets x and c2 gets y. A redis that saw c3's bytes before one
of the earlier commands answers an RPOP with the element and leaves that
client blocked until its 1 s timeout: a failure, counted, not a hang.

Usage: causality.py PORT ROUNDS [PAUSE_US [GAP_US]]: PAUSE_US (300) between
rounds, GAP_US (20, busy-waited) between the blocking commands and the
pushes. Prints `rounds=N failures=F` (and the
first failures); exits 0 whatever the count (the test asserts on it).
"""

import socket
import sys
import time


def cmd(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.s.settimeout(5)
        self.f = self.s.makefile("rb")

    def send(self, b):
        self.s.sendall(b)

    def reply(self):
        """One RESP reply as bytes (nested arrays flattened)."""
        line = self.f.readline()
        if not line:
            raise EOFError("connection closed")
        if line[:1] == b"$":
            n = int(line[1:-2])
            if n < 0:
                return line
            return line + self.f.read(n + 2)
        if line[:1] == b"*":
            n = int(line[1:-2])
            return line + b"".join(self.reply() for _ in range(max(n, 0)))
        return line


def main():
    port, rounds = int(sys.argv[1]), int(sys.argv[2])
    pause = float(sys.argv[3]) / 1e6 if len(sys.argv) > 3 else 0.0003
    gap = float(sys.argv[4]) / 1e6 if len(sys.argv) > 4 else 0.00002
    c3 = Conn(port)
    c3.send(cmd("PING"))
    assert c3.reply() == b"+PONG\r\n"
    c1 = Conn(port)
    c1.send(cmd("PING"))
    assert c1.reply() == b"+PONG\r\n"
    c2 = Conn(port)
    c2.send(cmd("PING"))
    assert c2.reply() == b"+PONG\r\n"
    tag = "%d" % (time.time() * 1e6)
    failures = []
    for i in range(rounds):
        a, b = "A%s.%d" % (tag, i), "B%s.%d" % (tag, i)
        c1.send(cmd("BRPOPLPUSH", a, "T" + a, 1))
        c2.send(cmd("BRPOPLPUSH", b, "T" + b, 1))
        t = time.perf_counter()
        while time.perf_counter() - t < gap:
            pass
        c3.send(cmd("LPUSH", a, "x") + cmd("LPUSH", b, "y") + cmd("RPOP", a) + cmd("RPOP", b))
        got3 = b"".join(c3.reply() for _ in range(4))
        got1, got2 = c1.reply(), c2.reply()
        want3 = b":1\r\n:1\r\n$-1\r\n$-1\r\n"
        if (got3, got1, got2) != (want3, b"$1\r\nx\r\n", b"$1\r\ny\r\n"):
            failures.append((i, got3, got1, got2))
        # Let redis finish its replies (a write holds the socket's lock;
        # bytes arriving meanwhile wait in the kernel socket's backlog, so
        # even kernel sockets would show a later connection's bytes first).
        time.sleep(pause)
    print("rounds=%d failures=%d" % (rounds, len(failures)))
    for f in failures[:5]:
        print("round %d: c3=%r c1=%r c2=%r" % f)


if __name__ == "__main__":
    main()
