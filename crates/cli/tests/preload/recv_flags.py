"""Receives and accepts, flag by flag and option by option (issue 14 item
3): run on kernel sockets and under `tcps run`, it must print the same.

One canonical line per case: its name, then what each call returned (a
count, with the CRC-32 of the bytes it returned, or the errno's name) and
what it left behind (recvmsg's msg_flags/msg_namelen/msg_controllen,
recvfrom's address length, the new socket's O_NONBLOCK/FD_CLOEXEC).

Every measured call goes through ctypes to libc's exported symbol (so under
the preload it is the interposed one), with exactly the arguments the case
names, NULL and bad pointers included. Data reach the socket under test
before a case runs: the program peeks (MSG_PEEK|MSG_DONTWAIT) until all of
it is there, and waits a little longer for a FIN or a reset to land.

Usage: recv_flags.py [table|special|all]  (default all)
"""
import ctypes
import errno
import fcntl
import os
import resource
import select
import socket
import struct
import sys
import threading
import time
import zlib

libc = ctypes.CDLL(None, use_errno=True)
c_int, c_size_t, c_ssize_t, c_void_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_ssize_t, ctypes.c_void_p


class iovec(ctypes.Structure):
    _fields_ = [("base", c_void_p), ("len", c_size_t)]


class msghdr(ctypes.Structure):
    _fields_ = [
        ("name", c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", c_void_p),
        ("iovlen", c_size_t),
        ("control", c_void_p),
        ("controllen", c_size_t),
        ("flags", c_int),
    ]


def proto(name, res, *args):
    f = getattr(libc, name)
    f.restype = res
    f.argtypes = list(args)
    return f


recv = proto("recv", c_ssize_t, c_int, c_void_p, c_size_t, c_int)
recvfrom = proto("recvfrom", c_ssize_t, c_int, c_void_p, c_size_t, c_int, c_void_p, c_void_p)
recvmsg = proto("recvmsg", c_ssize_t, c_int, c_void_p, c_int)
read = proto("read", c_ssize_t, c_int, c_void_p, c_size_t)
readv = proto("readv", c_ssize_t, c_int, c_void_p, c_int)
accept4 = proto("accept4", c_int, c_int, c_void_p, c_void_p, c_int)
setsockopt = proto("setsockopt", c_int, c_int, c_int, c_int, c_void_p, ctypes.c_uint32)
ioctl = proto("ioctl", c_int, c_int, ctypes.c_ulong, c_void_p)

MSG_CMSG_CLOEXEC = 0x40000000
MSG_ERRQUEUE = 0x2000
FIONREAD = 0x541B
SIOCINQ = FIONREAD
DATA = bytes((i * 131 + 7) % 251 for i in range(1000))
TIMEO = 0.05  # SO_RCVTIMEO of the blocking sockets in the table

FLAGS = {
    "0": 0,
    "PEEK": socket.MSG_PEEK,
    "WAITALL": socket.MSG_WAITALL,
    "DONTWAIT": socket.MSG_DONTWAIT,
    "TRUNC": socket.MSG_TRUNC,
    "OOB": socket.MSG_OOB,
    "NOSIGNAL": socket.MSG_NOSIGNAL,
    "CMSG_CLOEXEC": MSG_CMSG_CLOEXEC,
    "ERRQUEUE": MSG_ERRQUEUE,
    "TRUNC|PEEK": socket.MSG_TRUNC | socket.MSG_PEEK,
    "PEEK|WAITALL": socket.MSG_PEEK | socket.MSG_WAITALL,
    "PEEK|DONTWAIT": socket.MSG_PEEK | socket.MSG_DONTWAIT,
    "WAITALL|DONTWAIT": socket.MSG_WAITALL | socket.MSG_DONTWAIT,
    "TRUNC|DONTWAIT": socket.MSG_TRUNC | socket.MSG_DONTWAIT,
    "OOB|DONTWAIT": socket.MSG_OOB | socket.MSG_DONTWAIT,
    "ERRQUEUE|DONTWAIT": MSG_ERRQUEUE | socket.MSG_DONTWAIT,
    # Flags a TCP receive accepts and ignores.
    "MORE|EOR|CONFIRM|CTRUNC": socket.MSG_MORE | socket.MSG_EOR | socket.MSG_CONFIRM | socket.MSG_CTRUNC,
    "WAITFORONE": 0x10000,
}


def err():
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def show(r, buf=None):
    if r < 0:
        return err()
    if buf is not None and r > 0:
        return "%d:%08x" % (r, zlib.crc32(bytes(buf[: min(r, len(buf))])))
    return str(r)


def fdflags(fd):
    nb = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK != 0
    ce = fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC != 0
    return "nonblock=%d cloexec=%d" % (nb, ce)


# -- one receive call of each kind ------------------------------------------


def do_recv(fd, n, flags):
    b = ctypes.create_string_buffer(max(n, 1))
    return show(recv(fd, b, n, flags), b)


def do_recvfrom(fd, n, flags):
    b = ctypes.create_string_buffer(max(n, 1))
    a = ctypes.create_string_buffer(128)
    alen = ctypes.c_uint32(128)
    r = recvfrom(fd, b, n, flags, a, ctypes.byref(alen))
    return "%s alen=%d" % (show(r, b), alen.value)


def iovs(n):
    """Three iovecs of n bytes in all (10, 30, the rest), and their buffer."""
    sizes = [min(n, 10), min(max(n - 10, 0), 30)]
    sizes.append(n - sum(sizes))
    bufs = [ctypes.create_string_buffer(max(s, 1)) for s in sizes]
    arr = (iovec * 3)(*[iovec(ctypes.cast(b, c_void_p), s) for b, s in zip(bufs, sizes)])
    return arr, bufs, sizes


def joined(bufs, sizes):
    return b"".join(bytes(b[:s]) for b, s in zip(bufs, sizes))


def do_recvmsg(fd, n, flags):
    arr, bufs, sizes = iovs(n)
    name = ctypes.create_string_buffer(128)
    ctl = ctypes.create_string_buffer(64)
    m = msghdr(ctypes.cast(name, c_void_p), 128, ctypes.cast(arr, c_void_p), 3, ctypes.cast(ctl, c_void_p), 64, 0x7F)
    r = recvmsg(fd, ctypes.byref(m), flags)
    return "%s mflags=%#x namelen=%d controllen=%d" % (show(r, joined(bufs, sizes)), m.flags, m.namelen, m.controllen)


def do_read(fd, n, flags):
    b = ctypes.create_string_buffer(max(n, 1))
    return show(read(fd, b, n), b)


def do_readv(fd, n, flags):
    arr, bufs, sizes = iovs(n)
    return show(readv(fd, arr, 3), joined(bufs, sizes))


CALLS = {"recv": do_recv, "recvfrom": do_recvfrom, "recvmsg": do_recvmsg, "read": do_read, "readv": do_readv}


# -- connections --------------------------------------------------------------


def set_timeo(fd, secs):
    tv = struct.pack("ll", int(secs), int(round((secs % 1) * 1e6)))
    buf = ctypes.create_string_buffer(tv, len(tv))
    assert setsockopt(fd, socket.SOL_SOCKET, socket.SO_RCVTIMEO, buf, len(tv)) == 0, err()


def listener(flags=0):
    l = socket.socket(socket.AF_INET, socket.SOCK_STREAM | flags)
    l.bind(("127.0.0.1", 0))
    l.listen(512)
    return l


def connected(addr, nonblock):
    if not nonblock:
        return socket.create_connection(addr)
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    r = c.connect_ex(addr)
    assert r in (0, errno.EINPROGRESS), r
    p = select.poll()
    p.register(c, select.POLLOUT)
    assert p.poll(5000), "connect did not finish"
    assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    return c


def pairs(role, modes):
    """One connection per entry of `modes`: (socket under test, its peer).
    role "acc": the test uses the accepted end (accept4 with SOCK_NONBLOCK
    for mode "sock_nonblock"); "con": the connecting end (created with
    SOCK_NONBLOCK for that mode)."""
    l = listener()
    addr = l.getsockname()
    clients = {}
    out = []
    for mode in modes:
        c = connected(addr, role == "con" and mode == "sock_nonblock")
        clients[c.getsockname()[1]] = c
        fl = socket.SOCK_NONBLOCK if role == "acc" and mode == "sock_nonblock" else 0
        afd = accept4(l.fileno(), None, None, fl)
        assert afd >= 0, err()
        a = socket.socket(fileno=afd)
        if role == "acc":
            out.append((a, None))
        else:
            out.append((c, a))
    if role == "acc":
        out = [(a, clients.pop(a.getpeername()[1])) for a, _ in out]
    l.close()
    for (s, _), mode in zip(out, modes):
        if mode == "nonblock":
            fcntl.fcntl(s.fileno(), fcntl.F_SETFL, fcntl.fcntl(s.fileno(), fcntl.F_GETFL) | os.O_NONBLOCK)
        elif mode == "block":
            set_timeo(s.fileno(), TIMEO)
    return out


def settle(fd, n, limit=3.0):
    """Waits until `n` bytes can be peeked at `fd` (bounded)."""
    if n == 0:
        return
    b = ctypes.create_string_buffer(65536 * 4)
    t = time.monotonic()
    while time.monotonic() - t < limit:
        r = recv(fd, b, len(b), socket.MSG_PEEK | socket.MSG_DONTWAIT)
        if r >= n:
            return
        time.sleep(0.0005)


def reset(s):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def prepare(state, peer):
    """What the peer did before the case: returns the bytes to wait for."""
    if state == "data":
        peer.sendall(DATA)
        return len(DATA)
    if state == "eof":
        peer.sendall(DATA[:300])
        peer.shutdown(socket.SHUT_WR)
        return 300
    if state == "reset":
        peer.sendall(DATA[:300])
        reset(peer)
        return 300
    if state == "rst0":
        reset(peer)
        return 0
    return 0


# -- the table ------------------------------------------------------------------

MODES = ["block", "nonblock", "sock_nonblock"]
STATES = {"data": [100, 4096], "empty": [100], "eof": [100, 4096], "reset": [4096], "rst0": [100]}
CALLS_IN_A_CASE = {"data": 2, "empty": 1, "eof": 3, "reset": 3, "rst0": 2}


def table():
    for role in ("acc", "con"):
        for state, lens in STATES.items():
            cases = []
            for call in CALLS:
                for fname, flags in FLAGS.items():
                    if call in ("read", "readv") and fname != "0":
                        continue
                    for mode in MODES:
                        for n in lens:
                            cases.append((call, fname, flags, mode, n))
            socks = pairs(role, [c[3] for c in cases])
            want = [prepare(state, peer) for _, peer in socks]
            for (s, _), w in zip(socks, want):
                settle(s.fileno(), w)
            if state in ("eof", "reset", "rst0"):
                time.sleep(0.05)
            for (call, fname, flags, mode, n), (s, peer) in zip(cases, socks):
                res = [CALLS[call](s.fileno(), n, flags) for _ in range(CALLS_IN_A_CASE[state])]
                print("%s %s %s %s %s len=%d: %s" % (role, state, call, fname, mode, n, " | ".join(res)))
            for s, peer in socks:
                s.close()
                if peer is not None and state not in ("reset", "rst0"):
                    peer.close()
        sys.stdout.flush()


# -- cases one by one -------------------------------------------------------------


def case(name, *res):
    print("%s: %s" % (name, " | ".join(str(r) for r in res)))


def one(role="acc", mode="block"):
    (s, p), = pairs(role, [mode])
    if mode == "block":
        set_timeo(s.fileno(), 0)
    return s, p


def later(delay, f):
    t = threading.Timer(delay, f)
    t.start()
    return t


def special():
    for role in ("acc", "con"):
        # WAITALL waits for the whole length on a blocking socket.
        s, p = one(role)
        p.sendall(DATA[:500])
        t = later(0.1, lambda: p.sendall(DATA[500:]))
        case(role + " waitall late data", do_recv(s.fileno(), 1000, socket.MSG_WAITALL))
        t.join()
        s.close(), p.close()
        # PEEK|WAITALL too, and leaves the bytes.
        s, p = one(role)
        p.sendall(DATA[:500])
        settle(s.fileno(), 500)
        t = later(0.1, lambda: p.sendall(DATA[500:]))
        case(role + " peek|waitall late data", do_recv(s.fileno(), 1000, socket.MSG_PEEK | socket.MSG_WAITALL),
             do_recv(s.fileno(), 4096, 0))
        t.join()
        s.close(), p.close()
        # WAITALL ended by the peer's FIN.
        s, p = one(role)
        p.sendall(DATA[:200])
        t = later(0.1, lambda: p.shutdown(socket.SHUT_WR))
        case(role + " waitall then fin", do_recv(s.fileno(), 1000, socket.MSG_WAITALL), do_recv(s.fileno(), 10, 0))
        t.join()
        s.close(), p.close()

        # A blocking recv waits for data.
        s, p = one(role)
        t = later(0.1, lambda: p.sendall(DATA[:10]))
        case(role + " blocking recv waits", do_recv(s.fileno(), 100, 0))
        t.join()
        # SO_RCVTIMEO: EAGAIN after the timeout, not before.
        set_timeo(s.fileno(), 0.1)
        t0 = time.monotonic()
        r = do_recv(s.fileno(), 100, 0)
        case(role + " rcvtimeo", r, "waited=%s" % (0.09 <= time.monotonic() - t0 < 2))
        t0 = time.monotonic()
        r = do_recv(s.fileno(), 100, socket.MSG_DONTWAIT)
        case(role + " rcvtimeo dontwait", r, "waited=%s" % (time.monotonic() - t0 >= 0.09))
        # SO_RCVLOWAT: a blocking recv on an empty socket waits for that
        # many bytes (SO_RCVTIMEO as a guard: a recv that already copied
        # part waits for the mark *more*, which may never come).
        set_timeo(s.fileno(), 1.0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 600)
        case(role + " rcvlowat read back", s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))
        t = later(0.1, lambda: p.sendall(DATA[:300]))
        # The second part after the first even if a loaded machine runs
        # the first timer late (the two would race otherwise).
        t2 = later(0.3, lambda: (t.join(), p.sendall(DATA[300:700])))
        case(role + " rcvlowat waits", do_recv(s.fileno(), 4096, 0))
        t.join(), t2.join()
        s.close(), p.close()
        # ... until SO_RCVTIMEO, then returns what there is.
        s, p = one(role)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 600)
        set_timeo(s.fileno(), 0.1)
        p.sendall(DATA[:500])
        settle(s.fileno(), 500)
        t0 = time.monotonic()
        r = do_recv(s.fileno(), 4096, 0)
        case(role + " rcvlowat timeout", r, "waited=%s" % (time.monotonic() - t0 >= 0.09))
        s.close(), p.close()
        s, p = one(role)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 600)
        set_timeo(s.fileno(), 0.1)
        # ... a non-blocking one does not wait.
        p.sendall(DATA[:500])
        settle(s.fileno(), 500)
        case(role + " rcvlowat dontwait", do_recv(s.fileno(), 4096, socket.MSG_DONTWAIT))
        # ... nor one with a buffer shorter than the mark.
        p.sendall(DATA[:500])
        settle(s.fileno(), 500)
        case(role + " rcvlowat short buffer", do_recv(s.fileno(), 300, 0), do_recv(s.fileno(), 300, 0))
        s.close(), p.close()

        # FIONREAD / SIOCINQ.
        s, p = one(role)
        v = ctypes.c_int(-1)
        case(role + " fionread empty", ioctl(s.fileno(), FIONREAD, ctypes.byref(v)), v.value)
        p.sendall(DATA)
        settle(s.fileno(), 1000)
        case(role + " fionread 1000", ioctl(s.fileno(), FIONREAD, ctypes.byref(v)), v.value)
        case(role + " siocinq 1000", ioctl(s.fileno(), SIOCINQ, ctypes.byref(v)), v.value)
        do_recv(s.fileno(), 300, 0)
        case(role + " fionread after 300", ioctl(s.fileno(), FIONREAD, ctypes.byref(v)), v.value)
        big = bytes(range(256)) * 400  # 100 KiB
        p.sendall(big)
        settle(s.fileno(), 700 + len(big))
        case(role + " fionread 100 KiB", ioctl(s.fileno(), FIONREAD, ctypes.byref(v)), v.value)
        n = 0
        while n < 700 + len(big):
            r = recv(s.fileno(), ctypes.create_string_buffer(65536), 65536, 0)
            assert r > 0, err()
            n += r
        p.shutdown(socket.SHUT_WR)
        time.sleep(0.05)
        case(role + " fionread at eof", ioctl(s.fileno(), FIONREAD, ctypes.byref(v)), v.value)
        s.close(), p.close()

        # Zero-length receives.
        for mode in ("block", "nonblock"):
            s, p = one(role, mode)
            if mode == "nonblock":
                case(role + " zero-length empty nonblock", do_recv(s.fileno(), 0, 0), do_read(s.fileno(), 0, 0),
                     do_readv(s.fileno(), 0, 0), do_recvmsg(s.fileno(), 0, 0))
            case(role + " zero-length empty dontwait " + mode, do_recv(s.fileno(), 0, socket.MSG_DONTWAIT),
                 do_read(s.fileno(), 0, 0), do_recvfrom(s.fileno(), 0, socket.MSG_DONTWAIT))
            p.sendall(DATA)
            settle(s.fileno(), 1000)
            case(role + " zero-length with data " + mode, do_recv(s.fileno(), 0, 0), do_read(s.fileno(), 0, 0),
                 do_readv(s.fileno(), 0, 0), do_recvmsg(s.fileno(), 0, 0), do_recv(s.fileno(), 0, socket.MSG_PEEK),
                 do_recv(s.fileno(), 4096, 0))
            p.shutdown(socket.SHUT_WR)
            time.sleep(0.05)
            case(role + " zero-length at eof " + mode, do_recv(s.fileno(), 0, 0), do_read(s.fileno(), 0, 0))
            s.close(), p.close()

        # Bad buffers: EFAULT where the kernel gives it, the bytes kept.
        s, p = one(role)
        p.sendall(DATA)
        settle(s.fileno(), 1000)
        case(role + " recv NULL buffer", show(recv(s.fileno(), None, 100, 0)),
             show(recv(s.fileno(), None, 100, socket.MSG_PEEK)), show(read(s.fileno(), None, 100)))
        case(role + " recv NULL buffer TRUNC", show(recv(s.fileno(), None, 100, socket.MSG_TRUNC)))
        case(role + " readv NULL iov", show(readv(s.fileno(), None, 2)))
        case(role + " readv iovcnt -1", show(readv(s.fileno(), ctypes.create_string_buffer(64), -1)))
        case(role + " readv iovcnt 1025", show(readv(s.fileno(), (iovec * 1025)(), 1025)))
        case(role + " readv iovcnt 0", show(readv(s.fileno(), None, 0)))
        b = ctypes.create_string_buffer(100)
        for name, vec in (("first", [(None, 10), (b, 100)]), ("second", [(b, 10), (None, 100)])):
            arr = (iovec * 2)(*[iovec(ctypes.cast(p, c_void_p) if p is not None else None, n) for p, n in vec])
            m = msghdr(None, 0, ctypes.cast(arr, c_void_p), 2, None, 0, 0)
            case(role + " NULL iov_base " + name, show(readv(s.fileno(), arr, 2)),
                 show(recvmsg(s.fileno(), ctypes.byref(m), 0)))
        case(role + " recvmsg NULL msghdr", show(recvmsg(s.fileno(), None, 0)))
        m = msghdr(None, 0, None, 1025, None, 0, 0)
        case(role + " recvmsg iovlen 1025", show(recvmsg(s.fileno(), ctypes.byref(m), 0)))
        m = msghdr(None, 0, None, 0, None, 0, 0)
        case(role + " recvmsg no iov", show(recvmsg(s.fileno(), ctypes.byref(m), 0)))
        case(role + " rest", do_recv(s.fileno(), 4096, 0))
        s.close(), p.close()

        # Urgent data: the kernel hands the urgent byte to MSG_OOB.
        s, p = one(role, "nonblock")
        p.sendall(b"abc")
        p.send(b"!", socket.MSG_OOB)
        settle(s.fileno(), 3)
        time.sleep(0.05)
        case(role + " urgent data", do_recv(s.fileno(), 100, 0), do_recv(s.fileno(), 100, socket.MSG_OOB),
             do_recv(s.fileno(), 100, 0))
        s.close(), p.close()

        # Reset with nothing unread, on a blocking socket in a recv.
        s, p = one(role)
        t = later(0.1, lambda: reset(p))
        case(role + " reset while blocked", do_recv(s.fileno(), 100, 0), do_recv(s.fileno(), 100, 0),
             do_recv(s.fileno(), 100, socket.MSG_PEEK))
        t.join()
        s.close()

    # Calls on sockets that cannot receive.
    u = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    case("unconnected recv", do_recv(u.fileno(), 100, 0), do_recv(u.fileno(), 100, socket.MSG_DONTWAIT),
         do_read(u.fileno(), 100, 0), do_recvmsg(u.fileno(), 100, 0), do_recv(u.fileno(), 100, socket.MSG_OOB),
         do_recv(u.fileno(), 100, MSG_ERRQUEUE), do_recv(u.fileno(), 0, 0))
    v = ctypes.c_int(-1)
    case("unconnected fionread", ioctl(u.fileno(), FIONREAD, ctypes.byref(v)), v.value)
    u.close()
    l = listener()
    case("listener recv", do_recv(l.fileno(), 100, 0), do_recv(l.fileno(), 100, socket.MSG_DONTWAIT),
         do_read(l.fileno(), 100, 0), do_recv(l.fileno(), 100, MSG_ERRQUEUE))
    case("listener fionread", show(ioctl(l.fileno(), FIONREAD, ctypes.byref(v))))
    l.close()
    fd = os.open("/dev/null", os.O_RDONLY)
    case("closed fd recv", do_recv(fd + 1000, 100, 0), show(accept4(fd + 1000, None, None, 0)))
    r, w = os.pipe()
    case("pipe recv", do_recv(r, 100, socket.MSG_DONTWAIT), show(accept4(r, None, None, 0)))
    os.close(r), os.close(w), os.close(fd)

    accepts()


