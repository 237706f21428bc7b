"""writev and sendmsg with bad iovec arrays (a negative or too large count, a NULL base with a length, a msg_iovlen past 2^32) on a connected socket: the errno of each, then a good writev; run on kernel sockets and under tcps run, the output must be the same (preload_iov.rs)."""
import socket, os, ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1)
s = socket.create_connection(l.getsockname()); a, _ = l.accept()
class iovec(ctypes.Structure): _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
v = (iovec * 2)(iovec(None, 5), iovec(None, 0))
for n in (-1, 2, 5000):
    r = libc.writev(s.fileno(), v, n); print("writev", n, r, errno.errorcode.get(ctypes.get_errno()) if r < 0 else "")
class msghdr(ctypes.Structure): _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint), ("iov", ctypes.c_void_p), ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t), ("flags", ctypes.c_int)]
m = msghdr(None, 0, ctypes.cast(v, ctypes.c_void_p), (1 << 32) + 1, None, 0, 0)
r = libc.sendmsg(s.fileno(), ctypes.byref(m), 0); print("sendmsg huge", r, errno.errorcode.get(ctypes.get_errno()) if r < 0 else "")
ok = (iovec * 1)(iovec(ctypes.cast(ctypes.c_char_p(b"hello"), ctypes.c_void_p), 5))
print("writev ok", libc.writev(s.fileno(), ok, 1)); print(a.recv(10))
