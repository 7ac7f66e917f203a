"""Evaluation harness for the paper's benchmarks (Tables 1 and 2) and its analyses (§4.5, Appendix G.2); its
layout is in eval/README.md. The package ``unifiedplayers`` never imports this directory."""
