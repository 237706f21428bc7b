"""An epoll echo server that outlives its TCP server (server_death.rs).

Prints `listening PORT`, echoes what its clients send, and reports every
error its sockets give (`accept error`, `recv error`, `epoll error`), each
socket's EPOLLERR/EPOLLHUP (`errhup`), and, when a line `new` comes on
stdin, makes a new listener (`relisten PORT`: after the server's death it
falls back to the kernel, as --fallback says); commands come on stdin
(a kernel pipe). With the argument `keep` (reattach.rs) a socket that
failed is not closed but kept aside: the line `poke` sends a byte on each
(`dead send error NAME`, `poked N`), `closedead` closes them (`closed N`).
On SIGTERM it prints how
many times its epoll_wait returned with events and how much CPU it used
since the first error, and exits.
"""
import errno
import os
import select
import signal
import socket
import sys
import time

ep = select.epoll()
lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", 0))
lst.listen(16)
lst.setblocking(False)
ep.register(lst.fileno(), select.EPOLLIN)
socks = {lst.fileno(): ("listener", lst)}
ep.register(0, select.EPOLLIN)
print("listening", lst.getsockname()[1], flush=True)

keep = sys.argv[1:] == ["keep"]
dead = []
first_error = None
wakes_after = 0
cpu_at_error = 0.0


def cpu():
    t = os.times()
    return t.user + t.system


def note_error(what):
    global first_error, cpu_at_error
    print(what, flush=True)
    if first_error is None:
        first_error = time.monotonic()
        cpu_at_error = cpu()


def stop(*_):
    spent = cpu() - cpu_at_error if first_error is not None else 0.0
    print(f"wakes after the first error {wakes_after} cpu {spent:.3f}", flush=True)
    os._exit(0)


signal.signal(signal.SIGTERM, stop)


def drop(fd, failed=False):
    kind, s = socks.pop(fd)
    ep.unregister(fd)
    if keep and failed:
        dead.append(s)
    else:
        s.close()


while True:
    try:
        events = ep.poll(5.0)
    except OSError as e:
        note_error(f"epoll error {errno.errorcode.get(e.errno, e.errno)}")
        time.sleep(0.01)
        continue
    if first_error is not None and events:
        wakes_after += 1
    for fd, mask in events:
        if fd == 0:
            line = os.read(0, 100)
            if not line:
                ep.unregister(0)
            elif line.strip() == b"new":
                n = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                n.bind(("127.0.0.1", 0))
                n.listen(16)
                n.setblocking(False)
                ep.register(n.fileno(), select.EPOLLIN)
                socks[n.fileno()] = ("relistener", n)
                print("relisten", n.getsockname()[1], flush=True)
            elif line.strip() == b"poke":
                for d in dead:
                    try:
                        d.send(b"x")
                        print("dead send went through", flush=True)
                    except OSError as e:
                        print(f"dead send error {errno.errorcode.get(e.errno, e.errno)}", flush=True)
                print("poked", len(dead), flush=True)
            elif line.strip() == b"closedead":
                for d in dead:
                    d.close()
                print("closed", len(dead), flush=True)
                dead.clear()
            continue
        kind, s = socks.get(fd, (None, None))
        if s is None:
            continue
        if mask & (select.EPOLLERR | select.EPOLLHUP) and kind != "client":
            note_error(f"errhup {kind}")
        elif mask & (select.EPOLLERR | select.EPOLLHUP):
            note_error("errhup client")
        if kind in ("listener", "relistener"):
            try:
                c, _ = s.accept()
            except BlockingIOError:
                continue
            except OSError as e:
                note_error(f"accept error {errno.errorcode.get(e.errno, e.errno)}")
                continue
            c.setblocking(False)
            socks[c.fileno()] = ("client", c)
            ep.register(c.fileno(), select.EPOLLIN)
            continue
        try:
            data = s.recv(65536)
        except BlockingIOError:
            continue
        except OSError as e:
            note_error(f"recv error {errno.errorcode.get(e.errno, e.errno)}")
            drop(fd, True)
            continue
        if not data:
            drop(fd)
            continue
        try:
            s.sendall(data)
        except OSError as e:
            note_error(f"send error {errno.errorcode.get(e.errno, e.errno)}")
            drop(fd, True)
