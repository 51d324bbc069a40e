import torch
import roundpipe
NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it

roundpipe.compat.register_float_function(torch, "sigmoid")
