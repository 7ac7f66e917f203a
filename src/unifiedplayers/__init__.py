"""UnifiedPlayers: Planning, Execution and Evaluation players trained with GRPO from executable feedback."""

__version__ = "0.1.0"
