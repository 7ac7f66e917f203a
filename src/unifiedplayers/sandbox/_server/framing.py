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
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue


def send(obj):
    write_all(1, frame(obj))


def read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        try:
            part = os.read(fd, n - len(buf))
        except InterruptedError:
            continue
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

# Messages. Server -> forker: MSG_RUN + RUN_HEADER + text + function NUL payload, or MSG_KILL (end the
# running call now: its output is flooding). Binary rather than JSON: a forker that parses JSON touches
# about three times as many pages per call, each a copy-on-write fault. RUN_HEADER: kind, the
# source's key in the forker's code cache (0: none), a key the forker may drop from its cache (0: none),
# the lengths of text and of function NUL payload, the timeout, the call's seed. ``text`` is the program (run), or the
# source (call) the first time the forker sees that key, else empty. Forker -> server: DONE (after the
# call was reaped and swept), CELL_ERROR (this call could not be run) or FATAL (the cell could not start),
# the last two followed by a 4-byte length and UTF-8 text.
# A call's result pipe: RESULT_VALUE and the return value's JSON when the call returned normally, else a
# JSON object (exit_code, memory_exceeded, ok, value, error, traceback).
MSG_RUN, MSG_KILL = b"R", b"K"
RESULT_VALUE = b"\x01"
RUN_HEADER = struct.Struct(">BIIIIdI")
KIND_RUN, KIND_CALL = 0, 1
DONE, CELL_ERROR, FATAL = b"D", b"E", b"F"
DONE_BODY = struct.Struct(">iBd")  # wait status, how it was ended (0 itself, 1 timeout, 2 killed), seconds
ENDED, TIMED_OUT, KILLED = 0, 1, 2
