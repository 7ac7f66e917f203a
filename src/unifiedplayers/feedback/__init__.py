"""Executable feedback (§3.2, Appendix B.1, F.1): from a task's trajectories and verifiers to its rewards.

In data-flow order: :mod:`.trajectory` (the schema verifiers read) and :mod:`.observation`; :mod:`.perturbation`
(the fixed engine's adversarial variants); :mod:`.verifier` (compiling the Evaluation player's code);
:mod:`.verdict` (the verdict matrix Z(q)); :mod:`.rewards` (Eq. 2-5 from it; pure numpy) with its sympy guard in
:mod:`.sympy_guard`; :mod:`.answers` (answer extraction and grading). :mod:`.pipeline` runs them for one phase.
"""
