"""Landlock (linux/landlock.h): one ruleset per cell, built from path descriptors opened once (:class:`Landlock`)."""
import ctypes
import os

from .kernel import PR_SET_NO_NEW_PRIVS, libc

# Landlock (linux/landlock.h). The syscall numbers are the same on every architecture.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_TRUNCATE = 1 << 14
FS_IOCTL_DEV = 1 << 15
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

SYSTEM_READ_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/share/zoneinfo")
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _fs_rights(abi):
    rights = (1 << 13) - 1  # EXECUTE .. MAKE_SYM (ABI 1)
    if abi >= 2:
        rights |= 1 << 13  # REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


class Landlock:
    """Builds and applies one Landlock domain per call from path fds opened once at start-up."""

    def __init__(self, read_dirs, read_files):
        abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                           ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
        self.abi = int(abi) if abi > 0 else 0
        self.ok = self.abi > 0
        if not self.ok:
            return
        self.handled_fs = _fs_rights(self.abi)
        self.handled_net = (NET_BIND_TCP | NET_CONNECT_TCP) if self.abi >= 4 else 0
        self.scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if self.abi >= 6 else 0
        read = FS_READ_FILE | FS_READ_DIR
        self.rules = []  # (O_PATH fd, rights)
        for path in read_dirs:
            if os.path.isdir(path):
                self.rules.append((os.open(path, os.O_PATH | os.O_CLOEXEC), read))
        for path in read_files:
            if os.path.exists(path):
                rights = FS_READ_FILE | (FS_WRITE_FILE if path == "/dev/null" else 0)
                self.rules.append((os.open(path, os.O_PATH | os.O_CLOEXEC), rights & self.handled_fs))

    def _add(self, ruleset, fd, rights):
        attr = _PathBeneathAttr(rights & self.handled_fs, fd)
        if libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                         ctypes.byref(attr), 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_add_rule")

    def ruleset(self, cell_dir):
        """A ruleset: the read-only paths plus everything but execute beneath ``cell_dir``."""
        attr = _RulesetAttr(self.handled_fs, self.handled_net, self.scoped)
        size = ctypes.sizeof(_RulesetAttr) if self.abi >= 6 else 16
        ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
        if ruleset < 0:
            raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
        for fd, rights in self.rules:
            self._add(ruleset, fd, rights)
        wd = os.open(cell_dir, os.O_PATH | os.O_CLOEXEC)
        self._add(ruleset, wd, self.handled_fs & ~FS_EXECUTE)
        os.close(wd)
        return int(ruleset)

    @staticmethod
    def restrict(ruleset, no_new_privs=True):
        """Confine the calling process and its future children. ``no_new_privs=False`` where the flag is
        already set (it is inherited: a call's fork of a confined cell worker has it)."""
        if no_new_privs and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
