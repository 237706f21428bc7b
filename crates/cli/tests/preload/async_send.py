"""Sends under `tcps run` (asynchronous sends) against kernel sockets:
prints the same on both. Modes:

  stream            many small writes of a checksummed stream, then close at
                    once: the peer must get every byte
  nonblock          a non-blocking writer fills the send queue (EAGAIN), sees
                    no POLLOUT while nobody reads, then POLLOUT once the peer
                    reads, writes again; the total arrives intact
  reset ignore|dfl  writes after the peer reset: EPIPE or ECONNRESET within a
                    few calls (ignore), or death by SIGPIPE (dfl)
  writes PORT N     N writes of 100 bytes to PORT, then sleep (the test reads
                    `tcps stat` meanwhile)
"""
import hashlib
import os
import random
import select
import signal
import socket
import sys
import threading
import time


def listener():
    l = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", 0))
    l.listen(4)
    return l


def pair():
    l = listener()
    c = socket.create_connection(l.getsockname())
    a, _ = l.accept()
    l.close()
    return c, a


def drain(sock, out):
    h = hashlib.sha256()
    n = 0
    while True:
        b = sock.recv(65536)
        if not b:
            break
        h.update(b)
        n += len(b)
    out.append((n, h.hexdigest()))


def stream():
    c, a = pair()
    got = []
    t = threading.Thread(target=drain, args=(a, got))
    t.start()
    rng = random.Random(14)
    h = hashlib.sha256()
    n = 0
    for _ in range(20000):
        k = rng.randint(1, 400)
        b = bytes(rng.getrandbits(8) for _ in range(8)) * (k // 8 + 1)
        b = b[:k]
        c.sendall(b)
        h.update(b)
        n += k
    c.close()
    t.join(60)
    print("stream sent", n, "received", got[0][0], "match", got[0] == (n, h.hexdigest()))


def nonblock():
    c, a = pair()
    c.setblocking(False)
    chunk = bytes(range(256)) * 16
    h = hashlib.sha256()
    n = 0
    p = select.poll()
    p.register(c, select.POLLOUT)
    # Fill until EAGAIN and no POLLOUT within 100 ms: everything between
    # here and the peer is full (under tcps a first EAGAIN may only mean a
    # full send queue that the server is still draining).
    while True:
        try:
            k = c.send(chunk)
        except BlockingIOError:
            if not any(e & select.POLLOUT for _, e in p.poll(100)):
                break
            continue
        h.update(chunk[:k])
        n += k
    print("filled: EAGAIN")
    ev = p.poll(300)
    print("pollout while nobody reads:", any(e & select.POLLOUT for _, e in ev))
    got = []
    t = threading.Thread(target=drain, args=(a, got))
    t.start()
    ev = p.poll(10000)
    print("pollout once the peer reads:", any(e & select.POLLOUT for _, e in ev))
    k = c.send(chunk)
    print("write after pollout:", k > 0)
    h.update(chunk[:k])
    n += k
    # The rest, as an event loop would: poll, write, EAGAIN, poll again.
    # A write after POLLOUT never gets EAGAIN (else a loop would spin).
    eagain_after_pollout = 0
    for _ in range(2000):
        polled = False
        while True:
            try:
                k = c.send(chunk)
                break
            except BlockingIOError:
                if polled:
                    eagain_after_pollout += 1
                ev = p.poll(10000)
                polled = any(e & select.POLLOUT for _, e in ev)
        h.update(chunk[:k])
        n += k
    c.close()
    t.join(60)
    print("EAGAIN right after POLLOUT:", eagain_after_pollout)
    print("nonblock total intact:", got[0] == (n, h.hexdigest()))


def reset(mode):
    if mode == "dfl":
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    c, a = pair()
    c.sendall(b"hello")
    a.recv(5)
    # Close with a reset (SO_LINGER 0).
    a.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    a.close()
    time.sleep(0.2)
    errors = []
    for i in range(50):
        try:
            c.send(b"x" * 100)
        except ConnectionResetError:
            errors.append("ECONNRESET")
        except BrokenPipeError:
            errors.append("EPIPE")
            break
        time.sleep(0.01)
    print("broken:", "EPIPE" in errors, "within a few calls:", i < 10)


def writes(port, n):
    c = socket.create_connection(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(n):
        c.send(b"y" * 100)
    print("written", flush=True)
    time.sleep(30)


def main():
    mode = sys.argv[1]
    if mode == "stream":
        stream()
    elif mode == "nonblock":
        nonblock()
    elif mode == "reset":
        reset(sys.argv[2])
    elif mode == "writes":
        writes(int(sys.argv[2]), int(sys.argv[3]))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
