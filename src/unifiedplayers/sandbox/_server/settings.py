"""The server's settings, typed: :class:`Settings`, from the client's first message."""
import os


class Settings:
    """What the client sends first: the fields of ``SandboxConfig`` (not importable here) and the calls' folders,
    each type-checked once, so that a bad one fails the server's start by name."""

    # name -> (type, default: None where the client must send it)
    FIELDS = {
        "timeout_s": (float, None),
        "wall_timeout_factor": (float, 1.0),
        "memory_mb": (int, None),
        "max_processes": (int, None),
        "max_output_bytes": (int, None),
        "max_file_mb": (int, None),
        "max_value_bytes": (int, None),
        "max_open_files": (int, 256),
        "workers": (int, 0),
        "network": (bool, None),
        "drop_privileges": (bool, True),
        "user_namespace": (bool, True),
        "uid_base": (int, None),
        "landlock": (bool, True),
        "deterministic": (bool, True),
        "require_isolation": (bool, False),
        "workdir_root": (str, None),
        "workdir_tmpfs_mb": (int, 0),
        "mirror_root": (str, None),
        "uid_lock_root": (str, ""),  # empty: not root, no per-cell uids to lock
    }
    __slots__ = tuple(FIELDS)

    def __init__(self, message):
        if not isinstance(message, dict):
            raise ValueError("sandbox settings: expected an object, got %s" % type(message).__name__)
        for name, (kind, default) in self.FIELDS.items():
            value = message.get(name)
            if value is None:
                if default is None:
                    raise ValueError("sandbox settings: %r is missing" % name)
                value = default
            if kind is float and type(value) is int:
                value = float(value)
            if type(value) is not kind:
                raise ValueError("sandbox settings: %r must be %s, got %r" % (name, kind.__name__, value))
            setattr(self, name, value)
        if self.workers == 0:
            self.workers = 2 * (os.cpu_count() or 1)  # two cells per core: see Server
