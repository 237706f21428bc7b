"""A serial echo server on a blocking listener (reattach.rs).

Accepts one connection at a time and echoes it to EOF. With the argument
`poll` it waits for the listener with poll(2) (infinite timeout) before
each accept. Prints `listening PORT`, `served N` after each connection,
and every error: `poll errhup`, `accept error NAME`, `recv error NAME`,
`send error NAME`. On SIGTERM it prints its CPU time (`cpu SECONDS`) and
exits.
"""
import errno
import os
import select
import signal
import socket
import sys

mode = sys.argv[1] if len(sys.argv) > 1 else "accept"
lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", 0))
lst.listen(8)
print("listening", lst.getsockname()[1], flush=True)


def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def stop(*_):
    t = os.times()
    print(f"cpu {t.user + t.system:.3f}", flush=True)
    os._exit(0)


signal.signal(signal.SIGTERM, stop)

served = 0
while True:
    if mode == "poll":
        p = select.poll()
        p.register(lst.fileno(), select.POLLIN)
        for _, m in p.poll():
            if m & (select.POLLERR | select.POLLHUP):
                print("poll errhup", flush=True)
    try:
        c, _ = lst.accept()
    except OSError as e:
        print("accept error", name(e), flush=True)
        continue
    with c:
        while True:
            try:
                data = c.recv(65536)
            except OSError as e:
                print("recv error", name(e), flush=True)
                break
            if not data:
                break
            try:
                c.sendall(data)
            except OSError as e:
                print("send error", name(e), flush=True)
                break
    served += 1
    print("served", served, flush=True)
