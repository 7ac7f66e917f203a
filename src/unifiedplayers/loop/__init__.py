"""The outer loop and what it drives (§3.3, Appendix B.4).

- :mod:`.outer`: the loop itself, Planning -> Execution -> Evaluation blocks, one slot at a time;
- :mod:`unifiedplayers.schedule` (outside the loop, which the start-up checks and the capacity plan read too): the
  slots of a run; :mod:`.phase`: one sampling phase cut into mini-batches;
- :mod:`.sampling`: tasks, trajectories and verifiers of a phase, one :class:`~.sampling.PlayedTask` per task;
- :mod:`.team`: the players' weights, trainers and engines; :mod:`.engines`: the rollout engines and sandbox;
- :mod:`.ranks`: the one rank boundary: rank 0 runs the loop, the other ranks run the calls it sends them;
- :mod:`.run_state`, :mod:`.checkpoints`: what a run saves and resumes from; :mod:`.run_files`: the files it writes.
"""
