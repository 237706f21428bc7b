#!/usr/bin/env python3
"""A threaded echo server for the balancing tests: port, then options.
--conns N      exit after N connections were echoed to EOF
--delay S      sleep S seconds after listen() before the first accept
               (clients' bytes then wait in the kernel or a ring first)
--no-balance   setsockopt(SOL_TCPS, TCPS_BALANCE, 0) on the listener
--nonblocking  accept from a non-blocking listener with select()
Each connection: echo until EOF, then shutdown and close. At exit it prints
one line per connection: `conn <peer port> <bytes> <sha256>`, so the test
can also check what the program itself saw."""
import hashlib
import select
import socket
import sys
import threading
import time

SOL_TCPS = 0x74637073
TCPS_BALANCE = 5

port = int(sys.argv[1])
args = sys.argv[2:]
conns = int(args[args.index("--conns") + 1]) if "--conns" in args else 1
delay = float(args[args.index("--delay") + 1]) if "--delay" in args else 0.0

lock = threading.Lock()
seen = []


def echo(c, peer):
    h = hashlib.sha256()
    n = 0
    while True:
        b = c.recv(65536)
        if not b:
            break
        h.update(b)
        n += len(b)
        c.sendall(b)
    c.shutdown(socket.SHUT_WR)
    c.close()
    with lock:
        seen.append((peer[1], n, h.hexdigest()))


ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if "--no-balance" in args:
    ls.setsockopt(SOL_TCPS, TCPS_BALANCE, 0)
    assert ls.getsockopt(SOL_TCPS, TCPS_BALANCE) == 0
ls.bind(("127.0.0.1", port))
ls.listen(128)
print("listening", flush=True)
if delay:
    time.sleep(delay)
if "--nonblocking" in args:
    ls.setblocking(False)
threads = []
while len(threads) < conns:
    if "--nonblocking" in args:
        select.select([ls], [], [])
        try:
            c, peer = ls.accept()
        except BlockingIOError:
            continue
        c.setblocking(True)
    else:
        c, peer = ls.accept()
    t = threading.Thread(target=echo, args=(c, peer))
    t.start()
    threads.append(t)
for t in threads:
    t.join()
for p, n, d in sorted(seen):
    print("conn", p, n, d, flush=True)
