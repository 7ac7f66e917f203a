"""A local OpenAI-compatible Teacher for the tests: ``serve_teacher(reply)`` answers every chat-completions
request with ``reply(prompt)``, the prompt being the request's first message, and records what it saw."""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Callable, Iterator


@dataclass
class StubTeacher:
    url: str  # the base URL, ending in /v1
    seen: list = field(default_factory=list)  # (path, model, Authorization header, prompt) per request


@contextmanager
def serve_teacher(reply: Callable[[str], str]) -> Iterator[StubTeacher]:
    """Serve ``reply`` on 127.0.0.1 (a free port) for the duration of the ``with`` block."""
    seen: list = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompt = body["messages"][0]["content"]
            seen.append((self.path, body["model"], self.headers.get("Authorization"), prompt))
            data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply(prompt)}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield StubTeacher(f"http://127.0.0.1:{server.server_port}/v1", seen)
    finally:
        server.shutdown()
        server.server_close()
