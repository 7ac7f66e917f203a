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
