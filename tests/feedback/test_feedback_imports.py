"""The feedback core imports no torch, no model and no player code (ARCHITECTURE.md)."""
from __future__ import annotations

import subprocess
import sys


def test_feedback_core_is_light():
    code = (
        "import sys\n"
        "import unifiedplayers.feedback.trajectory, unifiedplayers.feedback.perturbation, unifiedplayers.feedback.verifier\n"
        "import unifiedplayers.feedback.verdict, unifiedplayers.feedback.rewards, unifiedplayers.diagnostics.records\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'vllm', 'deepspeed')\n"
        "       or m.startswith(('unifiedplayers.players', 'unifiedplayers.models', 'unifiedplayers.trainer',\n"
        "                        'unifiedplayers.rollout', 'unifiedplayers.trainer.grpo'))]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_feedback_core_imports_nothing_above_it_even_inside_functions():
    """No module of unifiedplayers/feedback/ imports the diagnostics, the loop, the trainer or the players, at the top
    or inside a function (an import inside a function hides a dependency, and a cycle, from the structure test): a
    progress display reaches the feedback core as a callback (FeedbackContext.progress)."""
    import ast
    from pathlib import Path

    import unifiedplayers.feedback as pkg

    above = ("unifiedplayers.diagnostics", "unifiedplayers.loop", "unifiedplayers.trainer", "unifiedplayers.players",
             "unifiedplayers.methods", "unifiedplayers.rollout", "unifiedplayers.models")
    found = []
    for path in sorted(Path(pkg.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n.startswith(above)]
    assert found == []
