"""The optimizer's copies of a model's parameters, and the traffic between them.

RoundPipe's optimizer never touches the model's own parameters: it works on one copy per
trainable parameter, in ``optim_dtype`` (e.g. fp32 masters for an fp16 model), on the same
device. Gradients flow model -> copies at ``step()``; weights flow copies -> model when the
main thread takes the optimizer's result.

Thread contract: every method runs on the main thread while no optimizer job is using the
copies (the runtime waits for the previous step first). On CUDA the copies are used on the
optimizer's stream; gradients handed to them are marked with ``record_stream`` so memory the
optimizer frees is not reused by the main stream too early.
"""

from __future__ import annotations

import sys
import weakref
from typing import ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple, cast

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from . import optim_stream

__all__ = ["OptimizerCopies", "HandedGrads"]

HandedGrads = Dict[nn.Parameter, torch.Tensor]
"""Model parameter -> the gradient tensor it handed to its copy by reference."""


class OptimizerCopies:
    """Lazily created ``nn.Parameter`` copies of ``module``'s trainable parameters."""

    def __init__(self, module: nn.Module, optim_dtype: Optional[torch.dtype]) -> None:
        self._module = module
        self._optim_dtype = optim_dtype
        self._copy_of: Optional[Dict[nn.Parameter, nn.Parameter]] = None
        self._pairs: List[Tuple[nn.Parameter, nn.Parameter]] = []
        # The two sides of ``_pairs``, in its order, for the foreach copies of every step.
        self._model_side: List[torch.Tensor] = []
        self._copy_side: List[torch.Tensor] = []
        self._names: List[str] = []  # the module's name for each pair's parameter
        # Buffers given back by hand_back_grads that no backward has delivered a gradient
        # into since (the post-accumulate hook drops the entry), with their version counter
        # at that moment: one still at that version is still zero. Held weakly, so a buffer
        # the caller drops from ``param.grad`` is freed at once, as in the plain loop.
        self._returned: Dict[nn.Parameter, Tuple[weakref.ref[torch.Tensor], int]] = {}
        # Given-back buffers taken off their parameters around a backward, until it either
        # delivers the parameter's gradient (then the buffer is freed) or ends (then the
        # buffer goes back).
        self._held: Dict[nn.Parameter, torch.Tensor] = {}
        self._arrival_hooks: List[RemovableHandle] = []

    @property
    def created(self) -> bool:
        return self._copy_of is not None

    def _ensure(self) -> Dict[nn.Parameter, nn.Parameter]:
        if self._copy_of is None:
            self._copy_of = {}
            for name, param in self._module.named_parameters():
                if param.requires_grad:
                    dtype = self._optim_dtype or param.dtype
                    copy = nn.Parameter(param.detach().to(dtype=dtype, copy=True))
                    self._copy_of[param] = copy
                    self._names.append(name)
            self._pair_up(list(self._copy_of.items()))
        return self._copy_of

    def _pair_up(self, pairs: List[Tuple[nn.Parameter, nn.Parameter]]) -> None:
        self._pairs = pairs
        self._model_side = [param for param, _ in pairs]
        self._copy_side = [copy for _, copy in pairs]
        for hook in self._arrival_hooks:
            hook.remove()
        arrived = _CopiesHook(self)
        self._arrival_hooks = [param.register_post_accumulate_grad_hook(arrived) for param, _ in pairs]

    def _gradient_arrived(self, param: torch.Tensor) -> None:
        """Post-accumulate hook of every model parameter with a copy: a backward delivered
        its gradient, so a buffer given back to it now holds a gradient (or, taken off
        around the backward, is no longer needed)."""
        key = cast(nn.Parameter, param)
        self._returned.pop(key, None)
        self._held.pop(key, None)

    def pairs(self) -> Sequence[Tuple[nn.Parameter, nn.Parameter]]:
        """``(model parameter, its copy)`` for every trainable parameter, in the module's
        order (tied parameters once); creates the copies. The runtime's own list, kept
        until weights are loaded with new parameter objects: read it, do not change it."""
        self._ensure()
        return self._pairs

    def copy_of(self, param: nn.Parameter) -> Optional[nn.Parameter]:
        """The copy of one of the module's parameters (None: frozen, or not the module's)."""
        return self._ensure().get(param)

    def named(self, prefix: str, remove_duplicate: bool) -> Iterator[Tuple[str, nn.Parameter]]:
        """``(name, copy)`` for every trainable parameter, named as in the wrapped module
        under ``prefix`` (tied parameters once, unless ``remove_duplicate`` is False)."""
        copy_of = self._ensure()
        for name, param in self._module.named_parameters(prefix=prefix, remove_duplicate=remove_duplicate):
            copy = copy_of.get(param)
            if copy is not None:
                yield name, copy

    def hand_over_grads(self) -> HandedGrads:
        """Move the model's accumulated gradients onto the copies and clear them on the model.

        A copy without a gradient takes the model's gradient (by reference when dtype and
        device match, else cast to ``optim_dtype``); a copy that still has one (the step
        function did not zero it) has the model's gradient added to it. A buffer given back
        by :meth:`hand_back_grads` that no backward has delivered a gradient into since
        counts as no gradient, as the None a plain loop's ``zero_grad()`` leaves there, also
        when it was written in place (``clip_grad_norm_`` or unscaling over all gradients,
        ``zero_grad(set_to_none=False)`` on the model): it stays on the model and its copy
        gets none, so optimizers skip it as plain torch does.

        Returns the gradients moved by reference, for :meth:`hand_back_grads` once the
        step that uses them has finished.
        """
        handed: HandedGrads = {}
        copy_of = self._ensure()
        with torch.no_grad():
            for param in self._module.parameters():
                grad = param.grad
                returned = self._returned.pop(param, None)
                if grad is None:
                    continue
                if returned is not None and returned[0]() is grad:
                    self._returned[param] = returned  # no gradient arrived: the copy gets none
                    continue
                copy = copy_of.get(param)
                if copy is None:
                    raise RuntimeError(
                        "a model parameter has a gradient but no optimizer copy (was "
                        "requires_grad switched on after the optimizer was built?)"
                    )
                if copy.grad is None:
                    moved = grad if grad.dtype == copy.dtype else grad.to(copy.dtype)
                    if moved.is_cuda:
                        moved.record_stream(optim_stream.cuda_stream(moved.device))
                    copy.grad = moved
                    if moved is grad:
                        handed[param] = grad
                else:
                    copy.grad.add_(grad.to(copy.grad.dtype))
                param.grad = None
        return handed

    def release_grads(self, handed: HandedGrads) -> HandedGrads:
        """Zero, in place, the gradient buffers the optimizer has let go of; return them.

        Runs on the thread of the step that received ``handed``, right after its step
        function returned (so on the optimizer thread in asynchronous mode, and on its
        CUDA stream there, the zeroing overlaps the next forward pass). Empties ``handed``.
        A buffer is released only when nothing else holds it: its copy no longer does (the
        step function zeroed it with ``set_to_none``) and no other tensor or name refers to
        it or its memory. Nothing can reach a released buffer afterwards but the returned
        mapping, for :meth:`hand_back_grads`.
        """
        released: HandedGrads = {}
        while handed:
            param, grad = handed.popitem()
            if _unshared(grad):
                released[param] = grad
        if released:
            with torch.no_grad():
                torch._foreach_zero_(list(released.values()))  # one call, not one per buffer
        return released

    def hand_back_grads(self, released: HandedGrads) -> None:
        """Give buffers from :meth:`release_grads` back to the model, once that step is done.

        Main thread. A buffer goes back only to a model parameter of this module that has
        no gradient, so after a step the model's ``param.grad`` reads zero, as after torch's
        ``zero_grad(set_to_none=False)``. A backward inside ``forward_backward`` frees the
        buffer and stores its own gradient (:meth:`backward_stores_gradients`); any other
        backward, or one whose buffer the caller holds or has written, accumulates into it
        in place (``0 + g``).
        """
        if not released or self._copy_of is None:
            return
        for param, grad in released.items():
            if param.grad is None and param in self._copy_of:
                param.grad = grad
                self._returned[param] = (weakref.ref(grad), grad._version)
        released.clear()

    def backward_stores_gradients(self) -> ContextManager[None]:
        """Around a backward pass: the backward stores each gradient it computes, rather than
        adding it into a zeroed buffer from :meth:`hand_back_grads`.

        On entry, every given-back buffer that is still untouched (its version unchanged,
        so still zero) and that nothing else holds (no other reference, no tensor sharing
        its memory: ``g = p.grad`` kept by the user keeps the buffer, and the backward adds
        into it as before) is taken off its parameter, as torch's ``zero_grad()`` leaves a
        plain loop. The backward then keeps the gradient tensor it computed, which holds
        ``g`` where the add would have given ``0 + g``: the same values (a negative zero
        keeps its sign, as in the plain loop), without two passes over the memory. A taken
        buffer is freed as soon as the backward has delivered its parameter's gradient
        (so no more than one extra gradient is alive at a time); on exit (also when the
        backward raises), a parameter the backward gave no gradient gets its own buffer
        back, still zero and still recorded as given back (no allocation, no fill), so what
        a caller sees and what :meth:`hand_over_grads` does are as if it had stayed.
        """
        return _StoringBackward(self)

    def _take_untouched_buffers(self) -> None:
        """Entering :meth:`backward_stores_gradients`: take the given-back buffers off."""
        for param in list(self._returned):
            buffer, version = self._returned[param]
            grad = param.grad
            if grad is None or grad is not buffer() or grad._version != version:
                continue
            del self._returned[param]
            param.grad = None
            if _unshared(grad):
                self._held[param] = grad
            else:
                param.grad = grad
                self._returned[param] = (buffer, version)
            del grad

    def _give_back_held_buffers(self) -> None:
        """Leaving :meth:`backward_stores_gradients`: a parameter the backward gave no
        gradient gets its taken buffer back."""
        if not self._held:
            return
        held, self._held = self._held, {}
        for param, grad in held.items():
            if param.grad is None:
                param.grad = grad
                self._returned[param] = (weakref.ref(grad), grad._version)

    def discard_grads(self) -> None:
        """Drop the copies' gradients (those of a failed step: they must not join the next)."""
        for _, copy in self._pairs:
            copy.grad = None

    def copy_to_model(self) -> None:
        """Write the copies' values into the model's parameters (cast to the model dtype)."""
        if self._pairs:
            with torch.no_grad():
                torch._foreach_copy_(self._model_side, self._copy_side)

    def refresh_from_model(self, keep_masters: bool = False) -> None:
        """Make the copies equal the model's parameters again (after loading weights).

        Parameter objects replaced by the load (``assign=True``) are re-paired by name; the
        copies themselves stay the same objects, so optimizers built on them keep working.
        ``keep_masters``: copies in another dtype than their parameter (the float32 masters
        of float16 weights) keep their values; only the others take the model's.
        """
        if self._copy_of is None:
            return
        by_name = dict(self._module.named_parameters())
        self._pair_up([(by_name.get(name, param), copy) for name, (param, copy) in zip(self._names, self._pairs)])
        self._copy_of = dict(self._pairs)
        pairs = [(param, copy) for param, copy in self._pairs if not keep_masters or param.dtype == copy.dtype]
        if pairs:
            with torch.no_grad():
                torch._foreach_copy_([copy for _, copy in pairs], [param for param, _ in pairs])


