"""Clears its environment (os.environ.clear() calls unsetenv for every
variable), then serves and connects over TCP: one connection to itself
(listen, connect, accept) and one to the echo server at argv[1]:argv[2].
Prints 'ok <bytes>' when every byte came back; on a failed socket call
prints 'error <errno name>' and exits 3. With a third argument 'exec' it
first execs itself with an environment that holds LD_PRELOAD only (the
settings must reach the new image all the same)."""

import errno
import hashlib
import os
import socket
import sys
import threading

if sys.argv[3:] == ["exec"]:
    keep = {"LD_PRELOAD": os.environ["LD_PRELOAD"]}
    os.environ.clear()
    os.execve(sys.executable, [sys.executable, __file__] + sys.argv[1:3], keep)

os.environ.clear()
assert "TCPS_SOCKET" not in os.environ and os.getenv("TCPS_FALLBACK") is None

N = 1 << 20
data = os.urandom(N)


def send_all_then_eof(s):
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)


def recv_to_eof(s):
    got = bytearray()
    while True:
        b = s.recv(65536)
        if not b:
            return bytes(got)
        got += b


def check(got, what):
    if hashlib.sha256(got).digest() != hashlib.sha256(data).digest():
        print(f"{what}: wrong bytes ({len(got)} of {N})")
        sys.exit(2)


try:
    # Served: a listener, a connection to it, the accepted end.
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen()
    c = socket.create_connection(l.getsockname())
    a, _ = l.accept()
    t = threading.Thread(target=send_all_then_eof, args=(c,))
    t.start()
    check(recv_to_eof(a), "self connection")
    t.join()
    # Connected: through the echo server (kernel sockets of the test).
    e = socket.create_connection((sys.argv[1], int(sys.argv[2])))
    t = threading.Thread(target=send_all_then_eof, args=(e,))
    t.start()
    check(recv_to_eof(e), "echo")
    t.join()
except OSError as ex:
    print("error", errno.errorcode.get(ex.errno, ex.errno))
    sys.exit(3)
print("ok", 2 * N)
