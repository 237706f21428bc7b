"""A fork-per-connection server (socketserver.ForkingTCPServer): the parent
accepts, forks, and closes its copy; the child reads one line and answers it
upper-cased. The parent waits a little before forking so the request is
surely read ahead (into the parent's ring) before the fork.

Usage: forking_upper.py PORT
"""

import socketserver
import sys
import time


class Upper(socketserver.StreamRequestHandler):
    def handle(self):
        time.sleep(0.05)
        line = self.rfile.readline()
        self.wfile.write(line.upper())


class Server(socketserver.ForkingTCPServer):
    allow_reuse_address = True

    def process_request(self, request, client_address):
        # The request arrives while the parent still holds the connection.
        time.sleep(0.05)
        super().process_request(request, client_address)


with Server(("127.0.0.1", int(sys.argv[1])), Upper) as srv:
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
