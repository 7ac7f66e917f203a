"""The modules model-written code commonly imports, loaded once in the server so that each call's fork gets them for
free. Imported first (``__main__``), before anything else imports ``random``."""
import os

# Modules model-written code commonly imports, loaded once here so each fork gets them for free. The
# list is short on purpose: every call's fork and exit cost grows with this process's memory
# (benchmarks/README.md, "Where the sandbox's time goes"), so rarer, larger modules (dataclasses,
# statistics) are imported by the calls that use them (datetime is imported by the server itself, for the
# calls' virtual calendar clock). The server itself avoids shutil and sysconfig for the same reason.
PRELOAD = (
    "bisect", "cmath", "collections", "copy", "decimal", "enum", "fractions", "functools", "heapq",
    "itertools", "json", "math", "numbers", "operator", "random", "re", "string", "typing",
)


def _import_random():
    """Import ``random`` with its after-fork hook (a fresh seed in each call, as a fresh interpreter gets)
    calling the C seed directly: ``Random.seed`` would first run its Python checks and ``super()``,
    about 30 copy-on-write faults in every call. Same effect: a seed from the OS, ``gauss_next`` None
    (as this process, which never samples, has it)."""
    import functools

    hooks = []
    register = os.register_at_fork
    os.register_at_fork = lambda **kw: hooks.append(kw)
    try:
        import random
        import _random
    finally:
        os.register_at_fork = register
    for kw in hooks:
        if kw == {"after_in_child": random._inst.seed} and random._inst.gauss_next is None:
            kw = {"after_in_child": functools.partial(_random.Random.seed, random._inst)}
        register(**kw)


_import_random()
for _name in PRELOAD:
    __import__(_name)
