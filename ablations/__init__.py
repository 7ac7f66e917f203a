"""Sweeps that reproduce the paper's ablation tables (3, 5, 15, 16, 17) and Table 1: :mod:`.sweeps` launches them,
:mod:`.evaluate_runs` evaluates their run directories with ``eval/``, :mod:`.aggregate` writes the tables beside
:mod:`.paper_numbers`. The package ``unifiedplayers`` never imports this directory."""
