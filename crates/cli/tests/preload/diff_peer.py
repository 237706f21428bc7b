"""The network side of the differential test (diff_model.py): a process on
kernel sockets that owns the far ends of the model's connections and does
to them what the model asks, one command per line on a Unix socket, one
answer line each: `diff_peer.py UNIX_PATH`.

Commands (ids number connections in the order they were made):
  listen              -> port of a fresh listener the model may connect to
  accept              -> id of the next connection to that listener
  connect PORT        -> id of a new connection to the model's listener PORT
  send ID N           -> N (N bytes, byte i of the stream is (i*7+ID) % 251)
  read ID N           -> count and SHA-256 prefix of up to N bytes, reading
                         until N bytes, the end, or 300 ms of silence
  drain ID            -> `ok` after reading everything until 300 ms of silence
  shutdown ID         -> ok (SHUT_WR: a FIN)
  reset ID            -> ok (SO_LINGER 0 and close: an RST)
  close ID            -> ok
"""
import hashlib
import os
import select
import socket
import struct
import sys

conns = {}
sent = {}
listener = None


def stream(cid, start, n):
    return bytes(((i * 7 + cid) % 251) for i in range(start, start + n))


def read_some(s, n, quiet=0.3):
    got = b""
    while len(got) < n:
        r, _, _ = select.select([s], [], [], quiet)
        if not r:
            break
        try:
            b = s.recv(min(65536, n - len(got)))
        except OSError as e:
            return got, e.errno
        if not b:
            break
        got += b
    return got, 0


def handle(words):
    global listener
    cmd = words[0]
    if cmd == "listen":
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        return str(listener.getsockname()[1])
    if cmd == "accept":
        c, _ = listener.accept()
        conns[len(conns)] = c
        return str(len(conns) - 1)
    if cmd == "connect":
        c = socket.create_connection(("127.0.0.1", int(words[1])), timeout=5)
        c.settimeout(None)
        conns[len(conns)] = c
        return str(len(conns) - 1)
    cid = int(words[1])
    c = conns[cid]
    if cmd == "send":
        n = int(words[2])
        start = sent.get(cid, 0)
        try:
            c.sendall(stream(cid, start, n))
        except OSError as e:
            return "err %d" % e.errno
        sent[cid] = start + n
        return str(n)
    if cmd == "read":
        got, err = read_some(c, int(words[2]))
        return "%d %s err %d" % (len(got), hashlib.sha256(got).hexdigest()[:16], err)
    if cmd == "drain":
        while True:
            got, err = read_some(c, 1 << 30)
            if not got or err:
                return "ok"
    if cmd == "shutdown":
        try:
            c.shutdown(socket.SHUT_WR)
        except OSError as e:
            return "err %d" % e.errno
        return "ok"
    if cmd == "reset":
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
        return "ok"
    if cmd == "close":
        c.close()
        return "ok"
    return "unknown"


def main():
    path = sys.argv[1]
    if os.path.exists(path):
        os.unlink(path)
    u = socket.socket(socket.AF_UNIX)
    u.bind(path)
    u.listen(1)
    while True:
        m, _ = u.accept()
        f = m.makefile("rw")
        for line in f:
            f.write(handle(line.split()) + "\n")
            f.flush()
        m.close()


main()
