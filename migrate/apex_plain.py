"""The plain target for apex scripts (``--apex-target plain``): upstream RoundPipe's API only.

A migrated apex script normally calls :mod:`roundpipe.compat`, which upstream RoundPipe does
not have. Where ``amp.initialize``'s settings are literals that a plain program can follow
exactly, :func:`plain_setup` resolves them (apex's property table for O0, O1, O2 and O3 with
the literal overrides ``keep_batchnorm_fp32``, ``master_weights``, ``loss_scale``,
``patch_torch_functions``) into a :class:`PlainSetup`, and the apex rules emit, instead of
the compat calls:

* O0, O2, O3: the model cast where the optimizer is built: a generated ``_apex_cast_model(model, dtype,
  keep_batchnorm_fp32)`` (defined once after the imports) that does what compat's
  ``initialize`` does to the module: weights to ``dtype`` (affine batchnorm kept), floating
  inputs cast to ``dtype`` and outputs to float32 at every call (forward hooks on the first
  and last pipeline layer), float16 entries of its state dict saved as float32; then
  ``roundpipe.RoundPipe(model, optim_dtype=torch.float32 | None, ...)`` and the optimizer on
  ``model.optim_parameters()``;
* O1: the model stays float32 and is wrapped in a generated subclass of
  ``roundpipe.RoundPipe`` whose ``forward`` and ``forward_backward`` run under
  ``torch.autocast`` for the generated ``_apex_o1_target()``: float16 on CUDA when it is
  available (where upstream runs the model), else bfloat16 on the CPU, the type compat's O1
  picks on each of these devices; the backward stays outside autocast (RoundPipe's
  ``forward_backward`` switches it off), and so do step functions (the subclass's ``step``),
  as apex runs the optimizer step with its casts off. Because apex's O1 patches torch for
  the whole program, the ``initialize`` line becomes the generated ``_apex_o1_casts()``,
  which switches the thread's autocast on from there (cache off), as compat's O1 does, so
  code outside the model (an evaluation loss, a metric's matmul) is cast as under apex;
* ``roundpipe.GradScaler`` with apex's first scale and growth interval (dynamic), a never
  growing one (a static power of two), or a disabled one (apex's static 1.0 short cut);
* ``amp.master_params(opt)`` as the parameters of ``opt``'s groups.

Everything a plain program cannot do as compat does is a :class:`Unplain` (node, reason):
the caller then keeps the compat form and says why (RPM303). That covers settings known
only at run time, ``min_loss_scale``/``max_loss_scale``,
``cast_model_type``, ``cast_model_outputs``, ``num_losses``, the overrides apex and compat
reject under O1 (``keep_batchnorm_fp32``, ``master_weights`` other than None: they raise),
``patch_torch_functions`` other than O1's own ``True``, the loss scaler's state dict,
the function-casting API, a loss scale over float16 optimizer copies (O2 without master
weights, O3 with a scale: torch's ``GradScaler`` refuses to unscale float16 gradients), a
step that does not follow its ``scale_loss`` block (gradient
accumulation: compat unscales every block onto the masters, a ``GradScaler`` once per
step), and a model or optimizer this module cannot follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import libcst as cst
import libcst.matchers as m

from .names import ModuleFacts
from .plan import Binding, Blocked, Plan
from .syntax import code

#: ``(name, at) -> Binding``: where a name is bound as seen from ``at`` (the torch rules').
Constructed = Callable[[str, cst.CSTNode], Binding]

__all__ = [
    "PlainSetup",
    "Unplain",
    "helper_statements",
    "master_params_text",
    "plain_setup",
    "steps_follow",
]

#: apex's property table, the part the plain target reads: (model dtype, keep_batchnorm_fp32,
#: master_weights, loss_scale) per opt level; O1's dtype None: the model stays float32 and
#: runs under autocast (master_weights None counts as False, as in apex's scale_loss).
_LEVELS: Dict[str, Tuple[Optional[str], bool, bool, Union[str, float]]] = {
    "O0": ("torch.float32", False, False, 1.0),
    "O1": (None, False, False, "dynamic"),
    "O2": ("torch.float16", True, True, "dynamic"),
    "O3": ("torch.float16", False, False, 1.0),
}
_DYNAMIC = "roundpipe.GradScaler(init_scale=2.0**16, growth_interval=2000)"
_IGNORED = ("enabled", "verbosity")  # literal True / any literal: nothing to compute
_O1_ONLY_NONE = ("keep_batchnorm_fp32", "master_weights")  # under O1 apex and compat raise for any other value


@dataclass(frozen=True)
class Unplain:
    """Why a file keeps the compat form: the node that needs compat and the reason."""

    node: cst.CSTNode
    reason: str


@dataclass(frozen=True)
class PlainSetup:
    """One literal ``amp.initialize(model, optimizer, ...)`` resolved for the plain target.

    Attributes:
        statement: the ``model, optimizer = amp.initialize(...)`` line (dropped).
        model, optimizer: the variable names, bound by that line as they were passed.
        built: the line that builds the optimizer on ``model.parameters()`` (the cast and
            wrap go right before it); ``built_value`` its value, ``scope`` its scope.
        dtype: the model's dtype (``torch.float32`` or ``torch.float16``); None for O1: the
            model is not cast and runs under autocast.
        keep_batchnorm_fp32: affine batchnorm keeps its dtype.
        master_weights: the optimizer copies are float32.
        scaler: the ``roundpipe.GradScaler(...)`` expression for apex's loss scale.
    """

    statement: cst.SimpleStatementLine
    model: str
    optimizer: str
    built: cst.BaseStatement
    built_value: cst.BaseExpression
    scope: object
    dtype: Optional[str]
    keep_batchnorm_fp32: bool
    master_weights: bool
    scaler: str


def plain_setup(
    facts: ModuleFacts,
    uses: Sequence[Tuple[cst.CSTNode, str]],
    allowed: Sequence[str],
    constructed: Constructed,
) -> Union[PlainSetup, Unplain]:
    """The plain setup of the module whose apex uses are ``uses`` (node, qualified name), or
    why it needs compat. ``allowed``: the other qualified names the plain target handles
    (scale_loss, master_params, apex's extras); ``constructed(name, at)``: the binding of an
    optimizer as the torch rules find it."""
    initializes = [node for node, qualified in uses if qualified == "apex.amp.initialize"]
    for node, qualified in uses:
        if (
            qualified not in ("apex.amp.initialize", *allowed)
            and facts.enclosing(node, (cst.Import, cst.ImportFrom)) is None
        ):
            return Unplain(node, f"`{code(node)}` ({qualified}) is migrated through roundpipe.compat only")
        call = facts.parent(node)
        if qualified == "apex.amp.master_params" and not (
            isinstance(call, cst.Call) and len(call.args) == 1 and call.args[0].keyword is None
        ):
            return Unplain(node, "amp.master_params is not called with one optimizer")
    if len(initializes) != 1:
        return Unplain(initializes[1] if initializes else uses[0][0], "not one amp.initialize in the file")
    if not _imports_torch(facts):
        return Unplain(initializes[0], "the file does not `import torch` (the plain code names torch.float16)")
    return _resolve(facts, initializes[0], constructed)


def _resolve(facts: ModuleFacts, node: cst.CSTNode, constructed: Constructed) -> Union[PlainSetup, Unplain]:
    call = facts.parent(node)
    statement = facts.statement_of(node)
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
    if not (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(call, cst.Call)
        and isinstance(small, cst.Assign)
        and small.value is call
    ):
        return Unplain(node, "amp.initialize is not assigned on a line of its own")
    positional = [arg.value for arg in call.args if arg.keyword is None]
    target = small.targets[0].target if len(small.targets) == 1 else None
    names = [e.value for e in target.elements] if isinstance(target, cst.Tuple) else []
    if not (
        len(positional) == 2
        and len(names) == 2
        and all(isinstance(v, cst.Name) for v in [*positional, *names])
        and [code(v) for v in positional] == [code(v) for v in names]
    ):
        return Unplain(call, "amp.initialize does not take and rebind one model and one optimizer variable")
    model, optimizer = code(positional[0]), code(positional[1])
    keywords = {arg.keyword.value: arg for arg in call.args if arg.keyword is not None}
    level_arg = keywords.pop("opt_level", None)
    level = _string(level_arg.value) if level_arg is not None else "O1"
    if level not in _LEVELS:
        return Unplain(
            level_arg or call, "opt_level is not a literal 'O0', 'O1', 'O2' or 'O3' (known only at run time)"
        )
    dtype, keep, master, loss_scale = _LEVELS[level]
    for name, arg in keywords.items():
        value = arg.value
        if name in _IGNORED and _literal(value) is not None and (name != "enabled" or code(value) == "True"):
            continue
        if dtype is None and name in _O1_ONLY_NONE:
            if code(value) != "None":
                return Unplain(arg, f"amp.initialize({name}={code(value)}) under O1 raises in apex and compat")
        elif name == "patch_torch_functions" and dtype is None and code(value) == "True":
            continue  # O1's own value
        elif name == "keep_batchnorm_fp32" and code(value) in ("True", "False", "None", '"True"', '"False"'):
            keep = keep if code(value) == "None" else code(value).strip('"') == "True"
        elif name == "master_weights" and code(value) in ("True", "False", "None"):
            master = master if code(value) == "None" else code(value) == "True"
        elif name == "loss_scale" and (_string(value) == "dynamic" or isinstance(_literal(value), float)):
            loss_scale = "dynamic" if _string(value) == "dynamic" else float(_literal(value))  # type: ignore[arg-type]
        else:
            return Unplain(arg, f"amp.initialize({name}={code(value)}) is compat only (no plain equivalent here)")
    scaler = _scaler(loss_scale, master)
    if scaler is None:
        return Unplain(keywords["loss_scale"], "a static loss scale that is not a power of two (compat only)")
    if dtype == "torch.float16" and not master and "enabled=False" not in scaler:
        return Unplain(
            call,
            "float16 optimizer copies with a loss scale: torch's GradScaler refuses to unscale float16 "
            "gradients, compat unscales them in place as apex does",
        )
    try:
        built = constructed(optimizer, statement)  # the binding before this line's own
    except Blocked as blocked:
        return Unplain(blocked.node, blocked.message)
    problem = _built_before(facts, built, statement, model)
    if problem or built.statement is None or built.value is None:
        return Unplain(node, problem)
    return PlainSetup(
        statement, model, optimizer, built.statement, built.value, built.scope, dtype, keep, master, scaler
    )


def _built_before(facts: ModuleFacts, built: Binding, statement: cst.BaseStatement, model: str) -> str:
    """Why the cast and wrap cannot go where the optimizer is built ("" when they can):
    the optimizer must be built on ``model.parameters()`` in the same block, before the
    ``initialize`` line, with nothing in between reading the model."""
    if built.statement is None or built.value is None:
        return "the optimizer is not built in this function"
    owners = {
        code(c.func.value)  # type: ignore[attr-defined]
        for c in m.findall(built.value, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("parameters")), args=[]))
    }
    if owners != {model}:
        return f"the optimizer is not built on `{model}.parameters()`"
    block = facts.parent(built.statement)
    body = list(getattr(block, "body", ()))
    if statement not in body or body.index(built.statement) > body.index(statement):
        return "the optimizer is not built before amp.initialize in the same block"
    between = body[body.index(built.statement) + 1 : body.index(statement)]
    if any(isinstance(n, cst.Name) and n.value == model for s in between for n in facts.subtree(s, cst.Name)):
        return f"`{model}` is used between the optimizer and amp.initialize"
    return ""


def _scaler(loss_scale: Union[str, float], master_weights: bool) -> Optional[str]:
    if loss_scale == "dynamic":
        return _DYNAMIC
    assert isinstance(loss_scale, float)
    if loss_scale == 1.0 and not master_weights:  # apex's short cut: nothing scaled or counted
        return "roundpipe.GradScaler(enabled=False)"
    mantissa = loss_scale
    while mantissa >= 2.0:
        mantissa /= 2.0
    while 0.0 < mantissa < 1.0:
        mantissa *= 2.0
    if mantissa != 1.0:
        return None
    return f"roundpipe.GradScaler(init_scale={loss_scale!r}, growth_interval=2**31 - 1)"


def _string(node: cst.BaseExpression) -> Optional[str]:
    return node.evaluated_value if isinstance(node, cst.SimpleString) else None  # type: ignore[return-value]


def _literal(node: cst.BaseExpression) -> Optional[object]:
    """The value of a number or string literal (a float for every number), else None."""
    if isinstance(node, (cst.Integer, cst.Float)):
        return float(node.evaluated_value)
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value
    return None


def _imports_torch(facts: ModuleFacts) -> bool:
    return any(
        isinstance(small, cst.Import) and any(code(a.name) == "torch" and a.asname is None for a in small.names)
        for line in facts.import_lines
        for small in line.body
    )


def steps_follow(facts: ModuleFacts, withs: Sequence[cst.With], optimizer: str) -> Optional[Unplain]:
    """None when every ``scale_loss`` block in ``withs`` is followed, in its own block, by a
    plain statement that is the first to use ``optimizer`` (one block per step); else why."""
    for statement in withs:
        block = facts.parent(statement)
        body = list(getattr(block, "body", ()))
        after = body[body.index(statement) + 1 :] if statement in body else []
        using = [s for s in after if any(n.value == optimizer for n in facts.subtree(s, cst.Name))]
        if not using or not isinstance(using[0], cst.SimpleStatementLine):
            return Unplain(
                statement,
                "the optimizer step does not follow this scale_loss block (gradient accumulation?): compat "
                "unscales every block onto the optimizer copies, a GradScaler once per step",
            )
    return None


def master_params_text(optimizer: str) -> str:
    """apex's ``amp.master_params(optimizer)``: every parameter of every group, in order."""
    return f'[_param for _group in {optimizer}.param_groups for _param in _group["params"]]'


_HELPERS = '''
def {cast}(value, dtype):
    """roundpipe-migrate (apex): a model's inputs or outputs with floating tensors cast to dtype."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (str, bytes)):
        return value
    if hasattr(value, "to"):
        return value.to(dtype)
    if isinstance(value, dict):
        return {{{cast}(key, dtype): {cast}(item, dtype) for key, item in value.items()}}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*({cast}(item, dtype) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)({cast}(item, dtype) for item in value)
    return value


def {state}(module, state_dict, prefix, local_metadata):
    """roundpipe-migrate (apex): float16 entries of a state dict saved as float32."""
    for key, value in state_dict.items():
        if key.startswith(prefix) and isinstance(value, torch.Tensor) and value.dtype == torch.float16:
            state_dict[key] = value.float()


def {model}(model, dtype, keep_batchnorm_fp32):
    """roundpipe-migrate: what apex's amp.initialize did to the model: weights to dtype
    (affine batchnorm kept with keep_batchnorm_fp32), float16 weights saved as float32,
    floating inputs cast to dtype and outputs to float32 at every call."""
    for module in model.modules():
        module.register_state_dict_post_hook({state})
        if keep_batchnorm_fp32 and isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.affine:
            continue
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if tensor.is_floating_point():
                tensor.data = tensor.data.to(dtype)
    layers = list(model) if isinstance(model, torch.nn.Sequential) and len(model) else [model]
    layers[0].register_forward_pre_hook(
        lambda _, args, kwargs: ({cast}(args, dtype), {cast}(kwargs, dtype)), with_kwargs=True
    )
    layers[-1].register_forward_hook(lambda _, args, output: {cast}(output, torch.float32))
'''


_AUTOCAST_HELPERS = '''
def {target}():
    """roundpipe-migrate (apex O1): where and in which type O1 casts: float16 on CUDA (where
    upstream RoundPipe runs the model), else bfloat16 on the CPU (CPU autocast's low-precision type)."""
    if torch.cuda.is_available():
        return "cuda", torch.float16
    return "cpu", torch.bfloat16


def {casts}():
    """roundpipe-migrate (apex O1): apex's O1 casts from amp.initialize on, for the rest of the
    program: this thread's autocast switched on (not a block; no cast cache outside blocks), so
    that code outside the model (an evaluation loss, a metric) is cast as apex's patches cast it."""
    device_type, dtype = {target}()
    torch.set_autocast_dtype(device_type, dtype)
    torch.set_autocast_enabled(device_type, True)
    torch.set_autocast_cache_enabled(False)


class {model}(roundpipe.RoundPipe):
    """roundpipe-migrate (apex O1): a RoundPipe whose forward and forward_backward (the model
    and the loss function; the backward runs outside autocast) run under torch.autocast, and
    whose step functions run with autocast off, as apex runs the optimizer step."""

    def forward(self, *args, **kwargs):
        device_type, dtype = {target}()
        with torch.autocast(device_type, dtype=dtype):
            return super().forward(*args, **kwargs)

    def forward_backward(self, *args, **kwargs):
        device_type, dtype = {target}()
        with torch.autocast(device_type, dtype=dtype):
            return super().forward_backward(*args, **kwargs)

    def step(self, step_fn, is_async=True, *args, **kwargs):
        def uncast_step_fn(*step_args, **step_kwargs):
            with torch.autocast({target}()[0], enabled=False):
                return step_fn(*step_args, **step_kwargs)

        return super().step(uncast_step_fn, is_async, *args, **kwargs)
'''


def helper_statements(plan: Plan, autocast: bool) -> Tuple[Dict[str, str], List[cst.BaseStatement]]:
    """(the generated names by role, the module-level definitions to insert), with fresh
    names that capture no user name: ``"model"`` names the model-cast function (O0, O2, O3),
    or with ``autocast`` (O1) the autocasting subclass of ``roundpipe.RoundPipe`` that
    replaces it in the wrap, and ``"casts"`` the function that switches O1's casts on for
    the rest of the program (called where ``amp.initialize`` was)."""
    if autocast:
        bases = (("target", "_apex_o1_target"), ("casts", "_apex_o1_casts"), ("model", "_ApexAutocastRoundPipe"))
        text = _AUTOCAST_HELPERS
    else:
        bases = (("cast", "_apex_cast"), ("state", "_apex_float32_state"), ("model", "_apex_cast_model"))
        text = _HELPERS
    names = {role: plan.fresh(base) for role, base in bases}
    body: List[cst.BaseStatement] = list(cst.parse_module(text.format(**names)).body)
    return names, body
