"""sendfile under `tcps run` (asynchronous file sends, issue 14 item 2)
against kernel sockets: prints the same on both. Modes:

  stream DIR        small writes (send, writev, sendmsg) interleaved with
                    sendfile/sendfile64 of several files in DIR, with and
                    without an offset pointer, at several offsets, counts
                    past the end of file; prints every return value and the
                    file offsets after each call, and whether the peer got
                    exactly the expected stream (checksum)
  nonblock DIR      a non-blocking sendfile of a big file to a peer that does
                    not read: a short count or EAGAIN, then all of it once
                    the peer reads; the stream arrives intact
  reset DIR         sendfile after the peer reset: EPIPE or ECONNRESET within
                    a few calls (SIGPIPE ignored)
  rt PORT N DIR     N responses to PORT, each a writev of headers and a
                    sendfile of a 16 KiB file, each after a one-byte request
                    (the test reads `tcps stat` meanwhile)
"""
import ctypes
import hashlib
import os
import random
import select
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from async_send import drain, pair  # noqa: E402

libc = ctypes.CDLL(None, use_errno=True)
for name in ("sendfile", "sendfile64"):
    f = getattr(libc, name)
    f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t]
    f.restype = ctypes.c_ssize_t

SIZES = {"empty": 0, "small": 1000, "medium": 70000, "big": 300000, "page": 16384}


def make_files(d):
    """Deterministic files in `d`: name -> (path, bytes)."""
    files = {}
    for i, (name, size) in enumerate(sorted(SIZES.items())):
        data = random.Random(i).randbytes(size)
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(data)
        files[name] = (path, data)
    return files


def drain_after(sock, out, start):
    """`drain` once `start` is set (the peer does not read before)."""
    start.wait()
    drain(sock, out)


def c_sendfile(fn, out, fd, off, count):
    """sendfile through libc (NULL offset when `off` is None): (ret or
    -errno, offset after)."""
    p = None if off is None else ctypes.c_int64(off)
    r = getattr(libc, fn)(out, fd, None if p is None else ctypes.byref(p), count)
    if r < 0:
        r = -ctypes.get_errno()
    return r, None if p is None else p.value


def pos(fd):
    return os.lseek(fd, 0, os.SEEK_CUR)


