"""Outgoing connections of a host with several servers (cluster_multi.rs).

serve PORT: an echo server on kernel sockets (0.0.0.0:PORT, a thread per
connection, echoes until EOF); prints "LISTENING" once it listens.

connect HOST PORT N SIZE [ROUNDS [HOLD_IP]]: ROUNDS times (1 by default;
before each round after the first it waits for a line on stdin), opens N
connections in sequence, each sending SIZE random bytes and reading the
echo to EOF; prints per connection "CONN ROUND I LOCAL_IP:LOCAL_PORT OK"
(the echo's SHA-256 is the payload's) or "CONN ROUND I LOCAL BAD what",
and after each round "ROUND R DONE". With HOLD_IP, after the first round
it opens connections until one's local address is HOLD_IP (at most 4,
the others closed) and keeps it, a thread blocked in its recv; prints
"HOLD LOCAL" and, when that recv ends, "HELD how UNIX_TIME" (how: EOF, the
errno's name, or "timeout"). Every socket call has a timeout (10 s, the
held one 60 s): nothing hangs.
"""

import errno

import hashlib
import os
import socket
import sys
import threading
import time


def echo(c):
    with c:
        while True:
            b = c.recv(65536)
            if not b:
                break
            c.sendall(b)
        c.shutdown(socket.SHUT_WR)


def serve(port):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(64)
    print("LISTENING", flush=True)
    while True:
        c, _ = srv.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()


def one(host, port, size):
    """One connection: (local address, None) or (local or "-", what failed)."""
    local = "-"
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect((host, port))
        local = "%s:%d" % s.getsockname()
        payload = os.urandom(size)
        failed = []

        def send():
            try:
                s.sendall(payload)
                s.shutdown(socket.SHUT_WR)
            except OSError as e:
                failed.append(e)

        sender = threading.Thread(target=send)
        sender.start()
        back = bytearray()
        while True:
            b = s.recv(65536)
            if not b:
                break
            back += b
        sender.join()
        s.close()
        if failed:
            raise failed[0]
    except OSError as e:
        return local, "%s (errno %s)" % (e, e.errno)
    if hashlib.sha256(back).digest() != hashlib.sha256(payload).digest():
        return local, "echo of %d bytes differs (%d back)" % (size, len(back))
    return local, None


def held(s):
    try:
        b = s.recv(1)
        how = "EOF" if not b else "DATA"
    except socket.timeout:
        how = "timeout"
    except OSError as e:
        how = errno.errorcode.get(e.errno, str(e.errno))
    print("HELD %s %.3f" % (how, time.time()), flush=True)


def hold(host, port, ip):
    for _ in range(4):
        s = socket.create_connection((host, port), timeout=10)
        local = s.getsockname()
        if local[0] == ip:
            s.settimeout(60)
            print("HOLD %s:%d" % local, flush=True)
            threading.Thread(target=held, args=(s,), daemon=True).start()
            return s
        s.close()
    print("HOLD none from %s" % ip, flush=True)


def connect(host, port, n, size, rounds, hold_ip):
    kept = None
    for r in range(rounds):
        if r:
            if hold_ip and kept is None:
                kept = hold(host, port, hold_ip)
            sys.stdin.readline()
        for i in range(n):
            local, bad = one(host, port, size)
            state = "OK" if bad is None else "BAD " + bad
            print("CONN %d %d %s %s" % (r, i, local, state), flush=True)
        print("ROUND %d DONE" % r, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        a = sys.argv[2:]
        rounds = int(a[4]) if len(a) > 4 else 1
        hold_ip = a[5] if len(a) > 5 else None
        connect(a[0], int(a[1]), int(a[2]), int(a[3]), rounds, hold_ip)
