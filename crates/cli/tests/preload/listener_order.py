"""Two listeners, the second never accepted on, and the order a forked
worker's epoll reports them in (an nginx worker's situation: the master
made the listeners, a worker inherited them and has accepted on one).

Usage: listener_order.py FIFO. Prints "ports A B", then the worker:
accepts one connection on A and answers it "1"; reads a line from FIFO
(the driver writes it once a second connection to A and then one to B
are established); then accepts what its level-triggered epoll reports,
in the order reported, answering each with its place ("2", "3"), and
prints "order ..." with the listeners' names in that order.
"""
import os
import select
import socket
import sys


def listener():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    s.setblocking(False)
    return s


def worker(fifo, lis):
    ep = select.epoll()
    by_fd = {}
    for name, s in lis:
        ep.register(s.fileno(), select.EPOLLIN)
        by_fd[s.fileno()] = (name, s)
    order, place = [], 0
    while place < 3:
        for fd, _ in ep.poll():
            name, s = by_fd[fd]
            try:
                c, _ = s.accept()
            except BlockingIOError:
                continue
            place += 1
            if place > 1:
                order.append(name)
            c.setblocking(True)
            c.sendall(str(place).encode())
            c.close()
            if place == 1:
                # Wait (off epoll) until both later connections exist.
                with open(fifo) as f:
                    f.readline()
    print("order " + " ".join(order), flush=True)


def main():
    fifo = sys.argv[1]
    a, b = listener(), listener()
    print("ports %d %d" % (a.getsockname()[1], b.getsockname()[1]), flush=True)
    pid = os.fork()
    if pid == 0:
        worker(fifo, [("a", a), ("b", b)])
        sys.exit(0)  # (not os._exit: the exit records are written at exit)
    _, st = os.waitpid(pid, 0)
    sys.exit(0 if st == 0 else 1)


main()