class _CopiesHook:
    """The post-accumulate hook on a model parameter: tells the :class:`OptimizerCopies` it
    serves, while they are alive, that a gradient arrived. It holds them weakly (a module that outlives
    its RoundPipe keeps no optimizer copies alive) and is pickled as an :class:`_InertHook`,
    so a module saved whole (``torch.save(model.model, path)``) loads as a plain module that
    carries nothing of the runtime."""

    def __init__(self, copies: OptimizerCopies) -> None:
        self._copies = weakref.ref(copies)

    def __call__(self, tensor: torch.Tensor) -> None:
        copies = self._copies()
        if copies is not None:
            copies._gradient_arrived(tensor)

    def __reduce__(self) -> Tuple[type, Tuple[()]]:
        return (_InertHook, ())


class _InertHook:
    """What a pickled :class:`_CopiesHook` loads as: a hook that does nothing."""

    def __call__(self, tensor: torch.Tensor) -> None:
        return None


class _StoringBackward:
    """The context manager of :meth:`OptimizerCopies.backward_stores_gradients` (a class,
    not a generator: it runs around every ``forward_backward``)."""

    __slots__ = ("_copies",)

    def __init__(self, copies: OptimizerCopies) -> None:
        self._copies = copies

    def __enter__(self) -> None:
        self._copies._take_untouched_buffers()

    def __exit__(self, *exc_info: object) -> None:
        self._copies._give_back_held_buffers()


def _refs_seen_by_a_callee(tensor: torch.Tensor) -> int:
    return sys.getrefcount(tensor)


def _refs_of_a_local() -> int:
    """The reference count a function sees for an argument that its caller holds in one
    local variable only (measured once: the count depends on the Python version)."""
    tensor = torch.empty(0)
    return _refs_seen_by_a_callee(tensor)


_REFS_OF_A_LOCAL = _refs_of_a_local()


def _unshared(tensor: torch.Tensor) -> bool:
    """True when only the caller's one local variable refers to ``tensor`` and no other
    tensor (a view, a saved alias) shares its memory. A tensor of another layout (a
    sparse gradient) has no storage to count and is always taken as shared."""
    # Storage users: ``tensor`` itself and the temporary storage object made here.
    return (
        tensor.layout == torch.strided
        and sys.getrefcount(tensor) == _REFS_OF_A_LOCAL
        and torch._C._storage_Use_Count(tensor.untyped_storage()._cdata) == 2
    )
