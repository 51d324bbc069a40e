"""roundpipe.GradScaler: the torch.amp.GradScaler API, correct across the optimizer thread.

Threads (see ``docs/gradscaler.md``):

* The **main thread** (any thread other than the optimizer thread) calls ``scale()`` and
  ``update()``; ``unscale_()`` and ``step()`` called there run as the next optimizer job and
  are waited for (:func:`roundpipe.optim_stream.call`), so they run after every optimizer job
  queued before them: inline on the calling thread when the optimizer thread is idle with
  nothing queued (a plain loop never hops threads), else queued there.
* On the **optimizer thread** (inside a job of :mod:`roundpipe.optim_stream`, e.g. a RoundPipe
  step function) ``unscale_()`` and ``step()`` run inline; ``update()`` is refused.

Iterations and the scale sequence. An *iteration* is the span between two ``update()`` calls.
Each iteration has a record holding the scale its losses were multiplied by (the same tensor
is used to unscale them: a scale value is never mutated while a step may use it) and the
inf/NaN results of the optimizer work queued during it. ``update()`` applies, in order and
exactly once each, every iteration's result that the main thread has already waited for
(:func:`roundpipe.optim_stream.waited_seq`). That single rule gives torch's sequence in a
plain loop and the one-iteration lag when steps run asynchronously, deterministically.
"""

from __future__ import annotations

import inspect
import math
import os
import threading
import warnings
import weakref
from collections import abc
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union, overload

import torch
from torch.amp.grad_scaler import OptState

from . import optim_stream
from .scaling import (
    FoundInfPerDevice,
    reciprocal_scale,
    sum_found_inf,
    unscale_grads_,
    update_scale_,
)

__all__ = ["GradScaler", "OptState"]

_NEW_SCALE_REASON = (
    "new_scale should be a float or a 1-element torch.cuda.FloatTensor or torch.FloatTensor with requires_grad=False."
)
_PICKLE_MID_ITERATION = (
    "A GradScaler instance may only be pickled at the beginning of an iteration, or at the end after scaler.update()."
)
_NO_INF_CHECKS = "No inf checks were recorded prior to update."
_SETTINGS = ("_growth_factor", "_backoff_factor", "_growth_interval")


def _fresh_optimizer_state() -> Dict[str, Any]:
    return {"stage": OptState.READY, "found_inf_per_device": {}}


class _OptimizerStates(dict):
    """``{id(optimizer): state}`` that gives an unseen optimizer a fresh READY state, as
    torch's ``defaultdict(_refresh_per_optimizer_state)`` does (and cheaper to create)."""

    __slots__ = ()

    def __missing__(self, key: int) -> Dict[str, Any]:
        state = self[key] = _fresh_optimizer_state()
        return state


class _Iteration:
    """One iteration's record: its scale, its optimizer results, its place in the job order.

    ``start_seq < job.seq <= end_seq`` for every optimizer job queued during the iteration
    (``end_seq`` is None while the iteration is current). Thread contract: the main thread
    creates and ends records; the optimizer thread writes ``states``/``settings`` of the
    record its running job belongs to; the main thread reads them only after waiting.

    ``scale`` may be the scaler's live scale tensor itself: the scaler replaces its own
    tensor by a copy before changing it while a record that could still be read shares it.

    One record is made per iteration, so only what differs from the class defaults below
    is set on the instance.
    """

    end_seq: Optional[int] = None
    scale: Optional[torch.Tensor] = None
    new_scale: Optional[torch.Tensor] = None
    loaded_found_inf: Optional[float] = None
    applied = False
    _found_infs: Optional[List[torch.Tensor]] = None

    def __init__(self, start_seq: int) -> None:
        self.start_seq = start_seq
        self.states: Dict[int, Dict[str, Any]] = _OptimizerStates()
        self.settings: List[Tuple[str, Any]] = []

    def found_infs(self) -> List[torch.Tensor]:
        """Every found_inf of the iteration. Call it only once the iteration's optimizer work
        was waited for (its states are final): the list is computed once and kept."""
        if self._found_infs is None:
            self._found_infs = [
                found_inf for state in self.states.values() for found_inf in state["found_inf_per_device"].values()
            ]
        return self._found_infs

    def has_result(self) -> bool:
        return self.loaded_found_inf is not None or bool(self.found_infs())

    def combined_found_inf(self, device: torch.device) -> Optional[torch.Tensor]:
        """The iteration's result on ``device`` (non-zero: inf/NaN), None if it has none."""
        if self.loaded_found_inf is not None:
            return torch.full((), self.loaded_found_inf, dtype=torch.float32, device=device)
        found_infs = self.found_infs()
        return sum_found_inf(found_infs, device) if found_infs else None

    def faulted(self) -> bool:
        end = self.end_seq if self.end_seq is not None else optim_stream.launched_seq()
        return optim_stream.faulted_between(self.start_seq, end)


