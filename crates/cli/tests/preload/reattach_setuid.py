"""A parent that listens and forks a child which drops to uid/gid 65534 (as
nginx's workers do) and waits in epoll on the inherited listener for 8 s:
after a server restart the child cannot attach again unless the socket is
open to its user (reattach.rs)."""
import os
import select
import socket
import time

l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(8)
print("listening", l.getsockname()[1], flush=True)
pid = os.fork()
if pid == 0:
    os.setgid(65534)
    os.setuid(65534)
    ep = select.epoll()
    ep.register(l.fileno(), select.EPOLLIN)
    print("child waiting", flush=True)
    end = time.time() + 8
    while time.time() < end:
        ep.poll(0.2)
    os._exit(0)
os.waitpid(pid, 0)
