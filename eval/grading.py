"""Grading of extracted answers against references, per answer type (Appendix G.2).

The implementation lives in the package, :mod:`unifiedplayers.feedback.answers` (math-verify for math, exact
letters for options, normalised strings), so that training's fixed diagnostic pool (Appendix D.2) grades
exactly as the harness does; the package never imports ``eval/``. Programs are graded by unit tests
(``eval.humaneval``).
"""
from unifiedplayers.feedback.answers import GRADERS, grade, grade_math, grade_option, grade_string  # noqa: F401