def _is_device_like(value: Any) -> bool:
    return isinstance(value, (str, torch.device))


class GradScaler(torch.amp.GradScaler):
    """Dynamic loss scaling that works when ``step()`` runs on RoundPipe's optimizer thread.

    A subclass of ``torch.amp.GradScaler`` (so ``isinstance`` checks of optimizers and
    trainer libraries accept it) that never runs the base ``__init__`` and overrides every
    method torch defines: no state or behaviour of torch's class is used.

    The API is ``torch.amp.GradScaler``'s, plus upstream RoundPipe's ``up_to_date`` getters,
    ``update(..., is_async=...)`` and the ``min_scale``/``max_scale`` bounds.

    Args:
        init_scale: the first scale. A leading device argument as torch takes it
            (``GradScaler("cuda", 1024.0, growth_interval=100)``) is accepted, so torch code
            works unchanged.
        growth_factor: multiplier after ``growth_interval`` consecutive clean iterations
            (must be > 1 when enabled).
        backoff_factor: multiplier after an iteration with inf/NaN gradients (must be < 1).
        growth_interval: clean iterations needed for growth.
        enabled: when False, ``step`` calls ``optimizer.step`` and everything else is a no-op.
        min_scale: optional floor applied after every automatic update (apex's
            ``min_loss_scale``).
        max_scale: optional cap applied after every automatic update (apex's
            ``max_loss_scale``; with ``2.**24`` the sequence equals apex's dynamic LossScaler
            for one backward per step).
        device: keyword form of the device argument. ``"cuda"`` without CUDA disables the
            scaler with a warning, as torch does. The scale tensor itself is created on the
            device of the first tensor passed to :meth:`scale`.

    Threads: construct on the main thread. Every public method documents where it may run.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The signature shown (``__signature__`` below) is ``_configure``'s; a leading device
        # argument, as torch takes it, is peeled off first.
        device = kwargs.pop("device", None)
        if args and _is_device_like(args[0]):
            if device is not None:
                raise TypeError("GradScaler got the device both positionally and by keyword")
            device, args = args[0], args[1:]
        self._configure(*args, device=device, **kwargs)

    def _configure(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        min_scale: Optional[float] = None,
        max_scale: Optional[float] = None,
        device: Optional[Union[str, torch.device]] = None,
    ) -> None:
        # torch.amp.GradScaler types _device as the str its constructor requires; this one keeps
        # the device as given (None and torch.device too, as upstream RoundPipe's accepts), and
        # inherits none of torch's methods that read it (__init__ and update() are replaced).
        self._device = device  # type: ignore[assignment]
        self._enabled = bool(enabled)
        if self._enabled and device is not None and torch.device(device).type == "cuda":
            if not torch.cuda.is_available():
                warnings.warn(
                    "roundpipe.GradScaler is enabled for device 'cuda', but CUDA is not available.  Disabling."
                )
                self._enabled = False
        self._init_scale = init_scale
        self._init_growth_tracker = 0
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._min_scale = min_scale
        self._max_scale = max_scale
        if self._enabled:
            if growth_factor <= 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
            _check_bounds(min_scale, max_scale)
        self._start_fresh()

    __init__.__signature__ = inspect.signature(_configure)  # type: ignore[attr-defined]

    def _start_fresh(self) -> None:
        """(Re)create the thread-side state: lock, records, lazily created tensors."""
        self._lock = threading.Lock()
        _LIVE_SCALERS.add(self)
        self._scale: Optional[torch.Tensor] = None
        self._growth_tracker: Optional[torch.Tensor] = None
        self._current = _Iteration(optim_stream.launched_seq())
        # Replaced, never changed in place: optimizer jobs read it without the lock.
        self._records: List[_Iteration] = [self._current]
        self._catch_up_through: Optional[int] = None
        if self._enabled:
            optim_stream.add_launch_hook(self, type(self)._before_optimizer_launch)

    # ------------------------------------------------------------------ thread plumbing
    def _caller_iteration(self) -> _Iteration:
        """The record the calling thread works in (main: current; optimizer: its job's)."""
        job = optim_stream.current_job()
        if job is None:
            return self._current
        records = self._records
        for record in reversed(records):
            if record.start_seq < job.seq:
                return record
        return records[0]

    def _before_optimizer_launch(self) -> None:
        """Launch hook: fix the current iteration's scale before optimizer work needs it."""
        self._main_scale()

    def _main_scale(self) -> Optional[torch.Tensor]:
        """Main thread: settle a deferred update, then return the current iteration's scale."""
        scale = self._current.scale
        if scale is not None and self._catch_up_through is None:
            return scale
        if self._catch_up_through is not None:
            through, self._catch_up_through = self._catch_up_through, None
            self._wait_through(through, "GradScaler.update(is_async=False)")
            self._apply_ready_records()
        return self._fix_scale(self._current, on_main_thread=True)

    def _fix_scale(self, record: _Iteration, on_main_thread: Optional[bool] = None) -> Optional[torch.Tensor]:
        """Give ``record`` its scale (the chain's current value) if it has none.

        The main thread shares the chain's tensor (:meth:`_unshare_scale` copies it before
        a change that a record could still see); inside an optimizer job, which the main
        thread's check could miss, it takes a copy. Should both fix the same record at
        once, either tensor holds the same value, so the one left in place is as good.
        ``on_main_thread``: whether the caller runs outside any optimizer job, if it knows
        (None: asked of the optimizer stream).
        """
        if record.scale is None and self._scale is not None:
            if on_main_thread is None:
                on_main_thread = not optim_stream.on_optim_stream()
            if on_main_thread:
                record.scale = self._scale
            else:
                with self._lock:
                    if record.scale is None:
                        record.scale = self._scale.clone()
        return record.scale

    def _unshare_scale(self) -> torch.Tensor:
        """Main thread, before changing the chain's scale in place: if a record whose work
        is not all waited for (or the current one) holds the same tensor, the chain moves
        to a copy, so that record keeps unscaling by the value its loss was multiplied by."""
        scale = self._scale
        assert scale is not None
        waited = optim_stream.waited_seq()
        for record in self._records:
            if record.scale is scale and (record.end_seq is None or record.end_seq > waited):
                self._scale = scale = scale.clone()
                break
        return scale

    @staticmethod
    def _wait_through(seq: int, reason: str) -> None:
        if seq > optim_stream.waited_seq():
            optim_stream.wait(seq, reason)

    def _scale_for(self, record: _Iteration) -> Optional[torch.Tensor]:
        """The scale of ``record``; the main thread settles its current iteration first."""
        if record is self._current and not optim_stream.on_optim_stream():
            return self._main_scale()
        return record.scale

    def _require_scale(self, record: _Iteration, funcname: str, in_job: bool = False) -> torch.Tensor:
        """The scale of ``record`` for ``funcname``; ``AssertionError`` (torch's text) when the
        scaler or that iteration has none. ``in_job``: the caller runs inside an optimizer
        job for ``record``, whose scale the launch hook fixed before the job was queued or
        run inline, so it is read off the record without asking which thread this is (what
        :meth:`_scale_for` returns there)."""
        self._check_scale_growth_tracker(funcname)
        scale = record.scale if in_job else self._scale_for(record)
        if scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  {_FIX_HINT}")
        return scale

    @staticmethod
    def _run_on_optimizer_thread(reason: str, fn: Any, *args: Any) -> Any:
        """Inside an optimizer job: ``fn(*args)``. Elsewhere: run it as the next optimizer
        job (inline when the stream is idle), wait, and return None."""
        if optim_stream.on_optim_stream():
            return fn(*args)
        optim_stream.call(fn, *args, reason=reason)
        return None

    # ------------------------------------------------------------------------ scale()
    @overload
    def scale(self, outputs: torch.Tensor) -> torch.Tensor: ...

    @overload
    def scale(self, outputs: List[torch.Tensor]) -> List[torch.Tensor]: ...

    @overload
    def scale(self, outputs: Tuple[torch.Tensor, ...]) -> Tuple[torch.Tensor, ...]: ...

    @overload
    def scale(self, outputs: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]: ...

    def scale(
        self, outputs: Union[torch.Tensor, Iterable[torch.Tensor]]
    ) -> Union[torch.Tensor, Iterable[torch.Tensor]]:
        """Multiply a tensor, or (nested) lists/tuples/iterables of tensors, by the scale.

        Any thread. Off the optimizer thread the scale is the current iteration's (the one
        ``unscale_``/``step`` of this iteration will divide by); on the optimizer thread it is
        the scale of the running job's iteration. The scale tensor is created lazily on the
        device of the first tensor scaled. Out of place and differentiable; dtype follows
        torch's promotion with a 0-dim float32 tensor. No host sync.

        Returns ``outputs`` unchanged when disabled. Lists and tuples keep their type; other
        iterables come back as lazy ``map`` objects. Anything else raises
        ``ValueError("outputs must be a Tensor or an iterable of Tensors")``.
        """
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            device = outputs.device
            scale = self._scale_for_tensor(device)
            if scale.device != device:
                scale = scale.to(device, non_blocking=True)
            return outputs * scale

        per_device: Dict[torch.device, torch.Tensor] = {}

        def scale_one(value: torch.Tensor) -> torch.Tensor:
            copy = per_device.get(value.device)
            if copy is None:
                scale = self._scale_for_tensor(value.device)
                copy = scale.to(value.device, non_blocking=True)
                per_device[value.device] = copy
            return value * copy

        def apply(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return scale_one(value)
            if isinstance(value, abc.Iterable):
                mapped = map(apply, value)
                if isinstance(value, (list, tuple)):
                    return type(value)(mapped)
                return mapped
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")

        return apply(outputs)

    def _scale_for_tensor(self, device: torch.device) -> torch.Tensor:
        """The scale ``scale()`` multiplies by on the calling thread (created on first use)."""
        if self._scale is not None and optim_stream.current_job() is None:
            scale = self._main_scale()
            if scale is not None:
                return scale
        if self._scale is None:
            with self._lock:
                if self._scale is None:
                    self._lazy_init_scale_growth_tracker(device)
        record = self._caller_iteration()
        scale = self._scale_for(record)
        if scale is None:  # first scale() of this iteration made on the optimizer thread
            scale = self._fix_scale(record)
        assert scale is not None
        return scale

    def _lazy_init_scale_growth_tracker(self, dev: torch.device) -> None:
        if self._growth_tracker is not None:
            raise AssertionError("_growth_tracker initialized before _scale")
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=dev)
        self._growth_tracker = torch.full((), self._init_growth_tracker, dtype=torch.int32, device=dev)

    # ---------------------------------------------------------------------- unscale_()
    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by this iteration's scale, in place.

        Optional: call it between backward and ``step`` to clip or inspect unscaled grads.
        Inside an optimizer job it runs there; from another thread it runs as the next
        optimizer job (after all queued work; on the calling thread when nothing is queued)
        and is waited for. Grads are grouped by
        (device, dtype), one fused kernel per group, no host sync. fp16 grads raise
        ``ValueError`` before any grad changes; bf16/fp32/fp64 and sparse grads are accepted.

        Raises ``RuntimeError`` when called twice for an optimizer in one iteration or after
        ``step``. No-op when disabled.
        """
        if not self._enabled:
            return
        self._run_on_optimizer_thread("GradScaler.unscale_()", self._unscale_inline, optimizer)

    def _unscale_inline(self, optimizer: torch.optim.Optimizer) -> None:
        record = self._caller_iteration()
        scale = self._require_scale(record, "unscale_", in_job=True)
        state = record.states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        state["found_inf_per_device"] = unscale_grads_(
            optimizer.param_groups, reciprocal_scale(scale), allow_fp16=False
        )
        state["stage"] = OptState.UNSCALED

    # -------------------------------------------------------------------------- step()
    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Optional[Any]:
        """Unscale (if not done yet), then ``optimizer.step(*args, **kwargs)`` unless inf/NaN.

        Inside an optimizer job it runs there and returns the optimizer's return value (None
        for a skipped step); from another thread it runs as the next optimizer job (after all
        queued work; on the calling thread when nothing is queued), is waited for, and
        returns None. One host read of found_inf per device, on the thread that
        runs the step. Optimizers with ``_step_supports_amp_scaling`` (torch's fused
        optimizers) get torch's protocol: ``grad_scale``/``found_inf`` attributes and no host
        sync. Disabled: returns ``optimizer.step(*args, **kwargs)`` directly.

        Raises ``RuntimeError`` for ``closure=`` or a second ``step`` in one iteration, and
        ``AssertionError`` when the optimizer has no gradients to check.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        return self._run_on_optimizer_thread("GradScaler.step()", self._step_inline, optimizer, args, kwargs)

    def _step_inline(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> Optional[Any]:
        record = self._caller_iteration()
        scale = self._require_scale(record, "step", in_job=True)
        state = record.states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            retval = self._fused_step(optimizer, record, scale, state, args, kwargs)
        else:
            if state["stage"] is OptState.READY:
                self._unscale_inline(optimizer)
            found_inf_per_device = state["found_inf_per_device"]
            if not found_inf_per_device:
                raise AssertionError("No inf checks were recorded for this optimizer.")
            retval = self._maybe_opt_step(optimizer, state, *args, **kwargs)
        state["stage"] = OptState.STEPPED
        return retval

    def _maybe_opt_step(
        self, optimizer: torch.optim.Optimizer, optimizer_state: Dict[str, Any], *args: Any, **kwargs: Any
    ) -> Optional[Any]:
        """torch's private helper: ``optimizer.step`` unless ``optimizer_state`` recorded inf/NaN
        (one host read per device)."""
        if sum(found_inf.item() for found_inf in optimizer_state["found_inf_per_device"].values()):
            return None
        return optimizer.step(*args, **kwargs)

    def _fused_step(
        self,
        optimizer: torch.optim.Optimizer,
        record: _Iteration,
        scale: torch.Tensor,
        state: Dict[str, Any],
        args: tuple,
        kwargs: dict,
    ) -> Any:
        """torch's protocol for optimizers that unscale and skip inside their own kernels."""
        if "grad_scaler" in inspect.signature(optimizer.step).parameters:
            warnings.warn(
                "GradScaler is going to stop passing itself as a keyword argument to the "
                "passed optimizer. In the near future GradScaler registers `grad_scale: "
                "Tensor` and `found_inf: Tensor` to the passed optimizer and let the "
                "optimizer use them directly.",
                FutureWarning,
                stacklevel=3,
            )
            # The signature check above is the narrowing: this optimizer's step takes grad_scaler.
            step: Callable[..., Any] = optimizer.step
            return step(*args, grad_scaler=self, **kwargs)
        if state["stage"] is OptState.READY:
            self._check_inf_in(record, optimizer)
        found_inf: Any = sum(
            found_inf.to(scale.device, non_blocking=True) for found_inf in state["found_inf_per_device"].values()
        )
        if state["stage"] is OptState.UNSCALED:
            optimizer.grad_scale = getattr(optimizer, "grad_scale", None)  # type: ignore[attr-defined]
        else:
            optimizer.grad_scale = scale * getattr(optimizer, "grad_scale", 1)  # type: ignore[attr-defined]
        optimizer.found_inf = found_inf  # type: ignore[attr-defined]
        retval = optimizer.step(*args, **kwargs)
        del optimizer.grad_scale  # type: ignore[attr-defined]
        del optimizer.found_inf  # type: ignore[attr-defined]
        return retval

    # ------------------------------------------------------------------------ update()
    def update(
        self,
        new_scale: Optional[Union[float, torch.Tensor]] = None,
        is_async: bool = True,
    ) -> None:
        """End the iteration and update the scale. Main thread only (any non-optimizer thread).

        Applies, in order and exactly once each, every iteration's inf/NaN result that this
        thread has already waited for (torch's rule, then the ``[min_scale, max_scale]``
        clamp). It first waits for the previous iteration's optimizer work, so the lag is
        never more than one iteration. In a plain loop the result applied is this
        iteration's: torch's sequence bit for bit. With asynchronous RoundPipe steps it is
        the previous iteration's: the one-iteration lag of upstream RoundPipe.

        Args:
            new_scale: set the scale to this value instead of applying this iteration's
                result (a float, int, or 1-element tensor on the scale's device type; it is
                copied). The growth tracker is left alone.
            is_async: False waits for this iteration's optimizer work, so its result is
                applied now (torch's sequence even with asynchronous steps). The wait is
                deferred to the first use of the new scale (the next ``scale()``,
                ``get_scale()`` or queued optimizer work), so the next forward still overlaps.

        Raises:
            RuntimeError: called on the optimizer thread.
            AssertionError: ``scale()`` never ran, or an iteration being applied recorded no
                inf checks (no ``unscale_``/``step`` ran in it).
        """
        if not self._enabled:
            return
        if optim_stream.on_optim_stream():
            raise RuntimeError("GradScaler.update() must be called from the main thread.")
        self._main_scale()
        scale, _ = self._check_scale_growth_tracker("update")
        override = None if new_scale is None else _copied_new_scale(new_scale, scale)
        current = self._current
        end_seq = optim_stream.launched_seq()
        waited = optim_stream.waited_seq()  # nothing below waits before the last use
        if override is None and end_seq <= waited and not current.has_result() and not current.faulted():
            raise AssertionError(_NO_INF_CHECKS)
        current.end_seq = end_seq
        current.new_scale = override
        self._current = _Iteration(end_seq)
        if is_async and override is None and self._records[0] is current and end_seq <= waited:
            # The plain loop: nothing earlier is pending and this iteration's work was
            # waited for, so its result applies now and the record retires at once (what
            # _apply_ready_records would do, without its bookkeeping).
            self._records = [self._current]
            self._absorb_settings(current)
            current.applied = True
            error = self._apply_record(current)
            if error is not None:
                raise AssertionError(error)
            return
        self._records = self._records + [self._current]
        if is_async:
            # The previous iteration's work must be finished: at most one iteration of lag.
            self._wait_through(current.start_seq, "GradScaler.update(): previous iteration")
            self._apply_ready_records()
        else:
            self._catch_up_through = end_seq

    def _apply_ready_records(self) -> None:
        """Apply ended records in order while each is waited for (or needs no result).

        Main thread. Records are retired once applied and waited for; optimizer-thread
        setting changes are absorbed before a waited record's rule is applied.
        """
        waited = optim_stream.waited_seq()
        error: Optional[str] = None
        records = self._records
        retired = 0  # the leading records that are applied and waited for
        for index, record in enumerate(records):
            if record is self._current or error is not None:
                break
            assert record.end_seq is not None
            is_waited = record.end_seq <= waited
            if not record.applied:
                if record.new_scale is None and not is_waited:
                    break
                if is_waited:
                    self._absorb_settings(record)
                error = self._apply_record(record)
                record.applied = True
            if is_waited and retired == index:
                self._absorb_settings(record)
                retired += 1
        if retired:
            self._records = records[retired:]
        if error is not None:
            raise AssertionError(error)

    def _apply_record(self, record: _Iteration) -> Optional[str]:
        """Apply one record to the scale chain; return an error text if it had no result."""
        assert self._scale is not None and self._growth_tracker is not None
        if record.new_scale is not None:
            self._unshare_scale().copy_(record.new_scale)
            return None
        found_inf = record.combined_found_inf(self._scale.device)
        if found_inf is not None:
            update_scale_(
                self._unshare_scale(),
                self._growth_tracker,
                found_inf,
                self._growth_factor,
                self._backoff_factor,
                self._growth_interval,
                self._min_scale,
                self._max_scale,
            )
        elif not record.faulted():
            return (
                f"{_NO_INF_CHECKS} (The optimizer work queued in an earlier iteration ran "
                "no scaler.step()/unscale_(); call update() once per optimizer step.)"
            )
        return None

    # ------------------------------------------------------------ settings and getters
    def _absorb_settings(self, record: _Iteration) -> None:
        """Apply setter calls that optimizer-thread jobs of ``record`` made (main thread)."""
        if not record.settings:
            return
        for name, value in record.settings:
            setattr(self, name, value)
        record.settings.clear()

    def _set(self, name: str, value: Any) -> None:
        if optim_stream.on_optim_stream():
            self._caller_iteration().settings.append((name, value))
        else:
            setattr(self, name, value)

    def _get(self, name: str, up_to_date: bool) -> Any:
        if optim_stream.on_optim_stream():
            value = getattr(self, name)
            for set_name, set_value in self._caller_iteration().settings:
                if set_name == name:
                    value = set_value
            return value
        if up_to_date:
            optim_stream.synchronize(f"GradScaler.get{name}(up_to_date=True)")
            waited = optim_stream.waited_seq()
            for record in list(self._records):
                end = record.end_seq if record.end_seq is not None else waited
                if end <= waited:
                    self._absorb_settings(record)
        return getattr(self, name)

    def get_scale(self) -> float:
        """The scale the calling thread uses, as a Python float (host sync).

        Main thread: the value ``scale()`` applies now. Optimizer thread: the value the
        running job's iteration unscales by. 1.0 when disabled; ``init_scale`` (as given)
        before the first ``scale()``.
        """
        if not self._enabled:
            return 1.0
        scale = self._scale_for(self._caller_iteration())
        return self._init_scale if scale is None else scale.item()

    def get_growth_factor(self, up_to_date: bool = False) -> float:
        """The growth factor. ``up_to_date=True`` (main thread) first waits for queued
        optimizer work so setter calls made inside it are included."""
        return self._get("_growth_factor", up_to_date)

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the growth factor (no validation, as torch). From the main thread it applies
        at once; from the optimizer thread when update() applies that iteration."""
        self._set("_growth_factor", new_factor)

    def get_backoff_factor(self, up_to_date: bool = False) -> float:
        """The backoff factor; ``up_to_date`` as in :meth:`get_growth_factor`."""
        return self._get("_backoff_factor", up_to_date)

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the backoff factor; timing as in :meth:`set_growth_factor`."""
        self._set("_backoff_factor", new_factor)

    def get_growth_interval(self, up_to_date: bool = False) -> int:
        """The growth interval; ``up_to_date`` as in :meth:`get_growth_factor`."""
        return self._get("_growth_interval", up_to_date)

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the growth interval; timing as in :meth:`set_growth_factor`."""
        self._set("_growth_interval", new_interval)

    def is_enabled(self) -> bool:
        """Whether the scaler is enabled."""
        return self._enabled

    # ------------------------------------------------------------- checkpoints, pickle
    def state_dict(self) -> Dict[str, Any]:
        """torch's keys (``scale``, ``growth_factor``, ``backoff_factor``,
        ``growth_interval``, ``_growth_tracker``) plus ``_pending_found_inf``.

        ``_pending_found_inf`` lists the results of ended iterations that ``update()`` has not
        applied yet (the lagged mode's pending next scale), so a resumed run continues the
        same sequence; torch ignores the extra key. Main thread; waits for queued optimizer
        work first (like ``synchronize()``) and syncs the host. ``{}`` when disabled.
        """
        if not self._enabled:
            return {}
        optim_stream.synchronize("GradScaler.state_dict()")
        self._main_scale()
        pending = []
        for record in self._records:
            if record is self._current or record.applied:
                continue
            found_inf = record.combined_found_inf(torch.device("cpu"))  # None: no result
            if found_inf is not None:
                pending.append(found_inf.item())
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._get_growth_tracker(),
            "_pending_found_inf": pending,
        }

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a state dict written by this class or by ``torch.amp.GradScaler``.

        Main thread; waits for queued optimizer work first. ``_pending_found_inf`` (optional)
        is checked before anything is applied: a list or tuple of at most one finite,
        non-negative number (the lag is one iteration), else ``ValueError`` and the scaler is
        unchanged. torch's keys are then read in torch's order (a missing key raises
        ``KeyError`` after the earlier ones were applied, as torch). No-op when disabled.
        """
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler."
            )
        pending = _checked_pending(state_dict.get("_pending_found_inf", []))
        optim_stream.synchronize("GradScaler.load_state_dict()")
        self._main_scale()
        self._init_scale = state_dict["scale"]
        for tensor in (self._scale, self._current.scale):
            if tensor is not None:
                tensor.fill_(state_dict["scale"])
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._init_growth_tracker = state_dict["_growth_tracker"]
        if self._growth_tracker is not None:
            self._growth_tracker.fill_(state_dict["_growth_tracker"])
        self._load_pending(pending)

    def _load_pending(self, pending: Iterable[float]) -> None:
        """Replace unapplied ended records with loaded results (main thread, stream idle)."""
        with self._lock:
            kept = [r for r in self._records if r.applied or r is self._current]
            loaded = []
            for value in pending:
                record = _Iteration(self._current.start_seq)
                record.end_seq = self._current.start_seq
                record.loaded_found_inf = float(value)
                loaded.append(record)
            self._records = kept[:-1] + loaded + [self._current]

    def __getstate__(self) -> Dict[str, Any]:
        """Plain values only (no tensors, threads or locks). Main thread; syncs the host.

        Raises ``AssertionError`` mid-iteration (after ``unscale_``/``step``), as torch.
        """
        state = {
            name: getattr(self, name)
            for name in (
                "_device",
                "_enabled",
                "_init_scale",
                "_init_growth_tracker",
                "_growth_factor",
                "_backoff_factor",
                "_growth_interval",
                "_min_scale",
                "_max_scale",
            )
        }
        if self._enabled:
            if self._current.states:
                raise AssertionError(_PICKLE_MID_ITERATION)
            snapshot = self.state_dict()
            state["_init_scale"] = snapshot["scale"]
            state["_init_growth_tracker"] = snapshot["_growth_tracker"]
            state["_pending_found_inf"] = snapshot["_pending_found_inf"]
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state = dict(state)
        pending = state.pop("_pending_found_inf", [])
        self.__dict__.update(state)
        self._start_fresh()
        self._load_pending(pending)

    # ------------------------------------------- torch's private surface used in the wild
    # Read-only on purpose, where torch's is an attribute: the states are those of the caller's
    # iteration (each thread's own), and torch assigns its attribute only in __init__ and
    # update(), both replaced here. mypy reports the narrower override, hence the ignore.
    @property
    def _per_optimizer_states(self) -> Dict[int, Dict[str, Any]]:  # type: ignore[override]
        """``{id(optimizer): {"stage", "found_inf_per_device"}}`` of the caller's iteration."""
        return self._caller_iteration().states

    def _get_scale_async(self) -> Optional[torch.Tensor]:
        """The caller's iteration scale tensor (no host sync), or None before ``scale()``."""
        return self._scale_for(self._caller_iteration())

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        if self._growth_tracker is None:
            return self._init_growth_tracker
        return int(self._growth_tracker.item())

    def _check_scale_growth_tracker(self, funcname: str) -> Tuple[torch.Tensor, torch.Tensor]:
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  {_FIX_HINT}")
        if self._growth_tracker is None:
            raise AssertionError(f"Attempted {funcname} but _growth_tracker is None.  {_FIX_HINT}")
        return self._scale, self._growth_tracker

    # torch annotates these two as dict[str, Any], but its own return {device: found_inf}
    # (the dict its _unscale_grads_ builds, typed dict[torch.device, Tensor] there): its
    # annotation is wrong, FoundInfPerDevice is what both return.
    def _found_inf_per_device(self, optimizer: torch.optim.Optimizer) -> FoundInfPerDevice:  # type: ignore[override]
        return self._caller_iteration().states[id(optimizer)]["found_inf_per_device"]

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> FoundInfPerDevice:  # type: ignore[override]
        """Record inf/NaN per device without unscaling (fp16 allowed); caller's thread."""
        return self._check_inf_in(self._caller_iteration(), optimizer)

    def _check_inf_in(self, record: _Iteration, optimizer: torch.optim.Optimizer) -> FoundInfPerDevice:
        scale = self._require_scale(record, "_check_inf_per_device")
        found = unscale_grads_(optimizer.param_groups, torch.ones_like(scale), allow_fp16=True)
        record.states[id(optimizer)]["found_inf_per_device"] = found
        return found

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool,
    ) -> FoundInfPerDevice:
        """torch's private helper: unscale by ``inv_scale``; ``found_inf`` is only a template
        (each device gets a fresh zero tensor, as torch's replicator copies a fresh one)."""
        del found_inf
        return unscale_grads_(optimizer.param_groups, inv_scale, allow_fp16)


