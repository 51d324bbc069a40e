"""RoundPipe: upstream RoundPipe's training API for a model on one device (CPU or one GPU).

The wrapped model keeps its own dtype; the optimizer works on separate copies in
``optim_dtype`` and runs on the optimizer thread (:mod:`roundpipe.optim_stream`), so the
next forward/backward overlaps the optimizer step. See ``docs/runtime.md``.

Threads: every public method runs on the main thread (any thread but the optimizer thread).
Step functions run on the optimizer thread with :class:`OptimizerCtx` active.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Protocol, Tuple, Union

import torch
from torch import nn

from . import optim_stream
from .load_hook import WeightsLoadedHook
from .microbatch import merge_outputs, split_inputs, split_label, to_device
from .optimizer_adoption import adopt_optimizer
from .optimizer_copies import HandedGrads, OptimizerCopies
from .optimizer_ctx import OptimizerCtx, optimizer_ctx_active
from .run_config import RoundPipeRunConfig, resolve

__all__ = ["RoundPipe", "wrap_model_to_roundpipe"]

_PIN_MODES = ("alloc", "register", "off")
LossValue = Union[torch.Tensor, List[torch.Tensor]]


def _default_loss_fn(outputs: Any, labels: Any) -> Any:
    """Upstream's default ``loss_fn``: the model's outputs are the loss."""
    return outputs


def _caller_location() -> str:
    """``file:line`` of the code that called the function calling this one."""
    frame = sys._getframe(2)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _loss_tensors(loss: Any, microbatch: int) -> List[torch.Tensor]:
    """Validate what ``loss_fn`` returned; give the tensors to back-propagate."""
    tensors = list(loss) if isinstance(loss, (list, tuple)) else [loss]
    if not tensors:
        raise TypeError(f"loss_fn returned an empty sequence for microbatch {microbatch}")
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"loss_fn must return a scalar tensor (or a sequence of them), got "
                f"{type(tensor).__name__} for microbatch {microbatch}"
            )
        if not (tensor.is_floating_point() or tensor.is_complex()):
            raise TypeError(
                f"loss_fn returned a {tensor.dtype} tensor for microbatch {microbatch}; "
                "the loss must be floating point to be differentiated"
            )
        if tensor.numel() != 1:
            raise ValueError(
                f"loss_fn must return a scalar loss, got shape {tuple(tensor.shape)} for "
                f"microbatch {microbatch} (reduce it, e.g. with .mean() or .sum())"
            )
        if not tensor.requires_grad:
            raise RuntimeError(
                f"the loss of microbatch {microbatch} does not require grad: it is not "
                "connected to the model's parameters (was it detached?)"
            )
    return tensors


def _sum_detached(total: Optional[List[torch.Tensor]], tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """Add this microbatch's losses (detached, on CPU) to the running sums. The first
    microbatch's losses start the sums as copies (never the loss tensors' own memory),
    so one microbatch returns exactly its loss, a negative zero included."""
    if total is None:
        return [t.detach().to("cpu", copy=True) for t in tensors]
    return [s + t.detach().to("cpu") for s, t in zip(total, tensors)]


class RoundPipe(nn.Module):
    """Wrap ``model`` for RoundPipe-style training on one device.

    Args:
        model: the module to train; it stays on its device and in its dtype.
        optim_dtype: dtype of the optimizer copies (e.g. ``torch.float32`` for fp32 master
            weights of an fp16/bf16 model); None keeps each parameter's dtype (a separate
            copy is still made, so the optimizer never races the forward pass).
        name: a label for messages; defaults to the caller's ``file:line``.
        model_run_config: model-level :class:`RoundPipeRunConfig` (deep-copied).
        pin_model: ``"alloc"``, ``"register"`` or ``"off"``; accepted for upstream
            compatibility (one device has no host/device weight traffic to pin).

    Reading an attribute the wrapper does not have reads the wrapped module's (or the module
    given to :meth:`set_original_model`); setting or deleting one after construction acts
    on the wrapped module. ``model.model`` is the wrapped module.
    """

    def __init__(
        self,
        model: nn.Module,
        optim_dtype: Optional[torch.dtype] = None,
        name: Optional[str] = None,
        model_run_config: RoundPipeRunConfig = RoundPipeRunConfig(),
        pin_model: str = "alloc",
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"RoundPipe wraps an nn.Module, got {type(model).__name__}")
        if pin_model not in _PIN_MODES:
            raise ValueError(f"pin_model must be one of {_PIN_MODES}, got {pin_model!r}")
        if optim_dtype is not None and not (isinstance(optim_dtype, torch.dtype) and optim_dtype.is_floating_point):
            raise TypeError(f"optim_dtype must be a floating torch.dtype, got {optim_dtype!r}")
        super().__init__()
        self.model = model
        self.name = name if name is not None else _caller_location()
        self.optim_dtype = optim_dtype
        self.model_run_config = copy.deepcopy(model_run_config)
        self.pin_model = pin_model
        self._original_model: Optional[nn.Module] = None
        self._copies = OptimizerCopies(model, optim_dtype)
        self._last_step: Optional[optim_stream.Job] = None
        self._steps_queued = 0
        self._step_in_flight: Optional[_StepCall] = None  # the last asynchronous step
        model.register_load_state_dict_post_hook(WeightsLoadedHook(self._weights_loaded))
        self._roundpipe_ready = True

    # ------------------------------------------------------------- attribute delegation
    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules", {})
            target = self.__dict__.get("_original_model") or modules.get("model")
            if target is None:
                raise
            return getattr(target, name)

    def _owns(self, name: str) -> bool:
        return (
            not self.__dict__.get("_roundpipe_ready", False)
            or name in self.__dict__
            or name in self.__dict__.get("_modules", {})
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if self._owns(name):
            super().__setattr__(name, value)
        else:
            setattr(self._original_model or self.model, name, value)

    def __delattr__(self, name: str) -> None:
        if self._owns(name):
            super().__delattr__(name)
        else:
            delattr(self._original_model or self.model, name)

    def set_original_model(self, original_model: nn.Module) -> None:
        """Route attribute reads/writes the wrapper does not own to ``original_model``."""
        self.__dict__["_original_model"] = original_model

    # ------------------------------------------------------------------------- forward
    def _config(self, call: RoundPipeRunConfig, field: str) -> Any:
        return resolve(call, self.model_run_config, field)

    def forward(
        self, *args: Any, roundpipe_run_config: RoundPipeRunConfig = RoundPipeRunConfig(), **kwargs: Any
    ) -> Any:
        """Run the model on the inputs, microbatched as the run config says.

        Under ``torch.no_grad()`` (or ``requires_grad=False``) it is inference; otherwise the
        outputs are part of the autograd graph and ``backward()`` accumulates gradients that
        the next :meth:`step` hands to the optimizer.
        """
        requires_grad = self._config(roundpipe_run_config, "requires_grad")
        if requires_grad and not torch.is_grad_enabled():
            raise RuntimeError(
                "RoundPipe.forward: the run config asks for requires_grad=True but grad "
                "mode is disabled (torch.no_grad() / inference_mode())"
            )
        arg_chunks, kwarg_chunks, _ = split_inputs(
            args,
            kwargs,
            self._config(roundpipe_run_config, "num_microbatch"),
            self._config(roundpipe_run_config, "split_input"),
        )
        with torch.set_grad_enabled(bool(requires_grad)):
            outputs = [self._call_model(a, k) for a, k in zip(arg_chunks, kwarg_chunks)]
        merged = merge_outputs(outputs, self._config(roundpipe_run_config, "merge_output"))
        return to_device(merged, self._config(roundpipe_run_config, "output_device"))

    def forward_backward(
        self,
        input_args: tuple = (),
        input_kwargs: Dict[str, Any] = {},
        label: Any = None,
        loss_fn: Callable[[Any, Any], Any] = _default_loss_fn,
        return_outputs: bool = False,
        run_config: RoundPipeRunConfig = RoundPipeRunConfig(),
    ) -> Union[LossValue, Tuple[LossValue, Any]]:
        """Forward, ``loss_fn`` and backward for every microbatch; return the summed loss.

        For each microbatch, on the calling thread (so an enclosing ``torch.autocast``
        applies to the forward and the loss): ``outputs = model(*args, **kwargs)``,
        ``loss = loss_fn(outputs, label)``, then backward of ``loss`` (a scalar tensor, or a
        sequence of scalars back-propagated together) with autocast switched off, as in a
        plain torch loop. Gradients accumulate in the model's dtype until :meth:`step`.

        Returns the sum over microbatches of the ``loss_fn`` values, detached, on CPU (a
        list of sums for a sequence loss), and with ``return_outputs=True`` the tuple
        ``(loss, merged_outputs)`` with the outputs detached.

        Raises ``RuntimeError`` when grad mode is off or the loss is not connected to the
        model, ``TypeError``/``ValueError`` for a loss that is not a floating scalar tensor,
        ``ValueError`` for a label whose batch size differs from the inputs'. Gradients of
        microbatches that finished before an error stay accumulated.
        """
        if not torch.is_grad_enabled():
            raise RuntimeError(
                "RoundPipe.forward_backward needs grad mode, but it was called under torch.no_grad() / inference_mode()"
            )
        if not self._config(run_config, "requires_grad"):
            raise RuntimeError("RoundPipe.forward_backward needs requires_grad=True in the run config")
        arg_chunks, kwarg_chunks, batch = split_inputs(
            input_args,
            input_kwargs,
            self._config(run_config, "num_microbatch"),
            self._config(run_config, "split_input"),
        )
        labels = split_label(label, len(arg_chunks), batch, self._config(run_config, "split_label"))
        total: Optional[List[torch.Tensor]] = None
        outputs = []
        sequence_loss = False
        for index, (args, kwargs, mb_label) in enumerate(zip(arg_chunks, kwarg_chunks, labels)):
            output = self._call_model(args, kwargs)
            loss = self._call_loss(loss_fn, output, mb_label)
            sequence_loss = isinstance(loss, (list, tuple))
            tensors = _loss_tensors(loss, index)
            # The first backward stores its gradients instead of adding them into zeros.
            stores = self._copies.backward_stores_gradients() if index == 0 else _NOTHING
            with _autocast_off(), stores:  # as torch recommends: backward runs outside autocast
                torch.autograd.backward(tensors)
            total = _sum_detached(total, tensors)
            if return_outputs:
                outputs.append(output)
            del output, loss
        assert total is not None
        summed: LossValue = total if sequence_loss else total[0]
        if not return_outputs:
            return summed
        merged = merge_outputs(
            [torch.utils._pytree.tree_map(_detach, o) for o in outputs],
            self._config(run_config, "merge_output"),
        )
        return summed, to_device(merged, self._config(run_config, "output_device"))

    def _call_model(self, args: tuple, kwargs: Dict[str, Any]) -> Any:
        """One microbatch through the wrapped module (subclasses add casting around it)."""
        return self.model(*args, **kwargs)

    def _call_loss(self, loss_fn: Callable[[Any, Any], Any], outputs: Any, label: Any) -> Any:
        """``loss_fn`` for one microbatch (subclasses add autocast around it)."""
        return loss_fn(outputs, label)

    # ------------------------------------------------------------------- optimizer side
    def _wait_for_optimizer(self, reason: str) -> None:
        """Wait for the newest step function. Once it is known to have failed (whoever got
        its error), the gradients handed to it are dropped, so they never join a later step."""
        if optim_stream.on_optim_stream():
            raise RuntimeError(f"{reason} cannot run on the optimizer thread (inside a step function)")
        step = self._last_step
        if step is None:
            return
        try:
            optim_stream.wait(step, reason)
        finally:
            if step.failed:
                self._copies.discard_grads()
                self._last_step = None

    def _await_step(self, step: Optional["_Failable"], run: Callable[[], Any], then: str) -> Optional[Exception]:
        """Run ``run`` (a wait for ``step``, or the call that runs it). When it raises because
        ``step``'s function failed, say so on the exception (with ``then``: what the runtime
        did about it) and return it, for the caller to raise once it has done that. Any other
        error (an interrupt, a refused wait, a step cancelled before it ran) propagates."""
        try:
            run()
        except Exception as failure:
            if step is None or not step.failed:
                raise
            _note_failed_step(failure, self._steps_queued, then)
            return failure
        return None

    def _failure_of_previous_step(self) -> Optional[Exception]:
        """Wait for the previous step; return its exception (to raise later) if it failed.
        Other errors (an interrupt, a refused wait) propagate at once."""
        return self._await_step(
            self._last_step,
            lambda: self._wait_for_optimizer("RoundPipe.step(): the previous step function"),
            "this call queued its own step anyway",
        )

    def step(self, step_fn: Callable[..., Any], is_async: bool = True, *args: Any, **kwargs: Any) -> None:
        """Hand the accumulated gradients to the optimizer copies and run ``step_fn``.

        1. Wait for the previous step function.
        2. ``is_async``: copy the optimizer's current values (the previous step's result)
           into the model, so the next forward uses weights one step old (staleness 1).
        3. Move the model's gradients onto the copies' ``.grad`` (cast to ``optim_dtype``).
        4. Queue ``step_fn(*args, **kwargs)`` on the optimizer thread, with
           :class:`OptimizerCtx` active there.
        5. Not ``is_async``: wait for it and copy the new weights into the model. (A step
           that is waited for at once runs on the calling thread when no optimizer work is
           queued, as :func:`roundpipe.optim_stream.call` describes; ``step_fn`` sees the
           same job context either way.)

        Failed steps (docs/runtime.md, "When a step function fails"): if the previous step
        function raised, this call still does 2-5 and then raises that exception (a note
        names the failed step), so ``try: model.step(fn) except ...: pass`` loses no
        iteration. If this call's own synchronous step raises, the model still receives the
        optimizer's current weights before the exception propagates. Either way the failed
        step's gradients are dropped; what its step function did before raising stays.

        Raises ``TypeError`` for a non-callable ``step_fn`` or a non-bool ``is_async`` (the
        classic slip ``model.step(fn, optimizer)``: pass step arguments after ``is_async``
        or by keyword), ``RuntimeError`` when the optimizer copies were never created.
        Main thread.
        """
        if not callable(step_fn):
            raise TypeError(f"step_fn must be callable, got {type(step_fn).__name__}")
        if not isinstance(is_async, bool):
            raise TypeError(
                f"is_async must be a bool, got {type(is_async).__name__}: step function "
                "arguments go after it (model.step(fn, True, a, b)) or by keyword"
            )
        previous_failure = self._failure_of_previous_step()
        if not self._copies.created:
            raise RuntimeError(
                "RoundPipe.step(): the optimizer copies were never created. Build the "
                "optimizer on model.optim_parameters() (or on model.parameters() inside "
                "`with OptimizerCtx():`), not on the wrapped module's parameters."
            )
        if is_async:
            self._copies.copy_to_model()
        handed = self._copies.hand_over_grads()
        self._steps_queued += 1
        step_call = _StepCall(step_fn, args, kwargs, self._steps_queued, self._copies, handed)
        if is_async:
            self._last_step = optim_stream.launch(step_call)
            # The previous step has finished (waited for above): the gradient buffers it
            # released can serve the next backward while this step uses the ones just handed.
            finished, self._step_in_flight = self._step_in_flight, step_call
        else:
            # Waited for at once, so it runs on this thread when the optimizer thread is
            # idle: no hand-off, and the gradients it frees go back to this thread's memory.
            # Its own buffers come back; those of an asynchronous step before it are freed.
            self._last_step = None
            self._step_in_flight = None
            finished = step_call
            self._run_synchronous_step(step_call, previous_failure)
        if finished is not None:
            self._copies.hand_back_grads(finished.released)
        if previous_failure is not None:
            raise previous_failure

    def _run_synchronous_step(self, step_call: "_StepCall", earlier: Optional[Exception]) -> None:
        """Run ``step_call`` and wait for it, then copy the optimizer's weights into the model,
        also when the step function raised (its gradients are then dropped)."""
        try:
            failure = self._await_step(
                step_call,
                lambda: optim_stream.call(step_call, reason="RoundPipe.step(is_async=False)"),
                _WEIGHTS_TAKEN,
            )
            if failure is not None:
                if earlier is not None and failure.__context__ is None:
                    failure.__context__ = earlier  # the previous step's failure, raised first
                raise failure
        except Exception:
            # It raised, or never ran (cancelled behind other optimizer work that failed):
            # as for an asynchronous step (Job.failed), its gradients are dropped either way.
            # An interrupt is not an Exception and keeps them.
            self._copies.discard_grads()
            self._copies.copy_to_model()
            raise
        self._copies.copy_to_model()

    def _wait_and_take_weights(self, reason: str) -> None:
        """Wait for the optimizer, then copy its current weights into the model, also when
        the wait raises a step function's error (not after an interrupt: the optimizer may
        still be writing them)."""
        failure = self._await_step(self._last_step, lambda: self._wait_for_optimizer(reason), _WEIGHTS_TAKEN)
        # The last asynchronous step has finished: the buffers it released go back to the
        # parameters that have no gradient now (the rest are freed), not to a later step.
        finished, self._step_in_flight = self._step_in_flight, None
        if finished is not None:
            self._copies.hand_back_grads(finished.released)
        if self._copies.created:
            self._copies.copy_to_model()
        if failure is not None:
            raise failure

    def synchronize(self) -> None:
        """Wait for the optimizer and copy its newest weights into the model.

        Gradients accumulated since the last :meth:`step` stay in ``param.grad`` and are
        still applied by the next step (upstream RoundPipe 0.1.1 loses them). If the step
        function failed, its error is raised after the weights were copied. Main thread.
        """
        self._wait_and_take_weights("RoundPipe.synchronize()")

    def sync_optim_param(self) -> None:
        """Upstream's name for copying the optimizer's weights into the model; waits for
        the optimizer first (same as :meth:`synchronize`)."""
        self.synchronize()

    def _weights_loaded(self, module: nn.Module, incompatible_keys: Any) -> None:
        """load_state_dict post-hook: loaded weights replace the optimizer copies' values."""
        if self._copies.created:
            if not optim_stream.on_optim_stream():
                self._wait_for_optimizer("RoundPipe: loading weights")
            self._copies.refresh_from_model(keep_masters=self._keeps_masters_on_load())

    def _keeps_masters_on_load(self) -> bool:
        """Whether loaded weights leave the float32 masters of float16 weights as they are
        (:meth:`OptimizerCopies.refresh_from_model`): never here; apex's model in
        :mod:`roundpipe.compat` once its masters exist."""
        return False

    def optim_named_parameters(
        self, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[Tuple[str, nn.Parameter]]:
        """``(name, optimizer copy)`` pairs, named like ``named_parameters()`` (``model.``
        prefix). Copies are created on first use; only trainable parameters have one."""
        inner = f"{prefix}.model" if prefix else "model"
        return self._copies.named(inner, remove_duplicate)

    def optim_parameters(self) -> Iterator[nn.Parameter]:
        """The optimizer copies (build the optimizer on these)."""
        for _, copy_param in self.optim_named_parameters():
            yield copy_param

    def adopt_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Move an optimizer built on the wrapped module's own parameters (by a helper that
        groups them by name: decay/no-decay, layer-wise lr) onto the optimizer copies, by
        identity, keeping every group option; returns it (see
        :func:`roundpipe.optimizer_adoption.adopt_optimizer`). Waits for a running step
        first. Not in upstream RoundPipe. Main thread."""
        self._wait_for_optimizer("RoundPipe.adopt_optimizer()")
        return adopt_optimizer(optimizer, self.model, self._copies.copy_of)

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        """The model's parameters, or the optimizer copies inside :class:`OptimizerCtx`."""
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[Tuple[str, nn.Parameter]]:
        """As ``nn.Module.named_parameters``; inside :class:`OptimizerCtx` (with
        ``recurse=True``) the optimizer copies instead of the model's parameters."""
        if recurse and optimizer_ctx_active():
            return self.optim_named_parameters(prefix, remove_duplicate)
        return super().named_parameters(prefix, recurse, remove_duplicate)


