"""The benchmarks and their loaders (:mod:`.benchmarks`), and the package's data files (``entropy_bank.json``)."""