_LIVE_SCALERS: "weakref.WeakSet[GradScaler]" = weakref.WeakSet()


def _new_locks_in_child() -> None:
    """After fork only the forking thread exists: a scaler lock the optimizer thread held
    at that moment would never be released in the child, so every scaler gets a new one.
    (The records stay: optim_stream's fork contract keeps their sequence numbers valid.)"""
    for scaler in list(_LIVE_SCALERS):
        scaler._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)

_FIX_HINT = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."


def _check_bounds(min_scale: Optional[float], max_scale: Optional[float]) -> None:
    for name, bound in (("min_scale", min_scale), ("max_scale", max_scale)):
        if bound is not None and not (isinstance(bound, (int, float)) and bound > 0):
            raise ValueError(f"{name} must be a positive number or None, got {bound!r}")
    if min_scale is not None and max_scale is not None and min_scale > max_scale:
        raise ValueError(f"min_scale ({min_scale}) must not exceed max_scale ({max_scale})")


def _checked_pending(pending: Any) -> List[float]:
    """Validate a state dict's ``_pending_found_inf``; return it as floats.

    ``state_dict()`` writes at most one entry (the lagged iteration's found_inf count); more
    entries, or values that are not finite counts, would back the scale off wrongly (down
    to 0 for a long list), so they are refused before the load changes anything.
    """
    if not isinstance(pending, (list, tuple)):
        raise ValueError(f"_pending_found_inf must be a list, got {type(pending).__name__}: {pending!r}")
    if len(pending) > 1:
        raise ValueError(
            f"_pending_found_inf holds {len(pending)} results; a GradScaler state dict has "
            "at most one (the update lags by one iteration)"
        )
    for value in pending:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"_pending_found_inf entries are found-inf counts (finite numbers >= 0), got {value!r}")
    return [float(value) for value in pending]


def _copied_new_scale(new_scale: Union[float, int, torch.Tensor], scale: torch.Tensor) -> torch.Tensor:
    """Validate ``update(new_scale)`` as torch does (Python ints accepted) and copy it."""
    if isinstance(new_scale, (float, int)) and not isinstance(new_scale, bool):
        return torch.full((), float(new_scale), dtype=torch.float32, device=scale.device)
    if not isinstance(new_scale, torch.Tensor):
        raise AssertionError(_NEW_SCALE_REASON)
    if new_scale.device.type != scale.device.type:
        raise AssertionError(_NEW_SCALE_REASON)
    if new_scale.numel() != 1:
        raise AssertionError(_NEW_SCALE_REASON)
    if new_scale.requires_grad is not False:
        raise AssertionError(_NEW_SCALE_REASON)
    return new_scale.detach().reshape(()).to(scale.device, torch.float32, copy=True)
