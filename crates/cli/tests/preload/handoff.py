"""Hands an accepted TCP connection to /bin/cat as its stdin and stdout with
subprocess.Popen (the inetd pattern), then talks to cat through the
connection's peer, a socket of this same process.

    handoff.py MODE OUT    MODE: popen (CPython's vfork) | preexec (fork)

The parent closes its copy, sends a payload, shuts its writing side down
and reads cat's echo to EOF into the file OUT; cat must then see EOF and
exit 0. Stdout gets the parent's own lines only (written with os.write,
after the hand-off: a parent whose fd 1 was remapped would send them to
the peer). SIGALRM bounds the run."""
import os, signal, socket, subprocess, sys

mode, out = sys.argv[1], sys.argv[2]
signal.alarm(20)
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
c = socket.create_connection(l.getsockname()); a, _ = l.accept()
kw = {"preexec_fn": lambda: None} if mode == "preexec" else {}
p = subprocess.Popen(["/bin/cat"], stdin=a.fileno(), stdout=a.fileno(), **kw)
a.close()
os.write(1, b"parent stdout line\n")
payload = bytes((i * 7 + i // 251) & 0xFF for i in range(48 * 1024))
c.sendall(payload)
c.shutdown(socket.SHUT_WR)
got = bytearray()
while True:
    b = c.recv(65536)
    if not b:
        break
    got += b
with open(out, "wb") as f:
    f.write(got)
c.close()
os.write(1, b"cat: exit %d\n" % p.wait())
