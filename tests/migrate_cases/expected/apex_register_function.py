import roundpipe
import torch

roundpipe.compat.register_float_function(torch, "sigmoid")
