"""Messages: with the client, 4-byte big-endian lengths + UTF-8 JSON; with a forker, the binary messages below."""
import json
import os
import struct

def frame(obj):
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def send(obj):
    write_all(1, frame(obj))


def read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        part = os.read(fd, n - len(buf))
        if not part:
            return None
        buf += part
    return buf


def read_frame(fd):
    hdr = read_exact(fd, 4)
    if hdr is None:
        return None
    body = read_exact(fd, struct.unpack(">I", hdr)[0])
    return None if body is None else json.loads(body)


class FrameReader:
    """Incremental framing over a non-blocking descriptor."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, chunk):
        self.buf += chunk
        out = []
        while len(self.buf) >= 4:
            (n,) = struct.unpack(">I", self.buf[:4])
            if len(self.buf) < 4 + n:
                break
            out.append(json.loads(bytes(self.buf[4: 4 + n])))
            del self.buf[: 4 + n]
        return out


CODE_CACHE_ENTRIES = 64  # compiled sources kept per cell
CODE_CACHE_MAX_SOURCE = 1 << 16  # larger sources are compiled by their call

# Server -> forker, binary (parsing JSON would touch three times the pages, each a copy-on-write fault): MSG_RUN +
# RUN_HEADER (kind, code-cache key, key to drop, len(text), len(function NUL payload), timeout, seed) + text (the
# program, or a source new to the forker) + function NUL payload; or MSG_KILL (the call floods its output).
# Forker -> server: DONE + DONE_BODY, or CELL_ERROR / FATAL + a 4-byte length + UTF-8 text.
# A call's result pipe: RESULT_VALUE + the return value's JSON, else a JSON object (exit_code, ok, error, ...).
MSG_RUN, MSG_KILL = b"R", b"K"
RESULT_VALUE = b"\x01"
RUN_HEADER = struct.Struct(">BIIIIdI")
KIND_RUN, KIND_CALL = 0, 1
DONE, CELL_ERROR, FATAL = b"D", b"E", b"F"
DONE_BODY = struct.Struct(">iBd")  # wait status, how it was ended (0 itself, 1 timeout, 2 killed), seconds
ENDED, TIMED_OUT, KILLED = 0, 1, 2
