"""Safe, warm, parallel execution of model-written Python (Appendix D.3).

This package knows nothing of the rest of UnifiedPlayers: it runs programs and functions and returns
results. Values cross the boundary as JSON, never pickle.

    from unifiedplayers.sandbox import Sandbox, SandboxConfig
    with Sandbox(SandboxConfig(timeout_s=10, memory_mb=512)) as sb:
        sb.run("print(1+1)")                      # ExecResult
        sb.call(source, "check", payload)         # CallResult
        isolation_report(sb.config, sb.isolation)  # {"present": [layers], "missing": {layer: reason}}
"""
from unifiedplayers.sandbox.client import CallResult, ExecResult, Sandbox, SandboxError, naive_run
from unifiedplayers.sandbox.config import SandboxConfig
from unifiedplayers.sandbox.isolation import IsolationWarning, isolation_line, isolation_report

__all__ = ["Sandbox", "SandboxConfig", "ExecResult", "CallResult", "SandboxError", "naive_run", "IsolationWarning",
           "isolation_report", "isolation_line"]
