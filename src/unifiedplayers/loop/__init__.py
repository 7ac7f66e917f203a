"""The outer loop and what it drives (§3.3, Appendix B.4).

- :mod:`.outer`: the loop itself, ``for iteration: for block: for phase: for step`` in one function;
- :mod:`unifiedplayers.schedule`: the plan of a run; :mod:`.phase`: one sampling phase cut into mini-batches;
- :mod:`.sampling`: tasks, trajectories and verifiers of a phase, one :class:`~.sampling.PlayedTask` per task;
- :mod:`.team`: the players' weights, trainers and engines; :mod:`.engines`: the rollout engines and sandbox;
- :mod:`.ranks`: the one rank boundary: a team method declared ``every_rank`` runs on every rank, sent by rank 0;
- :mod:`.run_state`, :mod:`.checkpoints`: what a run saves and resumes from; :mod:`.run_files`: the files it writes.
"""