def incoming(l, lflags):
    """A connection to listener `l`, pending there (a non-blocking listener
    is polled for it)."""
    c = socket.create_connection(l.getsockname())
    if lflags != 0:
        p = select.poll()
        p.register(l, select.POLLIN)
        p.poll(3000)
    return c


def accepts():
    for lflags, lname in ((0, "block"), (socket.SOCK_NONBLOCK, "sock_nonblock"), (-1, "fcntl_nonblock")):
        l = listener(max(lflags, 0))
        if lflags < 0:
            fcntl.fcntl(l.fileno(), fcntl.F_SETFL, os.O_NONBLOCK)
        if lflags != 0:
            case("accept empty " + lname, show(accept4(l.fileno(), None, None, 0)),
                 show(accept4(l.fileno(), None, None, socket.SOCK_NONBLOCK)))
        else:
            set_timeo(l.fileno(), 0.1)
            t0 = time.monotonic()
            r = show(accept4(l.fileno(), None, None, 0))
            case("accept empty rcvtimeo", r, "waited=%s" % (time.monotonic() - t0 >= 0.09))
            set_timeo(l.fileno(), 0)
        for fl, fname in ((0, "0"), (socket.SOCK_NONBLOCK, "NONBLOCK"), (socket.SOCK_CLOEXEC, "CLOEXEC"),
                          (socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC, "NONBLOCK|CLOEXEC")):
            c = incoming(l, lflags)
            c.sendall(b"hi")
            sa = ctypes.create_string_buffer(128)
            slen = ctypes.c_uint32(128)
            a = accept4(l.fileno(), sa, ctypes.byref(slen), fl)
            if a < 0:
                case("accept4 %s listener %s" % (fname, lname), err())
                c.close()
                continue
            port = struct.unpack("!H", sa.raw[2:4])[0]
            res = [str(a >= 0), fdflags(a), "alen=%d" % slen.value, "port ok=%s" % (port == c.getsockname()[1])]
            settle(a, 2)
            res.append(do_recv(a, 100, 0))
            res.append(do_recv(a, 100, 0) if fl & socket.SOCK_NONBLOCK else "-")
            case("accept4 %s listener %s" % (fname, lname), *res)
            os.close(a)
            c.close()
        # A short address buffer: truncated, the full length reported.
        c = incoming(l, lflags)
        sa = ctypes.create_string_buffer(b"\xee" * 16)
        slen = ctypes.c_uint32(4)
        a = accept4(l.fileno(), sa, ctypes.byref(slen), 0)
        case("accept short addr " + lname, str(a >= 0), "alen=%d" % slen.value, sa.raw[4:8].hex())
        os.close(a)
        c.close()
        # NULL address with a length pointer, and a length with no address.
        c = incoming(l, lflags)
        slen = ctypes.c_uint32(77)
        a = accept4(l.fileno(), None, ctypes.byref(slen), 0)
        case("accept NULL addr " + lname, str(a >= 0), "alen=%d" % slen.value)
        if a >= 0:
            os.close(a)
        c.close()
        case("accept4 bad flags " + lname, show(accept4(l.fileno(), None, None, 0x1)),
             show(accept4(l.fileno(), None, None, socket.MSG_DONTWAIT)))
        l.close()
    # accept on sockets that do not listen.
    u = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    case("accept unlistening", show(accept4(u.fileno(), None, None, 0)),
         show(accept4(u.fileno(), None, None, socket.SOCK_NONBLOCK)))
    u.close()
    l = listener()
    c = socket.create_connection(l.getsockname())
    a, _ = l.accept()
    case("accept on a connection", show(accept4(c.fileno(), None, None, 0)), show(accept4(a.fileno(), None, None, 0)))
    a.close(), c.close(), l.close()


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what in ("table", "all"):
        table()
    if what in ("special", "all"):
        special()
    print("done")


main()
