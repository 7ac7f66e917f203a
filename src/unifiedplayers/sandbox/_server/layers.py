"""The isolation layers the server takes once, for all its cells (:func:`take_isolation`): as root, or through a user
namespace, or what is left without either; each missing layer with the reason."""
import ctypes
import os

from .files import stdlib_mirror
from .kernel import CLONE_NEWNET, STDLIB, libc
from .landlock import DEVICE_FILES, Landlock, SYSTEM_READ_DIRS
from .namespaces import enter_user_namespace, private_tmpfs, user_namespace_trial

def take_isolation(cfg, root, claim_uids):
    """``(iso, landlock)``: ``iso`` says which layers the server got and by which ``mechanism``, ``notes`` and
    ``reasons`` why one is missing (none for a layer the config switched off), and ``sys_path`` the calls' standard
    library; ``landlock`` builds the cells' rulesets (None without Landlock). ``claim_uids(cfg)``: a free block."""
    notes = []
    reasons = {}  # layer -> why the machine did not give it (switched off by the config: no entry)
    iso = {"uid": False, "pidns": False, "netns": False, "landlock": False, "cell_namespaces": False}
    if os.geteuid() == 0:
        iso["mechanism"] = "root"
        if cfg.drop_privileges:
            iso["uid"] = True
            iso["uid_base"] = claim_uids(cfg)
    else:
        _take_user_namespace(cfg, root, iso, notes, reasons)
    privileged = iso["mechanism"] != "none"
    if not cfg.network:
        if libc.unshare(CLONE_NEWNET) == 0:
            iso["netns"] = True
        else:
            notes.append("network namespace unavailable (%s)" % os.strerror(ctypes.get_errno()))
            reasons["netns"] = "unshare(CLONE_NEWNET) failed: %s" % os.strerror(ctypes.get_errno())
    iso["tmpfs"] = False
    if cfg.workdir_tmpfs_mb > 0 and privileged:
        error = private_tmpfs(root, cfg.workdir_tmpfs_mb)
        if error is None:
            iso["tmpfs"] = True
        else:
            notes.append("working directories on disk (%s)" % error)
            reasons["tmpfs"] = notes[-1]
    elif cfg.workdir_tmpfs_mb > 0:
        reasons["tmpfs"] = "not root: cannot mount a private tmpfs; working directories on disk, total uncapped"
    stdlib = stdlib_mirror(cfg.mirror_root) if iso["uid"] else STDLIB
    iso["sys_path"] = [stdlib, os.path.join(stdlib, "lib-dynload")]
    landlock = None
    if cfg.landlock:
        landlock = Landlock([stdlib] + list(SYSTEM_READ_DIRS), DEVICE_FILES)
        iso["landlock"] = landlock.ok
        iso["landlock_abi"] = landlock.abi
        if not landlock.ok:
            notes.append("Landlock unavailable on this kernel")
            # errno of landlock_create_ruleset: ENOSYS not built in, EOPNOTSUPP built in but not enabled
            reasons["landlock"] = "kernel has no Landlock (%s)" % os.strerror(ctypes.get_errno())
            landlock = None
    iso.update(notes=notes, reasons=reasons)
    return iso, landlock


def _take_user_namespace(cfg, root, iso, notes, reasons):
    """Not root: enter a user namespace mapping the caller's uid to itself (docs/sandbox.md), once every step has
    passed its trial (:func:`user_namespace_trial`); otherwise mechanism ``none``, and why."""
    if not cfg.user_namespace:
        iso["mechanism"] = "none"
        reasons["uid"] = ("not root (uid %d): cannot drop to a per-call uid, calls run under the caller's uid "
                          "(sandbox.user_namespace=false)" % os.geteuid())
        notes.append(reasons["uid"])
        return
    why, nproc = user_namespace_trial(cfg, root)
    if why is not None:
        iso["mechanism"] = "none"
        reasons["uid"] = ("not root (uid %d) and no user namespace (%s): calls run under the caller's uid, their "
                          "descendants not bounded, nor swept once they leave the call's process group"
                          % (os.geteuid(), why))
        notes.append(reasons["uid"])
        iso["user_namespace_error"] = why
        return
    why = enter_user_namespace()
    if why is not None:  # its trial passed: something changed meanwhile, and this process is now half way
        raise RuntimeError("entering the user namespace failed after its trial had passed: %s" % why)
    iso["mechanism"] = "user namespace"
    iso["cell_namespaces"] = True
    iso["pidns"] = nproc is None
    if nproc is not None:
        reasons["pidns"] = nproc + " (descendants are still swept with their cell's PID namespace)"
        notes.append(reasons["pidns"])
