"""What the GPU check's exact-step comparisons and timings rest on: a trainer's weights copied to the host and
compared bitwise, deterministic kernels, device-drained clocks, peak memory and memory given back."""
from __future__ import annotations

import contextlib
import gc
import hashlib
import resource
import time
import warnings

GIB = 1024**3


class Clock:
    """Wall seconds of a block, the device drained at both ends (CUDA work is asynchronous)."""

    def __init__(self, device) -> None:
        import torch

        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.seconds = 0.0

    @contextlib.contextmanager
    def __call__(self):
        self.sync()
        t0 = time.perf_counter()
        try:
            yield self
        finally:
            self.sync()
            self.seconds = time.perf_counter() - t0


def weights_on_host(trainer) -> dict:
    """The policy's full weights copied to the host, once per storage (the tied embedding and head once)."""
    seen, out = set(), {}
    with trainer.gathered_weights():
        for name, t in trainer.model.state_dict().items():
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
            if key not in seen:
                seen.add(key)
                out[name] = t.detach().to("cpu", copy=True)
    return out


def checksum(state: dict) -> str:
    import torch

    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def compare(a: dict, b: dict) -> tuple[bool, float]:
    """(bitwise equal, max |a - b|) over two host state dicts with the same keys."""
    import torch

    equal, diff = set(a) == set(b), 0.0
    for name in a.keys() & b.keys():
        x, y = a[name], b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, float("inf")
        if not torch.equal(x, y):
            equal = False
            diff = max(diff, float((x.float() - y.float()).abs().max()))
    return equal, diff


def drain_after_backward(trainer, cuda: bool):
    """CUDA runs asynchronously, and the trainer's clocks are host clocks: a micro-batch's backward would finish
    inside the next one's forward timing. A hook on the input embedding's weight, whose gradient is the last one
    a backward pass accumulates, waits for the device there, so perf/time_backward holds the backward's work.
    (The reference pass's work still lands in the first forward's timing: both count as log-prob passes.)
    On CPU the hook does nothing."""
    import torch

    module = getattr(trainer, "compute_model", None) or trainer.model
    weight = module.get_input_embeddings().weight
    drain = torch.cuda.synchronize if cuda else (lambda: None)
    return weight.register_post_accumulate_grad_hook(lambda _: drain())


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


@contextlib.contextmanager
def deterministic(cuda: bool):
    """``torch.use_deterministic_algorithms`` on GPU for the exact-step checks (warn_only: a kernel without a
    deterministic version warns); yields a list that holds those warnings when the block ends."""
    import torch

    previous, caught = torch.are_deterministic_algorithms_enabled(), []
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if cuda:
                torch.use_deterministic_algorithms(True, warn_only=True)
            yield caught
            caught.extend(sorted({str(w.message)[:200] for w in seen if "determinis" in str(w.message).lower()}))
    finally:
        torch.use_deterministic_algorithms(previous)


def release(*objects) -> None:
    """Drop a trainer (a DeepSpeed engine is destroyed first) and give its GPU memory back."""
    import torch

    for obj in objects:
        engine = getattr(obj, "engine", None)
        if engine is not None and hasattr(engine, "destroy"):
            with contextlib.suppress(Exception):
                engine.destroy()
    del objects
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
