"""What an idle player keeps out of host memory: tensors parked, bit-exactly, in a file without a name
(:func:`offload_file`, in ``trainer.offload_dir``): its optimizer state, its float32 master weights when it samples
from a lower-precision copy, and π_ref. :class:`ParkedTensors` parks tensors that alone hold their memory,
:class:`ParkedStorages` storages that others hold views of (DeepSpeed's flat buffers).
"""
from __future__ import annotations

import ctypes
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable, Optional

import torch

Tensor = torch.Tensor

# Smaller storages of DeepSpeed's optimizer stay in memory (ParkedStorages): scalars and norms cost nothing, and the
# engine may read them at any time.
MIN_BYTES = 64 * 1024

_warned: set[str] = set()


def offload_file(directory: Path) -> Any:
    """A file without a name in ``directory`` (O_TMPFILE, or unlinked at once): its space returns to the disk when
    it is closed or its process ends, however it ends (kill -9 included)."""
    directory.mkdir(parents=True, exist_ok=True)
    _warn_if_in_memory(directory)
    return tempfile.TemporaryFile(dir=directory)


def filesystem_type(directory: Path) -> str:
    """The type of the file system ``directory`` is on (the longest mount point of /proc/mounts above it)."""
    best, kind = "", ""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    path = str(directory.resolve())
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, kind = mount, fields[2]
    return kind


def _warn_if_in_memory(directory: Path) -> None:
    key = str(directory)
    if key in _warned:
        return
    _warned.add(key)
    if filesystem_type(directory) in ("tmpfs", "ramfs"):
        warnings.warn(f"trainer.offload_dir {directory} is on a {filesystem_type(directory)}: an idle player's "
                      "state parked there stays in memory; set trainer.offload_dir (or TMPDIR) to a disk",
                      stacklevel=3)


def _memory(address: int, size: int) -> memoryview:
    """The host memory at ``address`` as a writable byte view (through ctypes: ``Tensor.numpy()`` would mark the
    storage as not resizable for good)."""
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


def _write(file: Any, regions: list[tuple[int, int]]) -> None:
    for address, size in regions:
        file.write(_memory(address, size))
    file.flush()


def _read_into(file: Any, address: int, size: int) -> None:
    view, done = _memory(address, size), 0
    while done < size:
        read = file.readinto(view[done:])
        if not read:
            raise EOFError(f"the offload file ended after {done} of {size} bytes")
        done += read


def _region(t: Tensor) -> tuple[int, int]:
    """(address, bytes) of a contiguous host tensor."""
    return t.data_ptr(), t.numel() * t.element_size()


class _Parked:
    """The file of parked bytes, and what :meth:`restore` does with it (subclasses: where the bytes go back)."""

    nbytes = 0
    _file: Any = None

    def _park(self, regions: list[tuple[int, int]], directory: str | Path, contents: bool) -> None:
        """Write the host memory ``regions`` ((address, bytes)) to a new file, unless ``contents`` is False."""
        self.nbytes = sum(size for _, size in regions)
        if contents and regions:
            self._file = offload_file(Path(directory))
            _write(self._file, regions)

    @property
    def freed_unwritten(self) -> bool:
        """Whether memory was freed without its values being kept (``contents=False``, or discarded)."""
        return bool(self.nbytes) and self._file is None

    def discard(self) -> None:
        """Drop the parked values: :meth:`restore` then gives the memory back uninitialised."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _restore(self, regions: Iterable[tuple[int, int]]) -> None:
        if self._file is not None:
            self._file.seek(0)
            for address, size in regions:
                _read_into(self._file, address, size)
        self.discard()


class ParkedTensors(_Parked):
    """``tensors`` (each the only holder of its memory) parked: those on the host and contiguous are written to a file
    without a name in ``directory`` and their ``data`` replaced by an empty tensor (a read by mistake fails on the
    shape). ``contents=False``: freed unwritten; :meth:`restore` gives the memory back uninitialised."""

    def __init__(self, tensors: Iterable[Optional[Tensor]], directory: str | Path, contents: bool = True) -> None:
        unique = {id(t): t for t in tensors if t is not None}.values()
        self._tensors = [t for t in unique if t.device.type == "cpu" and t.is_contiguous() and t.numel()]
        self._shapes = [t.shape for t in self._tensors]
        self._park([_region(t) for t in self._tensors], directory, contents)
        for t in self._tensors:
            t.data = torch.empty(0, dtype=t.dtype)

    def restore(self) -> None:
        """Every tensor back, with its values as they were parked (unless discarded)."""
        for t, shape in zip(self._tensors, self._shapes):
            t.data = torch.empty(shape, dtype=t.dtype)
        self._restore(_region(t) for t in self._tensors)
        self._tensors, self._shapes = [], []


class ParkedStorages(_Parked):
    """The host storages of ``tensors`` (at least ``min_bytes``, not pinned), except those of ``keep``, parked: written
    to a file without a name and resized to zero bytes until :meth:`restore` gives them their bytes back (none may be
    read before). ``contents=False`` as :class:`ParkedTensors`'."""

    def __init__(self, tensors: Iterable[Optional[Tensor]], directory: str | Path, keep: Iterable[Tensor] = (),
                 min_bytes: int = MIN_BYTES, contents: bool = True) -> None:
        kept = {t.untyped_storage().data_ptr() for t in keep if t is not None and t.device.type == "cpu"}
        storages: dict[int, torch.UntypedStorage] = {}
        for t in tensors:
            if t is None or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key and key not in kept and storage.nbytes() >= min_bytes and storage.resizable():
                storages.setdefault(key, storage)
        self._storages = list(storages.values())
        self._sizes = [s.nbytes() for s in self._storages]
        self._park([(st.data_ptr(), st.nbytes()) for st in self._storages], directory, contents)
        for storage in self._storages:
            storage.resize_(0)

    def restore(self) -> None:
        """Every storage back, with its bytes as they were parked."""
        for storage, size in zip(self._storages, self._sizes):
            storage.resize_(size)
        self._restore((st.data_ptr(), st.nbytes()) for st in self._storages)
        self._storages, self._sizes = [], []