_NOTHING = contextlib.nullcontext()  # stateless, reusable


def _autocast_off() -> ContextManager[object]:
    """Disable every autocast the caller has enabled (CPU and CUDA), for the backward pass:
    ``forward_backward`` runs inside the caller's ``with torch.autocast(...)``, but the
    original script ran ``backward()`` after that block."""
    enabled = [device_type for device_type in ("cpu", "cuda") if _autocast_enabled(device_type)]
    if not enabled:
        return _NOTHING
    stack = contextlib.ExitStack()
    for device_type in enabled:
        stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
    return stack


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 spells it per device
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def _detach(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


_WEIGHTS_TAKEN = "the model holds the optimizer's current weights"


class _Failable(Protocol):
    """A step as the runtime waits for it: an optimizer job, or the call a job runs."""

    @property
    def failed(self) -> bool: ...


def _note_failed_step(failure: BaseException, number: int, then: str) -> None:
    """Say on ``failure`` which step failed and what the runtime did about it."""
    optim_stream._add_note(
        failure,
        f"(RoundPipe: step function {number} of this model failed; the gradients handed to "
        "it were dropped, and the GradScaler counts that iteration only if scaler.step() or "
        f"unscale_() recorded its inf/NaN result before the error; {then}.)",
    )


class _StepCall:
    """The optimizer-thread side of ``RoundPipe.step``: ``step_fn`` with OptimizerCtx on,
    then the release (zeroing) of the gradient buffers it let go of, on the same thread.

    Its ``__qualname__`` names the step and the step function, so waits, notes and the
    exit message say which step they are about. ``released`` holds the zeroed buffers for
    :meth:`OptimizerCopies.hand_back_grads`, to be read once the call has finished; it
    stays empty when ``step_fn`` raised or the call never ran (those gradients are dropped).
    """

    def __init__(
        self,
        step_fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        number: int,
        copies: OptimizerCopies,
        handed: HandedGrads,
    ) -> None:
        self.step_fn, self.args, self.kwargs = step_fn, args, kwargs
        self.__qualname__ = f"RoundPipe step {number}: {getattr(step_fn, '__qualname__', None) or repr(step_fn)}"
        self.failed = False  # set when step_fn raised (not when the call never ran)
        self._copies = copies
        self._handed = handed
        self.released: HandedGrads = {}

    def __call__(self) -> Any:
        try:
            with OptimizerCtx():
                result = self.step_fn(*self.args, **self.kwargs)
        except BaseException:
            self.failed = True
            raise
        handed, self._handed = self._handed, {}
        self.released = self._copies.release_grads(handed)
        return result


def wrap_model_to_roundpipe(
    model: nn.Module,
    use_sequential_preset: Optional[bool] = None,
    lower_threshold: int = 16384,
    upper_threshold: Optional[int] = None,
    skip_modules: Any = [],
    override_config: Dict[nn.Module, RoundPipeRunConfig] = {},
    model_run_config: RoundPipeRunConfig = RoundPipeRunConfig(),
    name: Optional[str] = None,
    **roundpipe_kwargs: Any,
) -> RoundPipe:
    """Upstream's automatic wrapper. On one device there is nothing to split into stages,
    so the whole model becomes one :class:`RoundPipe`; the layer-splitting arguments
    (``use_sequential_preset``, thresholds, ``skip_modules``, ``override_config``) are
    accepted and have no effect."""
    return RoundPipe(model, name=name or _caller_location(), model_run_config=model_run_config, **roundpipe_kwargs)
