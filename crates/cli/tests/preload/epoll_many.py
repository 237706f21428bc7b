#!/usr/bin/env python3
"""An echo server with many idle connections in one epoll set:
`epoll_many.py PORT CONNS MODE` (MODE `lt` or `et`).

Listens on 127.0.0.1:PORT, accepts CONNS connections, registers them all
in one epoll set (level- or edge-triggered EPOLLIN), and answers every
message with its bytes reversed until every peer has closed. Few
connections are active at a time, as on a server with many idle
keep-alive clients: the test counts how many entries epoll looked at per
wait (O(ready), not O(interest))."""
import select
import socket
import sys

port, conns, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
et = select.EPOLLET if mode == "et" else 0
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port))
ls.listen(conns)
ep = select.epoll()
socks = {}
for _ in range(conns):
    s, _ = ls.accept()
    s.setblocking(False)
    socks[s.fileno()] = (s, bytearray())
    ep.register(s.fileno(), select.EPOLLIN | et)
print("ready", flush=True)
while socks:
    for fd, _ in ep.poll(10):
        s, buf = socks[fd]
        while True:
            try:
                b = s.recv(65536)
            except BlockingIOError:
                break
            if not b:
                ep.unregister(fd)
                s.close()
                del socks[fd]
                break
            buf.extend(b)
            while len(buf) >= 100:
                s.sendall(bytes(reversed(buf[:100])))
                del buf[:100]
            if not et:
                break
