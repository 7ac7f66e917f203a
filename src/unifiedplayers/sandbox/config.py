"""Settings of the sandbox (Hydra group ``conf/sandbox/``). Imports nothing of the project."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class SandboxConfig:
    """Limits and isolation of one sandboxed call (Appendix D.3)."""

    timeout_s: float = 10.0  # CPU time per call; every process the call started is killed after it
    wall_timeout_factor: float = 3.0  # ... or after this many times timeout_s of wall clock (a call that sleeps)
    memory_mb: int = 512  # address-space cap per call (RLIMIT_AS)
    max_processes: int = 16  # processes one call may run at once (fork-bomb bound)
    max_output_bytes: int = 16384  # stdout and stderr are each truncated to this many bytes
    max_file_mb: int = 16  # largest file a call may write in its working directory
    max_value_bytes: int = 1 << 20  # largest JSON return value of a function call
    max_open_files: int = 256  # descriptors one call may hold open (RLIMIT_NOFILE)
    workers: int = 0  # calls run at once; 0 = two per core
    network: bool = False  # False: each call runs in an empty network namespace
    drop_privileges: bool = True  # as root, run each call under its own unprivileged uid
    user_namespace: bool = True  # not root: isolate through user namespaces (netns, a PID namespace per cell, tmpfs)
    uid_base: int = 61000  # first uid of the per-worker uids
    landlock: bool = True  # restrict file access to the working directory and the standard library
    deterministic: bool = True  # every run gives a call the same clock (virtual), random seed and str hash
    require_isolation: bool = False  # fail at start-up if a layer (netns, uid drop, Landlock) is unavailable
    workdir_root: Optional[str] = None  # parent of the per-call working directories (default: system temp)
    workdir_tmpfs_mb: int = 512  # as root: the working directories live in a private tmpfs of this size
    #                              (shared by all calls at once; 0 = on disk under workdir_root)
