"""Splitting inputs and labels into microbatches, and merging per-microbatch outputs.

Default rules (``split_input``/``split_label``/``merge_output`` left unset):

* The batch size is dim 0 of the first positional tensor with ``ndim >= 1`` (or, with no
  positional tensors, of the first such keyword tensor).
* Every positional tensor with ``ndim >= 1`` is split along dim 0 with ``torch.tensor_split``
  (the first ``N mod k`` chunks get one row more). Keyword tensors are split only when their
  dim 0 equals the batch size; everything else (0-dim tensors, non-tensors, other keyword
  tensors) is given whole to every microbatch. Nested lists/tuples/dicts are walked.
* A batch smaller than ``num_microbatch`` gives one microbatch per row.
* Label tensors with ``ndim >= 1`` are split the same way and must have the inputs' batch
  size (``ValueError`` otherwise: a silent misalignment would train on wrong pairs).
* Outputs: ``ndim >= 1`` tensors are concatenated along dim 0, 0-dim tensors averaged,
  non-tensors must be equal in every microbatch.

Custom rules follow upstream RoundPipe: ``split_input`` may be a function
``(args, kwargs, n) -> (list_of_args, list_of_kwargs)`` or a pair of
``torch.distributed.pipelining`` chunk-spec pytrees; ``split_label`` a function
``(label, n) -> list`` or a spec; ``merge_output`` ``False`` (a list, one entry per
microbatch), a function ``(list_of_outputs) -> merged``, or a spec.

With one microbatch nothing is split or merged: inputs, label and outputs pass through as
they are. All functions run on the calling thread and copy no data (views only).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

__all__ = ["split_inputs", "split_label", "merge_outputs", "to_device"]

Chunks = Tuple[List[tuple], List[Dict[str, Any]]]


def _is_batched(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() >= 1


def _first_batch_size(leaves: Sequence[Any]) -> Optional[int]:
    for leaf in leaves:
        if _is_batched(leaf):
            return leaf.shape[0]
    return None


def _split_leaves(leaves: Sequence[Any], count: int, should_split: Callable[[Any], bool]):
    """Per leaf: ``count`` chunks (split) or the leaf repeated ``count`` times."""
    return [torch.tensor_split(leaf, count) if should_split(leaf) else [leaf] * count for leaf in leaves]


def _chunk_spec_split(args: tuple, kwargs: dict, count: int, spec: Any) -> Chunks:
    from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks

    args_spec, kwargs_spec = spec
    return split_args_kwargs_into_chunks(args, kwargs, count, args_spec, kwargs_spec)


def split_inputs(
    args: tuple, kwargs: Dict[str, Any], num_microbatch: int, spec: Any = None
) -> Tuple[List[tuple], List[Dict[str, Any]], Optional[int]]:
    """Split positional and keyword inputs into microbatches.

    Returns ``(args_per_microbatch, kwargs_per_microbatch, batch_size)``; ``batch_size`` is
    None when no input tensor has a batch dimension, a custom splitter was used, or
    ``num_microbatch`` is 1 (the inputs are not even walked then).
    """
    args = tuple(args)
    kwargs = dict(kwargs)
    if callable(spec):
        arg_chunks, kwarg_chunks = spec(args, kwargs, num_microbatch)
        arg_chunks, kwarg_chunks = list(arg_chunks), list(kwarg_chunks)
        if not arg_chunks or len(arg_chunks) != len(kwarg_chunks):
            raise ValueError(
                "split_input function must return two lists of the same, non-zero length; "
                f"got {len(arg_chunks)} args and {len(kwarg_chunks)} kwargs chunks"
            )
        return [tuple(a) for a in arg_chunks], [dict(k) for k in kwarg_chunks], None
    if num_microbatch == 1:  # nothing to split, and no label to align with the inputs
        return [args], [kwargs], None
    arg_leaves, arg_tree = tree_flatten(args)
    kwarg_leaves, kwarg_tree = tree_flatten(kwargs)
    positional_batch = _first_batch_size(arg_leaves)
    batch = positional_batch if positional_batch is not None else _first_batch_size(kwarg_leaves)
    if batch is None or batch <= 1:
        return [args], [kwargs], batch
    count = min(num_microbatch, batch)
    if spec is not None and spec != (None, None):
        arg_chunks, kwarg_chunks = _chunk_spec_split(args, kwargs, count, spec)
        return list(arg_chunks), list(kwarg_chunks), batch
    arg_split = _split_leaves(arg_leaves, count, _is_batched)
    kwarg_split = _split_leaves(kwarg_leaves, count, lambda leaf: _is_batched(leaf) and leaf.shape[0] == batch)
    arg_chunks = [tree_unflatten([s[i] for s in arg_split], arg_tree) for i in range(count)]
    kwarg_chunks = [tree_unflatten([s[i] for s in kwarg_split], kwarg_tree) for i in range(count)]
    return arg_chunks, kwarg_chunks, batch


def split_label(label: Any, count: int, batch: Optional[int], spec: Any = None) -> List[Any]:
    """Split ``label`` into ``count`` microbatches, aligned with the inputs' split."""
    if callable(spec):
        parts = list(spec(label, count))
        if len(parts) != count:
            raise ValueError(f"split_label function returned {len(parts)} labels for {count} microbatches")
        return parts
    if count == 1:
        return [label]
    if spec is not None:
        arg_chunks, _ = _chunk_spec_split((label,), {}, count, ((spec,), None))
        return [chunk[0] for chunk in arg_chunks]
    leaves, tree = tree_flatten(label)
    for leaf in leaves:
        if _is_batched(leaf) and batch is not None and leaf.shape[0] != batch:
            raise ValueError(
                f"label batch size {leaf.shape[0]} does not match the inputs' batch size "
                f"{batch}; microbatches would pair inputs with the wrong labels"
            )
    split = _split_leaves(leaves, count, _is_batched)
    return [tree_unflatten([s[i] for s in split], tree) for i in range(count)]


def _merge_leaf(values: List[Any]) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            return torch.stack(values).mean(dim=0)
        return torch.cat(values, dim=0)
    if any(value != first for value in values[1:]):
        raise ValueError(f"cannot merge microbatch outputs: non-tensor values differ ({values!r})")
    return first


def merge_outputs(outputs: List[Any], spec: Any = True) -> Any:
    """Merge per-microbatch outputs (see module docs); one output is returned unchanged."""
    if spec is False:
        return list(outputs)
    if callable(spec):
        return spec(list(outputs))
    if len(outputs) == 1:
        return outputs[0]
    if spec is not True and spec is not None:
        from torch.distributed.pipelining.microbatch import merge_chunks

        return merge_chunks(list(outputs), spec)
    flat = [tree_flatten(output) for output in outputs]
    tree = flat[0][1]
    if any(other_tree != tree for _, other_tree in flat[1:]):
        raise ValueError("cannot merge microbatch outputs: their structures differ")
    merged = [_merge_leaf([leaves[i] for leaves, _ in flat]) for i in range(len(flat[0][0]))]
    return tree_unflatten(merged, tree)


def to_device(value: Any, device: Optional[torch.device]) -> Any:
    """Move every tensor in ``value`` to ``device`` (no-op when ``device`` is None)."""
    if device is None:
        return value
    return tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)
