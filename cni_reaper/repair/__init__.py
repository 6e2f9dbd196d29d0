"""The repair stage, the only one that runs plugins or changes anything on disk: the plan
carried out (apply.py), DEL replayed (replay.py) under a deadline (budget.py) and in parallel
by network (parallel.py), in a confined mount namespace for a --root (confine.py); files moved
to the quarantine (quarantine.py); orphaned reservations released (release.py) and Multus's
scratch files carried out (multus_repair.py); and what became of each entry (outcome.py)."""
