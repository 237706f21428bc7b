"""Sends and receives on sockets that are not (or no longer) connected for
writing: run on kernel sockets and under `tcps run`, it must print the same.

One line per step: the socket's state, the call, and what it returned (a
count or the errno's name; `SIGPIPE` when the call raised that signal).
Python ignores SIGPIPE; the handler set here counts it instead, so the line
shows whether the call raised it, as the kernel does for a send without
MSG_NOSIGNAL.

States: fresh, bound, listening, connecting (a non-blocking connect to
argv[1], a kernel listener whose accept queue is full: its SYN is dropped
and the connect stays in progress), connected (sent on, then shut down for
writing; and shut down for writing before any send), shut down for
reading and writing.

Usage: unconnected.py FULL_PORT
"""
import errno
import signal
import socket
import sys

FULL_PORT = int(sys.argv[1])

pipes = []
signal.signal(signal.SIGPIPE, lambda *_: pipes.append(1))


def name(e):
    return errno.errorcode.get(e, str(e))


def step(state, what, fn):
    del pipes[:]
    try:
        r = fn()
        out = str(r if isinstance(r, int) else len(r))
    except OSError as e:
        out = name(e.errno)
    if pipes:
        out += " SIGPIPE"
    print(f"{state} {what}: {out}", flush=True)


def calls(state, s, recv=True):
    """The sends and receives of one state, each flag that matters."""
    step(state, "send", lambda: s.send(b"x"))
    step(state, "send nosignal", lambda: s.send(b"x", socket.MSG_NOSIGNAL))
    step(state, "send dontwait", lambda: s.send(b"x", socket.MSG_DONTWAIT))
    step(state, "sendmsg", lambda: s.sendmsg([b"ab", b"cd"]))
    step(state, "write", lambda: __import__("os").write(s.fileno(), b"y"))
    step(state, "send again", lambda: s.send(b"x"))
    if recv:
        step(state, "recv dontwait", lambda: s.recv(4, socket.MSG_DONTWAIT))


def fresh():
    s = socket.socket()
    calls("fresh", s)
    step("fresh", "recv", lambda: s.recv(4))
    s.close()


def bound():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    calls("bound", s)
    step("bound", "recv", lambda: s.recv(4))
    s.close()


def listening():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    calls("listening", s)
    step("listening", "recv", lambda: s.recv(4))
    s.close()


def connecting():
    s = socket.socket()
    s.setblocking(False)
    step("connecting", "connect", lambda: s.connect_ex(("127.0.0.1", FULL_PORT)))
    calls("connecting", s)
    s.close()


def pair():
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(4)
    c = socket.create_connection(l.getsockname())
    a, _ = l.accept()
    l.close()
    return c, a


def shut_after_send():
    c, a = pair()
    step("shut-after-send", "send before", lambda: c.send(b"before"))
    c.shutdown(socket.SHUT_WR)
    calls("shut-after-send", c)
    step("shut-after-send", "peer reads", lambda: a.recv(100))
    step("shut-after-send", "peer reads eof", lambda: a.recv(100))
    c.close()
    a.close()


def shut_first(how, state):
    c, a = pair()
    c.shutdown(how)
    # (Not a receive after SHUT_RD: through a receive ring it may still
    # answer EAGAIN where the kernel's is 0 at once; sends are this test's.)
    calls(state, c, how != socket.SHUT_RDWR)
    step(state, "peer reads eof", lambda: a.recv(100))
    c.close()
    a.close()


def accepted_shut():
    c, a = pair()
    step("accepted-shut", "send before", lambda: a.send(b"before"))
    a.shutdown(socket.SHUT_WR)
    calls("accepted-shut", a)
    step("accepted-shut", "peer reads", lambda: c.recv(100))
    step("accepted-shut", "peer reads eof", lambda: c.recv(100))
    c.close()
    a.close()


def connected():
    """Still connected: every send goes through, in order."""
    c, a = pair()
    calls("connected", c)
    c.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = a.recv(100)
        if not b:
            break
        got += b
    print(f"connected peer got: {got!r}", flush=True)
    c.close()
    a.close()


fresh()
bound()
listening()
connecting()
shut_after_send()
shut_first(socket.SHUT_WR, "shut-wr")
shut_first(socket.SHUT_RDWR, "shut-rdwr")
accepted_shut()
connected()
print("done", flush=True)
