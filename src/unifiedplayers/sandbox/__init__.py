"""Safe, warm, parallel execution of model-written Python (Appendix D.3): ``Sandbox(SandboxConfig(...))``, its ``run``
and ``call`` (docs/sandbox.md). It knows nothing of the rest of UnifiedPlayers; values cross as JSON, never pickle.
"""
from unifiedplayers.sandbox.client import CallResult, ExecResult, Sandbox, SandboxError, naive_run
from unifiedplayers.sandbox.config import SandboxConfig
from unifiedplayers.sandbox.isolation import IsolationWarning, isolation_line, isolation_report

__all__ = ["Sandbox", "SandboxConfig", "ExecResult", "CallResult", "SandboxError", "naive_run", "IsolationWarning",
           "isolation_report", "isolation_line"]
