"""A server that accepts with a plain blocking accept() (no poll, select
or epoll first), for a host with several TCP servers (cluster_multi.rs):
each connection's bytes are read to the end and answered with their
SHA-256; every accepted peer's address is printed.

    accept_block.py PORT N    listens on 0.0.0.0:PORT, serves N connections
"""
import hashlib
import socket
import sys


def main():
    port, n = int(sys.argv[1]), int(sys.argv[2])
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(16)
    print("LISTENING", flush=True)
    for _ in range(n):
        c, peer = s.accept()
        data = b""
        while True:
            b = c.recv(65536)
            if not b:
                break
            data += b
        c.sendall(hashlib.sha256(data).hexdigest().encode())
        c.close()
        print("ACCEPTED", peer[0], flush=True)


if __name__ == "__main__":
    main()
