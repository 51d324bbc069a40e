"""The wrapped model run through a method of its own where its step trains it.

RoundPipe runs a model only through ``model(...)`` (its ``forward``): that is where the
layers are placed on the devices and the gradients are gathered for ``model.step``. Any
other method (``agent.get_action_and_value(obs)``, ``model.compute_loss(batch)``) is
reached through the wrapper's attribute forwarding and runs the wrapped module directly,
outside RoundPipe, on the weights RoundPipe keeps in host memory: upstream that fails
(device mismatch) or trains behind RoundPipe's back. Such a call with gradients enabled in
a function (or module) that holds a migrated step is refused (RPM147). The methods of
``nn.Module`` and of RoundPipe itself (``parameters``, ``train``, ``zero_grad``,
``state_dict``...) are not runs of the model, calls under ``torch.no_grad()`` /
``inference_mode()`` (evaluation, a rollout) are left to the evaluation rules, and a method
that provably reads none of the model's weights (``parse_batch``) goes to the wrapped
module (:mod:`migrate.weight_free_methods`).
"""

from __future__ import annotations

from typing import FrozenSet, Iterable

import libcst as cst

from .names import ModuleFacts
from .plan import Blocked, Plan
from .weight_free_methods import send_weight_free_method

__all__ = ["MODULE_API", "check_method_forward", "trains_here"]

_CODE = "RPM147"
#: methods that configure, inspect or move a module rather than run it: the public methods of
#: ``nn.Module`` and DDP (``no_sync``), RoundPipe's own and a few of Hugging Face's (spelled
#: out: the command line never imports torch)
MODULE_API: FrozenSet[str] = frozenset(
    (
        "add_module",
        "apply",
        "bfloat16",
        "broadcast_buffers",
        "buffers",
        "children",
        "compile",
        "cpu",
        "cuda",
        "double",
        "eval",
        "extra_repr",
        "float",
        "forward",
        "gather",
        "get_buffer",
        "get_extra_state",
        "get_parameter",
        "get_submodule",
        "half",
        "ipu",
        "join",
        "join_device",
        "join_hook",
        "join_process_group",
        "load_state_dict",
        "modules",
        "mtia",
        "named_buffers",
        "named_children",
        "named_modules",
        "named_parameters",
        "no_sync",
        "parameters",
        "register_backward_hook",
        "register_buffer",
        "register_comm_hook",
        "register_forward_hook",
        "register_forward_pre_hook",
        "register_full_backward_hook",
        "register_full_backward_pre_hook",
        "register_load_state_dict_post_hook",
        "register_load_state_dict_pre_hook",
        "register_module",
        "register_parameter",
        "register_state_dict_post_hook",
        "register_state_dict_pre_hook",
        "requires_grad_",
        "scatter",
        "set_extra_state",
        "set_submodule",
        "share_memory",
        "state_dict",
        "to",
        "to_empty",
        "to_kwargs",
        "train",
        "type",
        "will_sync_module_buffers",
        "xpu",
        "zero_grad",
        "step",
        "synchronize",
        "optim_parameters",
        "optim_named_parameters",
        "adopt_optimizer",
        "set_original_model",
        "save_pretrained",
        "gradient_checkpointing_enable",
        "resize_token_embeddings",
        "tie_weights",
    )
)
_NO_GRAD = frozenset(
    {
        "torch.no_grad",
        "torch.inference_mode",
        "torch.autograd.grad_mode.no_grad",
        "torch.autograd.grad_mode.inference_mode",
    }
)


def check_method_forward(facts: ModuleFacts, plan: Plan, attribute: cst.Attribute, name: str) -> None:
    """Raise :class:`Blocked` (RPM147) when ``attribute`` (``name.method``) is called with
    gradients enabled, is not a method of ``nn.Module`` or RoundPipe, and sits in the
    function (or module code) of a migrated step."""
    call = facts.parent(attribute)
    method = attribute.attr.value
    if not isinstance(call, cst.Call) or call.func is not attribute or method in MODULE_API:
        return
    if not trains_here(facts, plan, attribute) or send_weight_free_method(facts, plan, attribute, name):
        return
    raise Blocked(
        call,
        _CODE,
        f"the model is run through its own method `{name}.{method}(...)` where it is trained: RoundPipe "
        f"runs a model only through `{name}(...)` (its forward), so the call would reach the wrapped "
        "module directly, outside RoundPipe (the method's body is not in the file or reaches the module); "
        "call it under torch.no_grad() if it only reads the weights; left untouched",
    )


def trains_here(facts: ModuleFacts, plan: Plan, node: cst.CSTNode) -> bool:
    """``node`` sits in the function (or module code) of a migrated step, with gradients
    enabled there."""
    holder = facts.enclosing(node, (cst.FunctionDef,))
    steps = {id(facts.enclosing(statement, (cst.FunctionDef,))) for statement in plan.step_statements}
    return id(holder) in steps and not _without_gradients(facts, node, holder)


def _without_gradients(facts: ModuleFacts, node: cst.CSTNode, holder: object) -> bool:
    """Whether ``node`` runs inside a ``with torch.no_grad()``-like block or a function
    decorated with one."""
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, cst.With) and _any_no_grad(facts, (item.item for item in ancestor.items)):
            return True
    if isinstance(holder, cst.FunctionDef):
        return _any_no_grad(facts, (decorator.decorator for decorator in holder.decorators))
    return False


def _any_no_grad(facts: ModuleFacts, expressions: Iterable[cst.BaseExpression]) -> bool:
    for expression in expressions:
        target = expression.func if isinstance(expression, cst.Call) else expression
        if facts.qualified(target) & _NO_GRAD:
            return True
    return False
