"""The sandbox's warm fork server: a package of the standard library only, run by path as
``python -P -s -S <this folder>`` (``__main__``), one module per concern:

- :mod:`.dispatch`: the server itself (dispatch, watching the cells, answering the client); :mod:`.settings`;
- :mod:`.forker`: a cell's forker; :mod:`.call`: one call's process; :mod:`.results`: a call's result;
- :mod:`.layers`, :mod:`.namespaces`, :mod:`.landlock`, :mod:`.uids`, :mod:`.files`: the isolation layers;
- :mod:`.framing`: the messages; :mod:`.clock`: the virtual clock and seeds; :mod:`.warmup`: regular expressions;
- :mod:`.preload`: the modules loaded before the first fork; :mod:`.kernel`: libc and its flags.

Started once per :class:`~unifiedplayers.sandbox.Sandbox` with an empty environment, it starts two forkers per
core; each takes once the isolation layers that do not change from call to call, then forks one short process per
call (docs/sandbox.md gives the layers). The server does the bookkeeping (dispatch, reading outputs, building
results, replacing dead or stuck forkers), so that a forker, whose every written page costs a copy-on-write fault
after each fork, writes few. Messages with the client are 4-byte big-endian lengths + UTF-8 JSON.
"""
