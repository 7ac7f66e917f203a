"""The benchmark registry and its loaders (§4.1, Appendix G.2; Tables 1, 2 and 11).

The implementation lives in the package, :mod:`unifiedplayers.data.benchmarks`, because the Execution player's
fixed diagnostic pool (Appendix D.2) loads the same offline subsets during training and the package never
imports ``eval/``. This module re-exports it under the harness's name.
"""
from unifiedplayers.data.benchmarks import (  # noqa: F401
    ANSWER_TYPES,
    METRICS,
    REGISTRY,
    REPO_ROOT,
    Benchmark,
    HubSource,
    MissingDataset,
    Problem,
    import_benchmark_modules,
    load_benchmark,
    missing_message,
    normalise_answer,
    prepare_command,
    read_rows,
    register_benchmark,
    resolve_path,
    to_problem,
)
