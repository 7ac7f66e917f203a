"""The modules model-written code commonly imports, loaded once in the server so that each call's fork gets them for
free. Imported first (``__main__``), before anything else imports ``random``."""
import os

# Short on purpose: a fork's cost grows with this process's memory (benchmarks/README.md, "Where the sandbox's time
# goes"), so rarer, larger modules are imported by the calls that use them (and the server avoids shutil, sysconfig).
PRELOAD = (
    "bisect", "cmath", "collections", "copy", "decimal", "enum", "fractions", "functools", "heapq",
    "itertools", "json", "math", "numbers", "operator", "random", "re", "string", "typing",
)


def _import_random():
    """Import ``random`` with its after-fork hook (a fresh seed in each call) calling the C seed directly, without
    ``Random.seed``'s Python checks (copy-on-write faults in every call); ``gauss_next`` is None here already."""
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