def stream(d):
    files = make_files(d)
    c, a = pair()
    got = []
    t = threading.Thread(target=drain, args=(a, got))
    t.start()
    out = c.fileno()
    h = hashlib.sha256()
    total = 0
    fds = {name: os.open(path, os.O_RDONLY) for name, (path, _) in files.items()}

    def sent(name, start, n):
        nonlocal total
        if n > 0:
            h.update(files[name][1][start:start + n])
            total += n

    def write(b, how):
        nonlocal total
        if how == 0:
            n = c.send(b)
        elif how == 1:
            n = os.writev(out, [b[:3], b[3:]])
        else:
            n = c.sendmsg([b])
        assert n == len(b), (n, len(b))
        h.update(b)
        total += n

    step = 0
    for rnd in range(3):
        for name in sorted(files):
            fd = fds[name]
            size = len(files[name][1])
            for start, count in [(0, size), (7, 100), (size // 2, size), (max(size - 10, 0), 1000),
                                 (size + 5, 100), (3, 0)]:
                write(b"hdr %d %s %d %d\r\n" % (step, name.encode(), start, count), step % 3)
                step += 1
                kind = (step + rnd) % 4
                if kind == 0:
                    # Python's os.sendfile: an offset pointer; the file
                    # position must not move.
                    os.lseek(fd, 1, os.SEEK_SET)
                    n = os.sendfile(out, fd, start, count)
                    sent(name, start, n)
                    print(f"{name} os.sendfile({start}, {count}) = {n} pos {pos(fd)}")
                elif kind in (1, 2):
                    # NULL offset: from the file position, which moves.
                    os.lseek(fd, min(start, size + 5), os.SEEK_SET)
                    fn = "sendfile" if kind == 1 else "sendfile64"
                    n, _ = c_sendfile(fn, out, fd, None, count)
                    sent(name, min(start, size + 5), n)
                    print(f"{name} {fn}(NULL@{start}, {count}) = {n} pos {pos(fd)}")
                else:
                    # A pointer: *offset moves, the position does not.
                    os.lseek(fd, 2, os.SEEK_SET)
                    n, after = c_sendfile("sendfile64", out, fd, start, count)
                    sent(name, start, n)
                    print(f"{name} sendfile64(&{start}, {count}) = {n} off {after} pos {pos(fd)}")
    # Two sendfiles back to back, then a write: order kept.
    fd = fds["big"]
    n1, _ = c_sendfile("sendfile", out, fd, 1000, 5000)
    n2, _ = c_sendfile("sendfile", out, fd, 0, 1000)
    sent("big", 1000, n1)
    sent("big", 0, n2)
    write(b"trailer\n", 0)
    print(f"back to back: {n1} {n2}")
    # The FIN follows every queued byte and range.
    c.shutdown(socket.SHUT_WR)
    t.join()
    c.close()
    print(f"total {total} got {got[0][0]} match {got[0] == (total, h.hexdigest())}")


def nonblock(d):
    big = os.path.join(d, "huge")
    data = random.Random(99).randbytes(24 << 20)
    with open(big, "wb") as f:
        f.write(data)
    c, a = pair()
    c.setblocking(False)
    got = []
    go = threading.Event()
    t = threading.Thread(target=drain_after, args=(a, got, go))
    t.start()
    fd = os.open(big, os.O_RDONLY)
    off = 0
    saw_eagain = False
    saw_short = False
    while off < len(data):
        n, after = c_sendfile("sendfile64", c.fileno(), fd, off, len(data) - off)
        if n == -11:
            saw_eagain = True
            go.set()  # the peer reads from now on
            select.select([], [c], [], 10)
            continue
        assert n > 0, n
        if n < len(data) - off:
            saw_short = True
        assert after == off + n, (after, off, n)
        off += n
    c.close()
    go.set()
    t.join()
    h = hashlib.sha256(data).hexdigest()
    print(f"short count or EAGAIN before the peer read: {saw_eagain or saw_short}")
    print(f"total intact: {got[0] == (len(data), h)}")
    if os.environ.get("SFDEBUG"): print(got, len(data), h, file=sys.stderr)


def reset(d):
    files = make_files(d)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    c, a = pair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    a.close()  # RST
    time.sleep(0.2)
    fd = os.open(files["page"][0], os.O_RDONLY)
    calls = 0
    err = None
    for i in range(20):
        calls += 1
        n, _ = c_sendfile("sendfile64", c.fileno(), fd, 0, 16384)
        if n < 0:
            err = -n
            break
        time.sleep(0.05)
    print(f"broken: {err in (32, 104)} within a few calls: {calls <= 4}")


def rt(port, n, d):
    files = make_files(d)
    path, _ = files["page"]
    s = socket.create_connection(("127.0.0.1", port))
    fd = os.open(path, os.O_RDONLY)
    for i in range(n):
        req = s.recv(1)
        assert req == b"?", req
        hdr = b"HTTP/1.1 200 OK\r\nContent-Length: 16384\r\n"
        os.writev(s.fileno(), [hdr, b"X-N: %08d\r\n\r\n" % i])
        m = os.sendfile(s.fileno(), fd, 0, 16384)
        assert m == 16384, m
    time.sleep(30)


def main():
    mode = sys.argv[1]
    if mode == "stream":
        stream(sys.argv[2])
    elif mode == "nonblock":
        nonblock(sys.argv[2])
    elif mode == "reset":
        reset(sys.argv[2])
    elif mode == "rt":
        rt(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    sys.stdout.flush()


if __name__ == "__main__":
    main()
