"""``roundpipe.compat.initialize``: apex's ``amp.initialize`` onto RoundPipe.

Same signature, defaults and return shapes as apex; each model comes back as an
:class:`~roundpipe.compat.model.AmpRoundPipe` and each optimizer as the same object, now
stepping RoundPipe's optimizer copies. What each property does here:

* ``cast_model_type`` (O0 float32, O2/O3 float16): the model's weights are converted in
  place (affine batchnorm kept as it is with ``keep_batchnorm_fp32``), its state dict
  reports float16 entries as float32, floating inputs are cast to the type and outputs
  to ``cast_model_outputs`` (float32 by default). Without it, ``cast_model_outputs``
  alone casts the outputs.
* ``patch_torch_functions`` (O1): the module's forward and ``forward_backward``'s
  ``loss_fn`` run under ``torch.autocast`` for the device type of the model's parameters:
  float16 on CUDA; bfloat16 on CPU, CPU autocast's low-precision type (a deliberate
  choice: apex's O1 does no casting on CPU at all). Autocast's op lists replace apex's.
  Because apex patches torch for the whole program, the calling thread's autocast is
  also turned on for the rest of the script (:mod:`roundpipe.compat.global_casts`), and
  turned off by the next ``initialize``. The backward runs with autocast off, and the
  optimizer step runs on RoundPipe's optimizer thread, outside autocast, as apex runs it
  with casts disabled.
* ``master_weights``: the optimizer copies are float32 (``optim_dtype=torch.float32``);
  otherwise they keep the model's dtype.
* ``loss_scale``, ``min_loss_scale``, ``max_loss_scale``, ``num_losses``: one apex loss
  scaler per loss (:mod:`roundpipe.compat.loss_scaler`, :mod:`roundpipe.compat.scaler`);
  every ``forward_backward`` that scales a loss is an apex ``scale_loss`` block, unscaled
  onto the optimizer copies at its end (float32 masters under O2, in place otherwise).
* ``patch_torch_functions`` also turns on the function-casting API
  (:mod:`roundpipe.compat.functions`: ``float_function``... and the registrations made
  before this call), off otherwise.
* ``verbosity`` > 0 prints the resolved properties (on rank 0 when torch.distributed is
  initialized), as apex does.

Errors, as apex raises them (checked before anything is modified): the property checks of
:mod:`roundpipe.compat.properties`; ``TypeError`` when ``optimizers`` is not an optimizer,
a list of them or None, or ``models`` not a module or a list of them (tuples included,
as apex); ``RuntimeError`` for a DataParallel/DistributedDataParallel model, a model with
float16 parameters or buffers (initialize converts it), and an optimizer passed through
``initialize`` before. Differences from apex:

* no CUDA checks (``cudnn.enabled``, parameters not on a CUDA device, CUDA tensor types):
  the model may live on any device torch supports, CPU included;
* no deprecation warning, and no ``hard_override`` to turn errors into warnings;
* a model that is already a RoundPipe is a ``RuntimeError`` (pass the plain module);
* ``max_loss_scale <= 0`` and a ``min_loss_scale`` above ``max_loss_scale`` are a
  ``ValueError`` (apex accepts them);
* ``enabled=False`` wraps the models without any casting (apex returns them untouched,
  which a migrated ``forward_backward`` loop cannot use) and installs disabled loss
  scalers, so ``loss_scaler()`` and ``state_dict()`` work (apex's ``state_dict`` raises).
"""

from __future__ import annotations

import operator
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..runtime import RoundPipe, _caller_location
from .convert import convert_model_, save_float16_as_float32
from .functions import activate_casting
from .global_casts import cast_everywhere
from .loss_scaler import check_bounds as _check_bounds
from .model import AmpRoundPipe, ForwardPolicy, autocast_target
from .optimizers import check_not_initialized, rebind_to_copies
from .properties import AmpProperties, resolve_properties
from .scaler import build_scalers, install
from .steps import OptimizerSteps

__all__ = ["initialize"]

_PARALLEL_WRAPPERS = (
    (nn.parallel.DistributedDataParallel, "torch.nn.parallel.DistributedDataParallel"),
    (nn.DataParallel, "torch.nn.DataParallel"),
)


