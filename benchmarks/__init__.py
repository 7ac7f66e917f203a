"""The project's benchmarks and the GPU check: each a module run from the repository's root as
``python -m benchmarks.<name>`` (benchmarks/README.md lists them with their measured figures). They import the package
and each other by name; the package never imports them."""
