"""SIGALRM breaks a blocking accept (the report of issue 18): a handler that
raises ends the call after 0.5 s; one that does not lets it go on (PEP 475)
until a connection arrives. Run on kernel sockets and under `tcps run`
(preload_signals.rs): the output must be the same."""
import signal, socket, time, sys
class Alarm(Exception): pass
def h(s, f): raise Alarm()
signal.signal(signal.SIGALRM, h)
signal.siginterrupt(signal.SIGALRM, True)
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
signal.setitimer(signal.ITIMER_REAL, 0.5)
t = time.monotonic()
try:
    l.accept()
    print("accepted?!")
except Alarm:
    print("alarm broke accept after %.1f s" % (time.monotonic() - t))
# handler that does not raise: PEP 475 retries; a connection arrives later
got = []
signal.signal(signal.SIGALRM, lambda s, f: got.append(s))
import threading
threading.Timer(1.0, lambda: socket.create_connection(l.getsockname())).start()
signal.setitimer(signal.ITIMER_REAL, 0.5)
c, _ = l.accept()
print("accepted after the handler ran:", got == [signal.SIGALRM])
