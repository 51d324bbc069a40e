"""A stand-in for NVIDIA apex (tests only): enough of ``apex.amp`` to drive the parity
matrix's apex column on a machine without apex, plus the ``apex.optimizers`` and
``apex.parallel`` pieces the apex projects of tests/migrate_projects use. Not apex: it
implements only the documented LossScaler rule and the scale_loss/step-skipping protocol."""
