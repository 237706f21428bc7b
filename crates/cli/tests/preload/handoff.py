"""Hands an accepted TCP connection to /bin/cat as its stdin and stdout with
subprocess.Popen (the inetd pattern), then talks to cat through the
connection's peer, a socket of this same process.

    handoff.py MODE OUT    MODE: popen (CPython's vfork) | preexec (fork) |
                                 early (popen after the first bytes arrived)

The parent closes its copy, sends a payload, shuts its writing side down
and reads cat's echo to EOF into the file OUT; cat must then see EOF and
exit 0. Stdout gets the parent's own lines only (written with os.write,
after the hand-off: a parent whose fd 1 was remapped would send them to
the peer). SIGALRM bounds the run.

`early`: the peer sends its first bytes before the hand-off and the parent
waits until the connection is readable: through tcps they were read ahead
into the parent's memory, which no kernel socket can give back, so Popen
fails (the line "hand-off refused: ERRNO" on stdout, and the peer gets
the end of the connection, nothing sent); on the kernel, cat echoes them first."""
import errno, os, select, signal, socket, subprocess, sys

mode, out = sys.argv[1], sys.argv[2]
signal.alarm(20)
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
c = socket.create_connection(l.getsockname()); a, _ = l.accept()
payload = bytes((i * 7 + i // 251) & 0xFF for i in range(48 * 1024))
first = 0
if mode == "early":
    first = 4096
    c.sendall(payload[:first])
    select.select([a], [], [], 10)
kw = {"preexec_fn": lambda: None} if mode == "preexec" else {}
try:
    p = subprocess.Popen(["/bin/cat"], stdin=a.fileno(), stdout=a.fileno(), **kw)
except OSError as e:
    p = None
    os.write(1, b"hand-off refused: %s\n" % errno.errorcode[e.errno].encode())
a.close()
os.write(1, b"parent stdout line\n")
if p is not None:
    c.sendall(payload[first:])
c.shutdown(socket.SHUT_WR)
got = bytearray()
while True:
    try:
        b = c.recv(65536)
    except ConnectionResetError:  # closed with the unread bytes: a reset
        b = b""
    if not b:
        break
    got += b
with open(out, "wb") as f:
    f.write(got)
c.close()
if p is not None:
    os.write(1, b"cat: exit %d\n" % p.wait())
