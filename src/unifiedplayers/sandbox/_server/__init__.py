"""The sandbox's warm fork server: standard library only, run by path as ``python -P -s -S <this folder>``
(``__main__``). :mod:`.dispatch` is the server, :mod:`.forker` a cell, :mod:`.call` one call; the other modules
are the isolation layers, the messages (:mod:`.framing`) and the calls' clock (:mod:`.clock`). How a call runs:
docs/sandbox.md. Messages with the client are 4-byte big-endian lengths + UTF-8 JSON.
"""
