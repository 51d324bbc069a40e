"""A stand-in for NVIDIA apex (tests only): enough of ``apex.amp`` to drive the parity
matrix's apex column on a machine without apex. Not apex: it implements only the
documented LossScaler rule and the scale_loss/step-skipping protocol."""
