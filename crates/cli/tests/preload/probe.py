#!/usr/bin/env python3
"""Socket-emulation probe for libtcps_preload.so.

Runs a fixed battery of socket operations and prints one `name: value` line
each. The test runs it on kernel sockets and through `tcps run` and requires
identical output, so every line must be deterministic (no ports, no times).
"""
import errno
import hashlib
import os
import select
import selectors
import socket
import threading
import time

out = []


def say(name, value):
    out.append(f"{name}: {value}")


def listener(family=socket.AF_INET, host="127.0.0.1"):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    s.listen(16)
    return s


def pair(lst):
    c = socket.create_connection(lst.getsockname()[:2])
    a, _ = lst.accept()
    return c, a


payload = bytes((i * 7 + (i >> 8)) & 0xFF for i in range(1 << 20))

# 1. Blocking connect/accept, 1 MiB both ways with a thread, sha256.
lst = listener()
say("listen.type", lst.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE))
say("listen.acceptconn", lst.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
c, a = pair(lst)
say("peer.matches", c.getsockname() == a.getpeername() and a.getsockname() == c.getpeername())
t = threading.Thread(target=lambda: c.sendall(payload))
t.start()
got = bytearray()
while len(got) < len(payload):
    chunk = a.recv(65536)
    if not chunk:
        break
    got += chunk
t.join()
say("bulk.sha", hashlib.sha256(got).hexdigest()[:16] == hashlib.sha256(payload).hexdigest()[:16])

# 2. read/write on the fd, recv_into, sendmsg/recvmsg, MSG_PEEK.
os.write(c.fileno(), b"via-write")
say("os.read", os.read(a.fileno(), 100))
c.sendmsg([b"one-", b"two-", b"three"])
buf = bytearray(64)
time.sleep(0.05)
n = a.recv_into(buf, 4, socket.MSG_PEEK)
say("peek", bytes(buf[:n]))
data, anc, flags, addr = a.recvmsg(64)
say("recvmsg", (data, anc, flags))
c.sendto(b"sendto", ("127.0.0.1", 9)) if False else c.send(b"sendto")
say("recvfrom", a.recvfrom(64))

# 3. Options.
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
say("nodelay", c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
c.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
say("keepalive", c.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE))
try:
    c.setsockopt(socket.SOL_SOCKET, 9999, 1)
    say("bogus.opt", "accepted")
except OSError as e:
    say("bogus.opt", errno.errorcode.get(e.errno, e.errno))

# 4. Non-blocking: EAGAIN, F_GETFL, select/poll readiness.
a.setblocking(False)
try:
    a.recv(10)
    say("nb.recv", "data?")
except BlockingIOError as e:
    say("nb.recv", errno.errorcode[e.errno])
import fcntl
say("nb.getfl", bool(fcntl.fcntl(a.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK))
say("cloexec", bool(fcntl.fcntl(a.fileno(), fcntl.F_GETFD) & fcntl.FD_CLOEXEC))
r, w, x = select.select([a], [a], [], 0)
say("select.idle", (len(r), len(w)))
c.send(b"x")
r, w, x = select.select([a], [], [], 2)
say("select.ready", len(r))
p = select.poll()
p.register(a, select.POLLIN)
say("poll.ready", [ev for _, ev in p.poll(2000)])
say("recv.x", a.recv(10))
t0 = time.monotonic()
say("poll.timeout", p.poll(150))
say("poll.waited", time.monotonic() - t0 >= 0.14)

# 5. Mixed epoll set: a pipe and sockets (selectors uses epoll).
sel = selectors.DefaultSelector()
say("selector", type(sel).__name__)
rp, wp = os.pipe()
sel.register(rp, selectors.EVENT_READ, "pipe")
sel.register(a, selectors.EVENT_READ, "sock")
say("sel.idle", sel.select(0.1))
os.write(wp, b"p")
say("sel.pipe", [k.data for k, _ in sel.select(2)])
os.read(rp, 1)
threading.Timer(0.1, lambda: c.send(b"late")).start()
say("sel.sock.blocking", [k.data for k, _ in sel.select(5)])
say("recv.late", a.recv(10))
threading.Timer(0.1, lambda: os.write(wp, b"q")).start()
say("sel.pipe.blocking", [k.data for k, _ in sel.select(5)])
os.read(rp, 1)
sel.close()

# 6. Edge-triggered epoll.
ep = select.epoll()
ep.register(a.fileno(), select.EPOLLIN | select.EPOLLET)
c.send(b"edge")
say("et.first", [ev for _, ev in ep.poll(2)])
say("et.again", ep.poll(0.05))
say("et.read", a.recv(100))
try:
    a.recv(100)
except BlockingIOError:
    say("et.drained", True)
c.send(b"edge2")
say("et.second", [ev for _, ev in ep.poll(2)])
a.recv(100)
# Every new arrival is an edge, read or not (the kernel queues the entry
# on each one); with nothing new, nothing.
c.send(b"x")
say("et.unread.first", [ev for _, ev in ep.poll(2)])
c.send(b"y")
say("et.unread.second", [ev for _, ev in ep.poll(2)])
say("et.unread.quiet", ep.poll(0.05))
time.sleep(0.05)
say("et.unread.read", a.recv(100))
# EPOLLIN|EPOLLOUT edge-triggered: once at registration (both), then an
# arrival reports both again; a write that finds room is no edge.
ep.modify(a.fileno(), select.EPOLLIN | select.EPOLLOUT | select.EPOLLET)
say("et.both.first", [ev for _, ev in ep.poll(2)])
say("et.both.quiet", ep.poll(0.05))
a.send(b"w")
say("et.both.after_write", ep.poll(0.05))
say("et.both.peer", c.recv(10))
c.send(b"z")
say("et.both.arrival", [ev for _, ev in ep.poll(2)])
a.recv(10)
ep.close()
# EPOLLEXCLUSIVE: ADD only, with few other flags; never modified.
EXCL = 1 << 28
for name, flags in [("in", select.EPOLLIN), ("in_et", select.EPOLLIN | select.EPOLLET),
                    ("rdhup", select.EPOLLIN | select.EPOLLRDHUP),
                    ("oneshot", select.EPOLLIN | select.EPOLLONESHOT)]:
    ep = select.epoll()
    try:
        ep.register(a.fileno(), flags | EXCL)
        say(f"excl.{name}.add", "ok")
        try:
            ep.modify(a.fileno(), select.EPOLLIN)
            say(f"excl.{name}.mod", "ok")
        except OSError as e:
            say(f"excl.{name}.mod", errno.errorcode[e.errno])
        c.send(b"e")
        say(f"excl.{name}.poll", [ev for _, ev in ep.poll(2)])
        a.recv(10)
    except OSError as e:
        say(f"excl.{name}.add", errno.errorcode[e.errno])
    ep.close()
ep = select.epoll()
ep.register(a.fileno(), select.EPOLLIN)
try:
    ep.modify(a.fileno(), select.EPOLLIN | EXCL)
    say("excl.mod_to", "ok")
except OSError as e:
    say("excl.mod_to", errno.errorcode[e.errno])
ep.close()
# SO_RCVLOWAT: poll reports readable only from the mark on. (A fresh
# connection: on one that carried a megabyte the kernel may report a few
# bytes readable anyway, when its receive window is small.)
lc, la = pair(lst)
la.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 10)
lc.send(b"12345")
time.sleep(0.05)
lp = select.poll()
lp.register(la, select.POLLIN)
say("rcvlowat.below", lp.poll(50))
lc.send(b"67890")
say("rcvlowat.at", [ev for _, ev in lp.poll(2000)])
say("rcvlowat.read", la.recv(100))
lc.close()
la.close()

# 7. dup: the duplicate outlives the original.
d = a.dup()
a.close()
c.send(b"to-dup")
d.setblocking(True)
say("dup.recv", d.recv(10))
d2 = os.dup2(d.fileno(), 200)
d.close()
c.send(b"to-dup2")
say("dup2.read", os.read(200, 10))
os.close(200)
say("closed.peer.recv", c.recv(10))

# 8. Shutdown: the peer sees EOF, the other direction still works.
c2, a2 = pair(lst)
c2.shutdown(socket.SHUT_WR)
say("shutdown.eof", a2.recv(10))
a2.send(b"still")
say("shutdown.other.way", c2.recv(10))
c2.close()
a2.close()
c.close()

# 9. Non-blocking connect: EINPROGRESS, then SO_ERROR; refused ports.
nb = socket.socket()
nb.setblocking(False)
rc = nb.connect_ex(lst.getsockname())
say("nbconnect.rc", errno.errorcode.get(rc, rc))
select.select([], [nb], [], 5)
say("nbconnect.so_error", nb.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
nb.close()
lst2 = listener()
dead = lst2.getsockname()
lst2.close()
nb = socket.socket()
nb.setblocking(False)
rc = nb.connect_ex(dead)
select.select([], [nb], [], 5)
say("refused.so_error", errno.errorcode.get(nb.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
nb.close()
try:
    socket.create_connection(dead, timeout=5)
except OSError as e:
    say("refused.blocking", errno.errorcode.get(e.errno, e.errno))
a3, _ = lst.accept()  # the nb connect above
a3.close()

# 10. Socket timeouts (poll inside Python).
c3, a3 = pair(lst)
a3.settimeout(0.1)
try:
    a3.recv(10)
except socket.timeout:
    say("timeout", True)
c3.close()
say("eof", a3.recv(10))
a3.close()

# 11. IPv6, UDP and Unix sockets (the latter two stay kernel sockets).
l6 = listener(socket.AF_INET6, "::1")
c6, a6 = pair(l6)
c6.send(b"v6")
say("v6", a6.recv(10))
for s in (c6, a6, l6):
    s.close()
u1 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u1.bind(("127.0.0.1", 0))
u2 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u2.sendto(b"dgram", u1.getsockname())
say("udp", u1.recvfrom(10)[0])
x1, x2 = socket.socketpair()
x1.send(b"unix")
say("unix", x2.recv(10))
for s in (u1, u2, x1, x2, lst):
    s.close()

# 12. Many connections through one accept loop thread.
lst = listener()
def serve():
    for _ in range(20):
        s, _ = lst.accept()
        with s:
            s.sendall(s.recv(100).upper())
th = threading.Thread(target=serve)
th.start()
answers = []
for i in range(20):
    with socket.create_connection(lst.getsockname()) as s:
        s.sendall(b"conn%d" % i)
        answers.append(s.recv(100))
th.join()
say("many", answers == [b"CONN%d" % i for i in range(20)])
lst.close()

# 13. fork + exec: an inheritable socket reaches the new program image as a
# working (kernel) socket; the parent keeps its copy.
import sys
lst = listener()
c, a = pair(lst)
a.set_inheritable(True)
c.send(b"before-exec")
time.sleep(0.05)
child_code = (
    "import socket,sys; s=socket.socket(fileno=int(sys.argv[1])); "
    "s.setblocking(True); d=s.recv(100); s.sendall(b'after-exec:'+d); "
    "s.sendall(b':type=%d' % s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE))"
)
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-c", child_code, str(a.fileno())])
_, status = os.waitpid(pid, 0)
say("exec.child.status", status)
a.close()
got = b""
while len(got) < len(b"after-exec:before-exec:type=1"):
    chunk = c.recv(100)
    if not chunk:
        break
    got += chunk
say("exec.reply", got)
c.close()
lst.close()

print("\n".join(out))
