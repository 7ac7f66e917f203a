"""Analyses of a training run directory (§4.4, §4.5, Appendix D.2, H.2). Each is runnable on its own::

    python -m eval.analysis.discrimination RUN_DIR      # verifier accuracy, originals vs perturbations
    python -m eval.analysis.reward_variance RUN_DIR     # verdict reward vs majority-vote agreement
    python -m eval.analysis.curves RUN_DIR              # Figure 1 curves per outer iteration (PNG)
    python -m eval.analysis.diagnostics RUN_DIR [...]   # Table 4 layout
    python -m eval.analysis.compute RUN_DIR             # wall and device hours per block and run
    python -m eval.analysis.all RUN_DIR                 # all of the above

All of them read the run directory through ``eval.analysis.rundir.load_run`` only, so a change of the
run-directory schema is fixed in that one module. Each writes ``<RUN_DIR>/analysis/<name>.{json,md}``.
"""