def initialize(
    models: Any,
    optimizers: Any = None,
    enabled: bool = True,
    opt_level: str = "O1",
    cast_model_type: Optional[torch.dtype] = None,
    patch_torch_functions: Optional[bool] = None,
    keep_batchnorm_fp32: Any = None,
    master_weights: Optional[bool] = None,
    loss_scale: Any = None,
    cast_model_outputs: Optional[torch.dtype] = None,
    num_losses: int = 1,
    verbosity: int = 1,
    min_loss_scale: Optional[float] = None,
    max_loss_scale: float = 2.0**24,
) -> Any:
    """Set up mixed-precision RoundPipe training the way ``apex.amp.initialize`` does.

    Args: apex's (see the module docstring for what each does here).

    Returns, as apex: ``models`` shaped as given (a module -> one
    :class:`~roundpipe.compat.model.AmpRoundPipe`; a list -> a list), followed, when
    ``optimizers`` is not None, by ``optimizers`` shaped as given (the same objects, their
    param groups now holding the optimizer copies of the models' parameters, their state
    moved there). ``enabled=False`` (apex: return everything unchanged) wraps the models in
    RoundPipe without any casting and installs disabled scalers, so the migrated training
    loop still runs.
    """
    num_losses = operator.index(num_losses)
    optimizer_list = _optimizer_list(optimizers)
    model_list = _model_list(models)
    properties: Optional[AmpProperties] = None
    if enabled:
        properties = resolve_properties(
            opt_level,
            cast_model_type=cast_model_type,
            patch_torch_functions=patch_torch_functions,
            keep_batchnorm_fp32=keep_batchnorm_fp32,
            master_weights=master_weights,
            loss_scale=loss_scale,
        )
        _check_models(model_list)
        for optimizer in optimizer_list:
            check_not_initialized(optimizer)
        _check_bounds(min_loss_scale, max_loss_scale)
        if verbosity > 0:
            _print_properties(properties)

    name = _caller_location()
    wrapped = [
        _wrap(model, properties, cast_model_outputs, name)
        if properties is not None
        else AmpRoundPipe(model, ForwardPolicy(None, None, None, None), name=name)
        for model in model_list
    ]
    copy_of: Dict[nn.Parameter, nn.Parameter] = {}
    if optimizer_list:
        for model in wrapped:
            copy_of.update(model.copy_map())
        for optimizer in optimizer_list:
            rebind_to_copies(optimizer, copy_of)
    masters = [id(copy) for param, copy in copy_of.items() if copy.dtype != param.dtype]
    install(
        build_scalers(
            num_losses,
            properties.loss_scale if properties is not None else 1.0,
            min_loss_scale,
            max_loss_scale,
            OptimizerSteps(optimizer_list, masters),
            master_weights=bool(properties is not None and properties.master_weights),
            enabled=properties is not None,
        )
    )

    activate_casting(properties is not None and bool(properties.patch_torch_functions))
    cast_everywhere(
        (model.amp_policy.autocast_device, model.amp_policy.autocast_dtype)
        for model in wrapped
        if model.amp_policy.autocast_device is not None and model.amp_policy.autocast_dtype is not None
    )

    models_out = wrapped if isinstance(models, list) else wrapped[0]
    if optimizers is None:
        return models_out
    return models_out, optimizers


def _optimizer_list(optimizers: Any) -> List[torch.optim.Optimizer]:
    if optimizers is None:
        return []
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    if isinstance(optimizers, list) and all(isinstance(optimizer, torch.optim.Optimizer) for optimizer in optimizers):
        return list(optimizers)
    raise TypeError("optimizers must be either a single optimizer or a list of optimizers.")


def _model_list(models: Any) -> List[nn.Module]:
    if isinstance(models, nn.Module):
        return [models]
    if isinstance(models, list) and all(isinstance(m, nn.Module) for m in models):
        return list(models)
    raise TypeError("models must be either a single model or a list of models.")


def _check_models(models: List[nn.Module]) -> None:
    for model in models:
        for wrapper, wrapper_name in _PARALLEL_WRAPPERS:
            if isinstance(model, wrapper):
                raise RuntimeError(
                    f"Incoming model is an instance of {wrapper_name}. Parallel wrappers "
                    "should only be applied to the model(s) AFTER the model(s) have been "
                    "returned from roundpipe.compat.initialize."
                )
        if isinstance(model, RoundPipe):
            raise RuntimeError(
                "Incoming model is already a RoundPipe; pass the plain module: roundpipe.compat.initialize wraps it."
            )
        named = list(model.named_parameters()) + list(model.named_buffers())
        for tensor_name, tensor in named:
            if tensor.dtype == torch.float16:
                raise RuntimeError(
                    f"Found {tensor_name} with dtype torch.float16, expected float32. When "
                    "using roundpipe.compat.initialize, you do not need to call .half() on "
                    "your model before passing it, no matter what optimization level you "
                    "choose."
                )


def _wrap(
    model: nn.Module,
    properties: AmpProperties,
    cast_model_outputs: Optional[torch.dtype],
    name: str,
) -> AmpRoundPipe:
    """Convert ``model`` as ``properties`` say and wrap it in an AmpRoundPipe."""
    input_dtype = None
    output_dtype = cast_model_outputs
    if properties.cast_model_type:
        convert_model_(model, properties.cast_model_type, bool(properties.keep_batchnorm_fp32))
        save_float16_as_float32(model)
        input_dtype = properties.cast_model_type
        if cast_model_outputs is None:
            output_dtype = torch.float32
    autocast: Tuple[Optional[str], Optional[torch.dtype]] = (None, None)
    if properties.patch_torch_functions:
        autocast = autocast_target(model)
    policy = ForwardPolicy(input_dtype, output_dtype, *autocast)
    optim_dtype = torch.float32 if properties.master_weights else None
    return AmpRoundPipe(model, policy, optim_dtype=optim_dtype, name=name)


def _print_properties(properties: AmpProperties) -> None:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed and torch.distributed.get_rank() != 0:
        return
    print(f"roundpipe.compat.initialize: properties of {properties.opt_level} after overrides:")
    for key, value in vars(properties).items():
        print(f"{key:22} : {value}")
