"""Sweeps that reproduce the paper's ablation tables (3, 5, 15, 16, 17) and Table 1.

- ``sweeps``: the members of each sweep (Hydra overrides), the launcher (``python -m ablations.sweeps``);
- ``evaluate_runs``: evaluates the finished run directories of a sweep with the harness in ``eval/``;
- ``aggregate``: pure pandas functions from run directories to the paper's table layouts;
- ``paper_numbers``: the paper's numbers of those tables.

The package ``unifiedplayers`` never imports this directory.
"""
