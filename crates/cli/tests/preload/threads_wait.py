#!/usr/bin/env python3
"""Threads that each wait in poll(2) for their own socket beside a pipe:
`threads_wait.py PORT THREADS ROUNDS`.

Each of THREADS threads connects to 127.0.0.1:PORT and ROUNDS times waits
until its socket is readable (poll over the socket and the read end of a
pipe that never becomes readable), reads one 100-byte message and sends it
back reversed. The peer answers the threads in turn, so most of them are
asleep at any moment: under `tcps run` each should sleep on a host
doorbell of its own, with no call parked at the server."""
import select
import socket
import sys
import threading

port, threads, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])


def run():
    s = socket.create_connection(("127.0.0.1", port))
    import os
    r, _ = os.pipe()
    p = select.poll()
    p.register(s, select.POLLIN)
    p.register(r, select.POLLIN)
    for _ in range(rounds):
        while not any(fd == s.fileno() for fd, _ in p.poll(5000)):
            pass
        msg = b""
        while len(msg) < 100:
            b = s.recv(100 - len(msg))
            if not b:
                return
            msg += b
        s.sendall(msg[::-1])
    s.recv(1)  # the peer's close: it reads the counters before


ts = [threading.Thread(target=run) for _ in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print("done", flush=True)
