"""A prefork server and its client (cluster.rs, fork over the fabric).

serve PORT CHILDREN: the parent listens on 0.0.0.0:PORT, forks CHILDREN
children and never accepts; each child accepts connections and, for each,
reads a line "SIZE" and SIZE bytes, and answers "PID SHA256\n" (its own
pid and the payload's digest) followed by the payload. The parent prints
"LISTENING PID CHILD..." once the children run, then waits for them.

get HOST PORT SIZE SEED: sends SIZE pseudo-random bytes (from SEED),
checks the echo is those bytes and the digest theirs, and prints
"OK PID" (the child that served) or "BAD ..." with what differed.
"""

import hashlib
import os
import random
import socket
import sys


def read_exact(f, n):
    b = bytearray()
    while len(b) < n:
        chunk = f.read(n - len(b))
        if not chunk:
            break
        b += chunk
    return bytes(b)


def child(srv):
    while True:
        conn, _ = srv.accept()
        with conn:
            f = conn.makefile("rb")
            size = int(f.readline())
            payload = read_exact(f, size)
            head = "%d %s\n" % (os.getpid(), hashlib.sha256(payload).hexdigest())
            conn.sendall(head.encode() + payload)


def serve(port, children):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(64)
    pids = []
    for _ in range(children):
        pid = os.fork()
        if pid == 0:
            try:
                child(srv)
            finally:
                os._exit(0)
        pids.append(pid)
    print("LISTENING %d %s" % (os.getpid(), " ".join(map(str, pids))), flush=True)
    for pid in pids:
        os.waitpid(pid, 0)


def get(host, port, size, seed):
    payload = random.Random(seed).randbytes(size)
    s = socket.create_connection((host, port), timeout=30)
    s.sendall(b"%d\n" % size + payload)
    f = s.makefile("rb")
    head = f.readline().decode().split()
    back = read_exact(f, size)
    if len(head) != 2 or head[1] != hashlib.sha256(payload).hexdigest():
        print("BAD digest %r" % (head,))
    elif back != payload:
        print("BAD echo of %d bytes (%d back)" % (size, len(back)))
    else:
        print("OK %s" % head[0])


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), int(sys.argv[3]))
    else:
        get(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
