"""Numbers reported in the paper (arXiv 2609.20089), carried over verbatim for side-by-side tables.

Only numbers printed in the paper are here; nothing is derived. The three unlabelled tick columns of Tables 1 and 2
are read from their rows as Tool / External teacher / Learned verifier.
"""
from __future__ import annotations

MATH_COLUMNS = ["AMC", "MATH", "GSM8K", "Minerva", "Olympiad", "AIME24", "AIME25"]
GENERAL_COLUMNS = ["SuperGPQA", "MMLU-Pro", "BBEH", "GPQA-D", "HumanEval"]
TICK_COLUMNS = ["Tool", "Ext. teacher", "Learned verifier"]

# backbone -> [(method, ticks, scores in MATH_COLUMNS order, AVG)]
TABLE1 = {
    "Qwen3-4B-Base": [
        ("Vanilla", (0, 0, 0), [45.4, 68.6, 88.5, 37.3, 41.2, 11.0, 6.33], 42.6),
        ("Tool-augmented", (1, 0, 0), [45.9, 72.7, 88.8, 38.1, 42.4, 12.5, 7.86], 44.0),
        ("Absolute Zero", (1, 0, 0), [50.3, 76.8, 88.8, 40.6, 42.9, 12.7, 13.0], 46.4),
        ("R-Zero", (0, 0, 0), [57.7, 80.2, 90.5, 52.4, 43.6, 12.3, 4.45], 48.7),
        ("Socratic-Zero", (0, 1, 0), [57.7, 80.3, 88.5, 47.3, 49.2, 19.4, 13.8], 50.9),
        ("Agent0", (1, 0, 0), [60.4, 79.9, 91.1, 56.7, 48.4, 17.3, 14.9], 52.7),
        ("UnifiedPlayers", (1, 0, 1), [64.5, 83.9, 95.1, 59.6, 51.3, 21.8, 18.7], 56.4),
    ],
    "MiMo-7B-Base": [
        ("Vanilla", (0, 0, 0), [58.3, 75.6, 89.9, 47.3, 46.6, 30.7, 22.3], 53.0),
        ("Tool-augmented", (1, 0, 0), [63.6, 77.9, 91.1, 51.4, 50.2, 34.4, 26.9], 56.5),
        ("Absolute Zero", (1, 0, 0), [64.2, 77.0, 91.6, 50.0, 49.1, 33.8, 26.6], 56.0),
        ("R-Zero", (0, 0, 0), [65.0, 80.5, 93.3, 57.2, 51.3, 33.0, 28.6], 58.4),
        ("Socratic-Zero", (0, 1, 0), [66.5, 79.3, 90.4, 52.5, 55.8, 39.1, 34.0], 59.7),
        ("Agent0", (1, 0, 0), [67.3, 81.4, 94.2, 57.9, 54.1, 39.5, 32.4], 61.0),
        ("UnifiedPlayers", (1, 0, 1), [71.4, 84.9, 96.2, 61.5, 58.1, 43.0, 36.8], 64.6),
    ],
}

TABLE2 = {
    "Qwen3-4B-Base": [
        ("Vanilla", (0, 0, 0), [21.1, 37.6, 7.6, 36.5, 65.7], 33.7),
        ("Tool-augmented", (1, 0, 0), [25.8, 43.6, 8.5, 37.2, 67.1], 36.4),
        ("Absolute Zero", (1, 0, 0), [26.4, 52.9, 8.7, 38.4, 68.4], 39.0),
        ("R-Zero", (0, 0, 0), [28.3, 51.4, 10.2, 39.6, 69.6], 39.8),
        ("Socratic-Zero", (0, 1, 0), [28.5, 54.2, 10.8, 40.1, 70.2], 40.8),
        ("Agent0", (1, 0, 0), [30.4, 55.1, 11.5, 41.7, 71.8], 42.1),
        ("UnifiedPlayers", (1, 0, 1), [33.3, 59.6, 15.8, 45.2, 76.7], 46.1),
    ],
    "MiMo-7B-Base": [
        ("Vanilla", (0, 0, 0), [24.9, 42.3, 8.5, 26.1, 52.3], 30.8),
        ("Tool-augmented", (1, 0, 0), [26.4, 44.2, 9.4, 27.4, 54.1], 32.3),
        ("Absolute Zero", (1, 0, 0), [27.6, 48.6, 10.0, 29.2, 55.8], 34.2),
        ("R-Zero", (0, 0, 0), [28.8, 48.4, 10.7, 31.0, 57.0], 35.2),
        ("Socratic-Zero", (0, 1, 0), [29.2, 49.1, 11.1, 31.7, 57.6], 35.7),
        ("Agent0", (1, 0, 0), [30.5, 51.3, 12.2, 33.5, 59.2], 37.3),
        ("UnifiedPlayers", (1, 0, 1), [33.4, 57.0, 14.9, 37.3, 63.5], 41.2),
    ],
}

# Table 4 (Qwen3-4B-Base, Execution player): configuration ->
# (grad-norm median, grad-norm CV, KL, clip fraction, entropy ratio, negative-step rate, max drop in points)
TABLE4 = {
    "Execution only": (0.86, 0.37, 0.018, 0.16, 0.91, 0.24, 1.1),
    "Planning + Execution": (0.79, 0.35, 0.016, 0.13, 0.91, 0.20, 0.9),
    "Execution + Evaluation": (0.77, 0.32, 0.016, 0.15, 0.90, 0.17, 0.8),
    "Full UnifiedPlayers": (0.73, 0.31, 0.014, 0.09, 0.87, 0.19, 0.6),
}

# Text of §4.5 and the abstract.
VERIFIER_DISCRIMINATION_ACCURACY = 0.842  # "84.2% accuracy in distinguishing original from perturbed"
GPT4O_DISCRIMINATION_ACCURACY = 0.908  # "approaching GPT-4o's 90.8%"
REWARD_VARIANCE_RATIO = 2.03  # "2.03x the reward variance of offline Agent0 self-consistency"
# Figure 1(a) endpoints quoted in §4.5 (iteration 1 -> iteration 3, Qwen3-4B-Base).
FIGURE1_ENDPOINTS = {
    "execution_accuracy": (0.525, 0.633),
    "adversarial_rejection": (0.31, 0.79),
    "mean_U": (0.18, 0.39),
}
# Table 3 GPU-hours per seed (Qwen3-4B-Base, eight A100 80GB).
TABLE3_GPU_HOURS = {"Execution only": 312, "Planning + Execution": 360, "Execution + Evaluation": 384,
                    "Full UnifiedPlayers": 432}
