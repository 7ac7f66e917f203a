"""One rank of a short job that only runs collectives (launched by tests/distributed/test_watchdog.py under
torchrun): ``MODE OUT_DIR STEPS``. Each step broadcasts rank 0's step number and writes ``OUT_DIR/rank<r>.step``;
``OUT_DIR/rank<r>.pid`` holds the rank's pid. Modes:

- ``beat``: only that (the test stops a rank from outside);
- ``raise<r>``: rank r raises at step 3 after writing the time to ``OUT_DIR/raised``; a thread that is not a
  daemon keeps its process alive for 60 s more, as a pool that does not shut down would, so that only the failure
  note ends the other rank before its collective times out;
- ``mismatch``: at step 3 rank 0 gathers while rank 1 waits at the broadcast (a collective edited on one side);
- ``solo``: at step 2 rank 0 works alone for ``SOLO_S`` seconds (a pure-Python loop, then a sleep) while rank 1 waits
  at the broadcast, as during rank 0's verdicts, pool and checkpoints.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import unifiedplayers.distributed as D
from unifiedplayers.distributed import destroy, init_distributed


def solo_stage(seconds: float) -> None:
    """Rank 0 alone: half of ``seconds`` in a pure-Python loop (which must yield the interpreter lock to the pulse
    thread), then half asleep."""
    end = time.monotonic() + seconds / 2
    total = 0
    while time.monotonic() < end:
        total += sum(i * i for i in range(1000))
    time.sleep(seconds / 2)


def run(dist, mode: str, out: Path, steps: int) -> None:
    (out / f"rank{dist.rank}.pid").write_text(str(os.getpid()))
    for step in range(steps):
        if mode == "solo" and step == 2 and dist.is_main:
            solo_stage(float(os.environ["SOLO_S"]))
        if mode == f"raise{dist.rank}" and step == 3:
            threading.Thread(target=time.sleep, args=(60,), daemon=False).start()
            (out / "raised").write_text(str(time.time()))
            raise RuntimeError(f"planted failure on rank {dist.rank} at step {step}")
        if mode == "mismatch" and step == 3 and dist.is_main:
            dist.gather(step)
        assert dist.broadcast(step) == step
        (out / f"rank{dist.rank}.step").write_text(str(step))
        time.sleep(0.2)


def main(mode: str, out: str, steps: str) -> None:
    dist = init_distributed()
    if D._WATCHDOG is not None:
        print("[worker] watchdog on", flush=True)
    try:
        run(dist, mode, Path(out), int(steps))
    finally:
        destroy(dist)


if __name__ == "__main__":
    main(*sys.argv[1:])
