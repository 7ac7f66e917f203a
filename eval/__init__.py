"""Evaluation harness for the paper's twelve benchmarks (Tables 1 and 2) and its analyses (§4.5, Appendix G.2).

Layout:
- ``benchmarks``: the registry (what each benchmark is) and the loaders (where its file is).
- ``extract``: answer extraction from model text (``\\boxed{}``, option letters, code blocks).
- ``grading``: math-verify for math, exact letter for multiple choice, normalised strings for BBEH.
- ``humaneval``: unit-test execution of HumanEval programs in the project's sandbox.
- ``metrics``: greedy pass@1 and mean@k.
- ``prompts``: the prompt of each answer type, for the ``vanilla`` and ``tool`` modes.
- ``harness``: generation + grading for one benchmark, per-problem JSONL.
- ``tables``: the markdown and LaTeX scores tables laid out like the paper's Tables 1 and 2.
- ``run``: the Hydra entry point (``python -m eval.run``), used by ``make eval`` and ``make eval-smoke``.
- ``prepare_data``: conversion of the public hub datasets into the local files the loaders read.
- ``analysis/``: analyses of a training run directory (verifier discrimination, reward variance,
  training curves, optimisation diagnostics, compute accounting).

The package ``unifiedplayers`` never imports this directory.
"""
