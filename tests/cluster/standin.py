"""A stand-in replica for the routing tests: `python -m tests.cluster.standin ID PORT`.

A plain threaded HTTP server: `GET /health` answers 200; `POST /hangup` reads the request,
counts it and closes the connection without an answer (a replica that died mid-turn);
`GET /hangups` answers that count; any other GET or POST answers 200 with
`{"replica": ID, "mind_header": ...}` (the body is read whole first). Prints `ready` once it
listens.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main(replica_id: str, port: int) -> None:
    hangups = [0]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            n = int(self.headers.get("content-length") or 0)
            if n:
                self.rfile.read(n)
            if self.path == "/hangup":
                with lock:
                    hangups[0] += 1
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if self.path == "/health":
                body = b'{"status":"ok"}'
            elif self.path == "/hangups":
                body = json.dumps({"n": hangups[0]}).encode()
            else:
                doc = {"replica": replica_id, "mind_header": self.headers.get("x-mind-id")}
                body = json.dumps(doc).encode()
            try:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # a health check that hung up after the status line

        do_GET = _answer
        do_POST = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
