"""Numbers printed in the paper's Tables 3, 5, 15, 16 and 17 (arXiv 2609.20089, Qwen3-4B-Base), verbatim.

Tables 1, 2, 4 and the text's figures are in ``eval/paper_numbers.py``; nothing here is derived.
"""
from __future__ import annotations

# Table 3: configuration -> (math mean, math SD, general mean, general SD, GPU-hours per seed)
TABLE3_CONFIGS = {
    "Execution only": (50.6, 1.1, 40.5, 0.8, 312),
    "Planning + Execution": (52.9, 0.6, 42.3, 0.5, 360),
    "Execution + Evaluation": (53.7, 1.4, 43.3, 1.0, 384),
    "Full UnifiedPlayers": (56.4, 0.8, 46.1, 0.4, 432),
}
# Table 3 contrasts: name -> (math mean, math SD, general mean, general SD)
TABLE3_CONTRASTS = {
    "Planning marginal": (2.5, 0.4, 2.3, 0.3),
    "Evaluation marginal": (3.3, 0.8, 3.3, 0.5),
    "Interaction": (0.4, 0.3, 1.0, 0.4),
}
TABLE3_STALE = (54.9, 0.9, 44.4, 0.7, 432)  # Stale-feedback UnifiedPlayers
TABLE3_FRESH_GAIN = (1.5, 0.3, 1.7, 0.2)  # Fresh-feedback gain (matched capacity)

# Table 5: row -> (math AVG, general AVG)
TABLE5 = {
    "Full UnifiedPlayers": (56.4, 46.1),
    "w/o Perturbation Engine": (51.6, 41.3),
    "Single Verifier (M=1)": (54.3, 44.2),
    "w/o V(q) in Planning reward": (54.2, 43.9),
    "w/o Diversity Penalty": (54.2, 44.6),
    "Single Iteration": (47.4, 38.0),
}

# Table 15: perturbation preset -> (row label, math AVG, adversarial rejection rate)
TABLE15 = {
    "all": ("Full capacity (5 rules)", 56.4, 0.79),
    "local": ("Local edits only (3 rules)", 55.2, 0.68),
    "global": ("Global edits only (2 rules)", 54.9, 0.71),
    "none": ("No perturbation", 51.6, 0.21),
}

# Table 16: M -> (math AVG, general AVG, local GPU-hours)
TABLE16 = {1: (54.3, 44.2, 356), 2: (55.4, 45.3, 388), 4: (56.4, 46.1, 432), 8: (57.0, 46.4, 519)}
TABLE16_USED = 4

# Table 17: (alpha, beta, gamma) -> (row label, math AVG, general AVG); the conf/reward/ preset of each row
TABLE17 = {
    (0.4, 0.5, 0.1): ("Default (used)", 56.4, 46.1),
    (0.6, 0.3, 0.1): ("Heavier gold-pass", 55.7, 45.4),
    (0.2, 0.7, 0.1): ("Heavier adversarial", 56.1, 45.9),
    (0.4, 0.5, 0.3): ("Strong diversity", 55.3, 45.5),
    (0.4, 0.5, 0.0): ("No diversity", 54.2, 44.6),
}
