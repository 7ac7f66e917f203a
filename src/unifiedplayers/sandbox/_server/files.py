"""Files: the world-readable mirror of the standard library the calls import from (:func:`stdlib_mirror`), and the
removal of what a call left in its working directory (:func:`rmtree`)."""
import os
import sys

from .kernel import STDLIB

STDLIB_SKIP = {
    "site-packages", "dist-packages", "test", "tests", "idlelib", "tkinter", "turtledemo",
    "ensurepip", "lib2to3", "venv", "pydoc_data", "config-3.11-x86_64-linux-gnu",
}


def stdlib_mirror(cache_root, src=STDLIB):
    """A world-readable mirror of the standard library (hard links where possible), for calls under a uid that cannot
    read the interpreter's home (pyenv under /root); without site-packages, out of reach even by path."""
    dynload = os.path.join(src, "lib-dynload")
    # A stable name (str hashes are salted per process): one mirror per interpreter, reused.
    tag = "stdlib-%s-%08x" % (sys.version.split()[0], fnv32("%s|%s" % (src, sys.version)))
    dst = os.path.join(cache_root, tag)
    if os.path.isdir(dst):
        return dst
    tmp = dst + ".tmp%d" % os.getpid()

    def link(s, d):
        # A symbolic link is mirrored as the file it names (a link to it could dangle in the mirror: relative ones,
        # ones out of the tree); one that names nothing is left out.
        real = os.path.realpath(s)
        if not os.path.isfile(real):
            return
        if os.stat(real).st_mode & 0o444 == 0o444:  # already world-readable: share the inode
            try:
                os.link(real, d)
                return
            except OSError:  # another file system: copy
                pass
        # a copy (never a chmod through a hard link, which would change the installed file's mode)
        with open(real, "rb") as fi, open(d, "wb") as fo:
            fo.write(fi.read())
        os.chmod(d, 0o644)

    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        dirs[:] = [d for d in dirs if d not in (STDLIB_SKIP if rel == "." else ("test", "tests", "idle_test"))]
        os.makedirs(os.path.join(tmp, rel), mode=0o755, exist_ok=True)
        for f in files:
            if f.endswith((".py", ".pyc", ".so")) or os.path.dirname(os.path.join(root, f)) == dynload:
                link(os.path.join(root, f), os.path.join(tmp, rel, f))
    for root, dirs, _files in os.walk(tmp):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    os.chmod(tmp, 0o755)
    try:
        os.rename(tmp, dst)
    except OSError:  # another server built it first
        rmtree(tmp)
    return dst


def rmtree(path):
    """Remove a tree a call left behind, iteratively and by descriptor (no recursion or path-length limit), opening up
    unreadable directories, never following links. What cannot be removed is left, never raised."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        os.chmod(path, 0o700, follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass
    try:
        top = os.open(path, flags)
    except OSError:
        try:
            os.unlink(path)  # a file or a link
        except OSError:
            pass
        return
    stack = [(top, None, None)]  # (directory fd, parent fd, name in parent)
    given_up = set()  # (dev, inode) of directories that could not be emptied: never revisited
    while stack:
        fd, parent, name = stack[-1]
        child = None
        try:
            with os.scandir(fd) as it:
                for entry in it:
                    try:
                        if not entry.is_dir(follow_symlinks=False):
                            os.unlink(entry.name, dir_fd=fd)
                            continue
                        if (entry.inode(), fd) in given_up:
                            continue
                        try:
                            os.chmod(entry.name, 0o700, dir_fd=fd)
                        except OSError:
                            pass
                        child = (os.open(entry.name, flags, dir_fd=fd), fd, entry.name)
                        break
                    except OSError:
                        given_up.add((entry.inode(), fd))
        except OSError:
            pass
        if child is not None:
            stack.append(child)
            continue
        stack.pop()
        if parent is not None:
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError:
                given_up.add((os.fstat(fd).st_ino, parent))
        os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        pass


def fnv32(text):
    h = 0x811C9DC5
    for b in text.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h
