"""What a run reports: the interaction records (:mod:`.records`), metrics (:mod:`.logging`), the end-of-run
summary (:mod:`.summary`), the Execution player's fixed pool (:mod:`.execution_pool`) and the entropy bank
(:mod:`.entropy_bank`, Appendix D.2)."""
