"""The sandbox's warm fork server: a package of the standard library only, run by path as
``python -P -s -S <this folder>`` (``__main__``), one module per concern:

- :mod:`.dispatch`: the server itself (dispatch, watching the cells, answering the client); :mod:`.settings`;
- :mod:`.forker`: a cell's forker; :mod:`.call`: one call's process; :mod:`.results`: a call's result;
- :mod:`.layers`, :mod:`.namespaces`, :mod:`.landlock`, :mod:`.uids`, :mod:`.files`: the isolation layers;
- :mod:`.framing`: the messages; :mod:`.clock`: the virtual clock and seeds; :mod:`.warmup`: regular expressions;
- :mod:`.preload`: the modules loaded before the first fork; :mod:`.kernel`: libc and its flags.


Started once per :class:`~unifiedplayers.sandbox.Sandbox` with an empty environment, it imports the
modules that model-written code usually needs and starts two *cells* per core. Each cell is a *forker*
process that takes, once, every isolation layer that does not change from call to call, and then forks
one short process per call, so a call pays for a fork and a few system calls only:

- the whole server: an empty network namespace and a private tmpfs (once at start-up, as root, or in a user
  namespace of its own when not root);
- each forker: its own unprivileged uid (as root) or its own user and PID namespace (not root), and RLIMIT_NPROC
  on that uid or namespace against fork bombs,
  a clean environment, ``sys.path`` limited to a mirror of the standard library, and a Landlock
  domain: read-only access to that mirror and the system's shared libraries, full access to the cell's
  own directory only, no ``execve``, no TCP, no signals or abstract sockets outside the domain;
- each call: a fresh empty working directory (removed afterwards), its own session, a nested Landlock
  domain (so it cannot signal its forker), and RLIMIT_AS/DATA (memory), CPU, FSIZE and NOFILE.

The forker enforces the call's CPU-time limit (and a wall-clock cap) and afterwards kills every process of its uid, or
of its PID namespace, but itself (``kill(-1)``) and, as their subreaper or init, reaps them all before the next call,
so nothing a call started outlives it or holds the process bound. The server does the rest of the bookkeeping, so
that the forker, whose every written page costs a copy-on-write fault after each fork, writes few: it
dispatches requests to free cells, reads each call's stdout, stderr and result from the cell's pipes,
truncates them and stops floods, builds the results, watches the forkers (a dead or stuck one is killed,
swept and replaced, and its call recorded as failed) and answers the client. Messages with the client
are 4-byte big-endian lengths + UTF-8 JSON.
"""
