"""A stand-in for NVIDIA apex (tests only): ``apex.amp``'s documented rules on a machine
without apex, to drive the parity matrix's apex column and the reference runs of
tests/test_compat_apex_rules.py, plus the ``apex.optimizers`` and ``apex.parallel`` pieces the
apex projects of tests/migrate_projects use. Not apex: the opt-level table, LossScaler rule,
scale_loss block (short cut, per-block unscale with the stash tables) and step patching, as
shared/reference/apex_amp_behaviour.md documents them."""
