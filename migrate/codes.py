"""The diagnostic codes of roundpipe-migrate, in the manner of ruff's rule pages.

A code is a promise: one condition, a stable kebab-case name, and the same four parts for
each (what was found, why the file is left alone, an example, what to do). The code table
of ``docs/migrate.md`` is generated from :data:`REGISTRY` (:func:`markdown_table`; a test
keeps them equal). RPM1xx: torch.amp and project shapes left unchanged; RPM2xx: apex;
RPM3xx: informational; RPM9xx: files that could not be processed (exit status 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

__all__ = ["Code", "REGISTRY", "markdown_table"]


@dataclass(frozen=True)
class Code:
    """One diagnostic code and its documentation."""

    code: str
    name: str
    summary: str
    what: str
    why: str
    example: str
    action: str


_CODES: Tuple[Code, ...] = (
    Code(
        "RPM101",
        "parallel-wrapper",
        "model wrapped in DistributedDataParallel/DataParallel",
        "the model is wrapped in DDP/DataParallel, directly, through a helper function of the "
        "module, or after `amp.initialize`",
        "RoundPipe places the model on the devices itself; two wrappers would train it twice",
        "`model = DistributedDataParallel(model)`",
        "remove the wrapper for RoundPipe, then migrate",
    ),
    Code(
        "RPM102",
        "step-closure",
        "optimizer step with a closure",
        "`scaler.step(optimizer, closure)`",
        "closures (LBFGS) have no RoundPipe form",
        "`scaler.step(opt, closure)`",
        "migrate by hand",
    ),
    Code(
        "RPM103",
        "create-graph-backward",
        "backward with create_graph=True",
        "`scaler.scale(loss).backward(create_graph=True)`",
        "higher-order gradients are not supported by `forward_backward`",
        "`scaler.scale(loss).backward(create_graph=True)`",
        "keep this loop on plain PyTorch",
    ),
    Code(
        "RPM104",
        "scaler-not-followed",
        "GradScaler used where its training step cannot be followed",
        "a scaler used in a function nobody in the file calls, bound to an expression that builds a "
        "GradScaler in only some of its branches (`GradScaler() if amp else NoScaler()`), through a "
        "container or an attribute "
        "of an object that is neither `self` nor a state object the migration follows "
        "(`scalers[i].scale(loss)`), or with methods outside a recognised step",
        "the step it drives cannot be rewritten with certainty",
        "`scalers[i].scale(loss).backward()`",
        "keep the scaler in a plain variable, an attribute of the trainer class or a state object, or migrate by hand",
    ),
    Code(
        "RPM105",
        "scaler-stored",
        "GradScaler kept in an attribute or container",
        "the GradScaler is built into a container, an expression or an attribute of an object that "
        "is not the instance of a method (`self`)",
        "its uses cannot be followed",
        "`scalers[name] = GradScaler()`",
        "assign it to a plain variable or to `self.scaler` in a method, or migrate by hand",
    ),
    Code(
        "RPM106",
        "step-not-recognised",
        "no recognised optimizer step follows the backward",
        "no `scaler.step(optimizer)` (apex: `optimizer.step()`), with the optimizer a name or an "
        "attribute, follows the backward in its block, in an `if` after it, or after the loop of "
        "micro-steps that ends with it (for a backward that is one branch of a two-path split, "
        "`if amp: scaler.scale(loss).backward() else: loss.backward()`, the same after that "
        "`if`); nor, when the backward ends its function or method, does "
        "exactly one other method of the class family or one other function handed the same "
        "scaler hold the step",
        "the rewrite is built from the step that consumes the backward's gradients; a step it "
        "cannot pair with the backward is not followed",
        "`scaler.scale(loss).backward()` in a helper whose callers never step that scaler",
        "put `scaler.step(optimizer)` and `scaler.update()` after the backward in the same block, or migrate by hand",
    ),
    Code(
        "RPM107",
        "several-models-or-optimizers",
        "several models, optimizers or backward calls in one step",
        "one step drives several optimizers, calls the model several times or unscales another optimizer, "
        "or a trainer method steps one wrapped model while calling another with gradients (a GAN step)",
        "one `model.step` serves one optimizer",
        "`scaler.step(opt_g); scaler.step(opt_d)`",
        "migrate by hand",
    ),
    Code(
        "RPM108",
        "object-not-built-here",
        "model or optimizer not defined in this file",
        "the optimizer (or model) is not built in the file, or the optimizer is built on parts of the model",
        "the wrap and `optim_parameters()` need the place where it is built",
        "`optimizer = make_optimizer(cfg)`",
        "build the optimizer on `model.parameters()` in the same file",
    ),
    Code(
        "RPM110",
        "project-not-consistent",
        "part of a program whose other files are not migrated",
        "the file would migrate, but a file it imports or that imports it is refused, or its "
        "wrapped model is handed to a function of another given file",
        "a half-migrated program computes something else than the original",
        "train.py migrates, checkpoint.py (imported by it) is refused",
        "fix the blocker the message names, then run again on all files",
    ),
    Code(
        "RPM111",
        "scaler-wrapper",
        "loss-scaler or optimizer wrapper class not migrated",
        "a class holding a GradScaler on `self` with a `__call__` (timm's `NativeScaler` shape) that is not "
        "the recognised one, built where no optimizer on `model.parameters()` is built, or called with "
        "`parameters=` that are not `model.parameters()`; an optimizer wrapper (the GradScaler next to the "
        "optimizer behind `backward`/`step`/`zero_grad` methods, fairseq's shape) with a method the "
        "migration does not handle, named in the message; an AMP helper (the GradScaler behind separate "
        "`scale_loss`/`backward`, `unscale`, `optimizer_step` methods) with a method doing more than its scaler "
        "call, two scalers, or an instance used other than by its methods; or a file calling a wrapper class "
        "of another given file that is not migrated",
        "the wrapper and every file that builds or calls it change together, or none of them",
        "`loss_scaler(loss, optimizer, parameters=model.parameters())`",
        'bring the wrapper to a shape in docs/migrate.md ("Loss-scaler wrappers"), or migrate by hand',
    ),
    Code(
        "RPM113",
        "forward-value-used-elsewhere",
        "a value of the forward is needed outside the loss function",
        "in an apex step, a value computed between the forward and the backward is read elsewhere "
        "(later, in the next iteration, or by a statement that stays on the main thread), or read "
        "before it is bound (a torch.amp step takes the autograd form instead)",
        "moving it into the loss function would change the value the other code sees (or raise UnboundLocalError)",
        "`aux = out.pow(2).mean()` printed in the next iteration",
        "compute that value from the returned outputs after the step, or migrate by hand",
    ),
    Code(
        "RPM114",
        "model-trained-elsewhere",
        "the model is also handed to another trainer or alias",
        "`torch.compile(model)`, `deepcopy`, an averaged copy the tool does not know (a class not listed under "
        '"EMA and averaged copies", a method of an EMA object not known to only read the model, an EMA class '
        "keeping the model whose object is returned or handed on), `model.module`, or an alias bound before the "
        "RoundPipe wrap and used after it",
        "RoundPipe must be the only thing training the model; an old alias misses its weights",
        "`model_without_ddp = model` before the wrap, saved after training",
        "bind aliases after the wrap (to `model.model` for the module), build the EMA with a known class, "
        "drop compile for RoundPipe",
    ),
    Code(
        "RPM115",
        "backward-outside-step",
        "a backward outside the recognised training step",
        "the file also runs `loss.backward()` (a second, plain loop) while the model is wrapped",
        "that training would bypass RoundPipe's step",
        "a warm-up loop with `loss.backward(); optimizer.step()`",
        "give the second loop the same scaler step, or migrate by hand",
    ),
    Code(
        "RPM116",
        "conflicting-rewrites",
        "two rewrites would change the same statements",
        "two recognised steps (duplicated training code) overlap",
        "the plan is not consistent",
        "the same `scaler.step` block pasted twice",
        "remove the duplicate, or migrate by hand",
    ),
    Code(
        "RPM120",
        "instance-attribute-not-followed",
        "an object held in an instance attribute cannot be followed",
        "the scaler, model or optimizer lives on `self`, but the attribute is bound more than once, "
        "not by a plain assignment or not in `__init__` before its optimizer (the model), spelled "
        "through another instance name, used from outside the class other than by read-only "
        "scaler methods and the model and optimizer uses of an instance the code builds that the "
        "rules order (`trainer.model.state_dict()`; a container, a parameter, another name or "
        "`getattr` is not followed), the class derives from a class of a file not given (a mixin), or a "
        "scaler handed to the constructor may be one the program does not show",
        "the object the attribute holds at the step is not certain",
        "`self.scaler = GradScaler()` in `__init__` and `self.scaler = None` in `close()`",
        "bind the attribute once in `__init__` and use it only in the class, or migrate by hand",
    ),
    Code(
        "RPM125",
        "state-object-not-followed",
        "a state object holding the training objects cannot be followed",
        "the scaler, model or optimizer is held in a dataclass, NamedTuple, namespace or dict state "
        "object that is handed to a function of another module or library, read with a key "
        "computed at run time, held by a name bound more than once, has a field replaced after "
        "it is built, or is built before the optimizer it holds; a list, set or tuple literal holding the "
        "wrapped model handed to a function of another module or library (`torch.save([model, optimizer], path)`)",
        "what the state holds at the step, or where its objects go, is not certain",
        '`torch.save(state, path)` with `state = {"model": model, "scaler": scaler}`',
        "pass the state only to functions of the file and read it with literal field names, or migrate by hand",
    ),
    Code(
        "RPM130",
        "backward-not-recognised",
        "the scaled backward is not written in a recognised form",
        "the backward is not one statement of a block reading `scaler.scale(loss).backward()` "
        "(one loss; no argument but `retain_graph`/`create_graph`); apex: a `scale_loss` block "
        "holding more than `scaled.backward()`, or an `FP16_Optimizer` without "
        "`optimizer.backward(loss)` on its own line",
        "the step is found and rewritten from its backward; another form cannot be moved or kept with certainty",
        "`scaled = scaler.scale(loss); scaled.backward()`",
        "write the backward as `scaler.scale(loss).backward()` on its own line, or migrate by hand",
    ),
    Code(
        "RPM131",
        "forward-not-found",
        "no forward of the recognised shape computes the loss",
        "before the backward there is no call of the model, followed only by simple statements "
        "computing the loss from its output (no statement at all, a forward inside a `with` "
        "block that is not autocast, or a loss that does not depend on the model's output)",
        "only such a forward can move into the loss function of `forward_backward`; a torch.amp "
        "step then takes the autograd form instead (reported only for apex steps)",
        "`with torch.no_grad(): out = model(x)` right before the backward",
        "nothing for torch.amp; for apex, compute the loss from the model's output right before "
        "the `scale_loss` block, or migrate by hand",
    ),
    Code(
        "RPM132",
        "starred-model-call",
        "the model is called with *args, or with **kwargs and keywords",
        "the forward is `model(*inputs)`, or `model(x, **extra, key=value)`",
        "the inputs are split into microbatches by position or by one mapping of keywords; a "
        "torch.amp step then takes the autograd form instead (reported only for apex steps)",
        "`out = model(*batch)`",
        "nothing for torch.amp; for apex, name the inputs (`model(x, y)`), or migrate by hand",
    ),
    Code(
        "RPM133",
        "backward-retains-graph",
        "the backward keeps its graph for a later backward",
        "`scaler.scale(loss).backward(retain_graph=True)`",
        "a later backward goes through the same graph, so the forward cannot move into a loss "
        "function; the step takes the autograd form (this code names the reason in the report, "
        "it is not a refusal)",
        "`scaler.scale(loss_d).backward(retain_graph=True)` in a GAN step",
        "nothing",
    ),
    Code(
        "RPM134",
        "step-out-of-order",
        "the statements of the optimizer step are in an order the step function cannot keep",
        "`scaler.update()` before `scaler.step()` (before the last one, when several optimizers "
        "are stepped) or twice in one step, a gradient norm measured after `scaler.update()`, "
        "`scaler.get_scale()` read between the backward and `scaler.update()`, or (without "
        "`--exact`) compared across the update to skip the scheduler on overflow",
        "in RoundPipe the step runs on the optimizer copies; the scale and the gradients the "
        "statements would see there are not the original's",
        "`scaler.update(); scaler.step(optimizer)`",
        "put `scaler.step` before `scaler.update()` and measure gradients before the step, or migrate by hand",
    ),
    Code(
        "RPM135",
        "step-condition-not-kept",
        "the optimizer step runs under a condition the rewrite cannot keep",
        "the `if` holding the step has an `else` branch, its test reads a gradient norm measured "
        "after the backward, or `zero_grad()` runs every iteration while the step runs under a "
        "condition or after a loop of micro-steps; or, in a two-path step after a two-path "
        "backward (`if amp: scaler.step(opt); scaler.update() else: opt.step()`), a branch holds "
        "work other than unscale/clip/step/update, the branches do not step one optimizer once "
        "each, or the test calls a function or reads a name a loop around the step rebinds",
        "the condition or the zeroing would be decided on the main thread from values only the "
        "step function has, or would no longer discard the same gradients; a two-path step moves "
        "into the step function whole, for one optimizer, and its test is read again on the main "
        "thread for the scaler's update",
        "`if torch.isfinite(norm): scaler.step(opt)` with `norm` measured after the backward",
        "keep one unconditional `scaler.step` (it already skips non-finite steps) and zero "
        "where the step runs, or migrate by hand",
    ),
    Code(
        "RPM136",
        "plain-path-not-recognised",
        "the plain branch beside a migrated AMP step is not one backward and one step",
        "in `if amp: <AMP step> else: <plain step>` (or beside an optional loss-scaler wrapper), "
        "the plain branch runs several backwards, or does not call `optimizer.step()` exactly "
        "once, unconditionally, after its backward; or, in apex's two-path split, "
        "`amp.initialize` runs under a condition other than the split's own `if`",
        "once the AMP path is migrated the model is wrapped, so the plain path must train "
        "through `model.step` too; a step of another shape cannot be moved there with certainty, "
        "and a model apex set up under another condition may reach the plain path unwrapped",
        "`else: loss.backward(); if ready: optimizer.step()`",
        "give the plain branch one `loss.backward()` followed by one `optimizer.step()`; set apex "
        "up unconditionally (`enabled=flag`) or under the split's condition; or migrate by hand",
    ),
    Code(
        "RPM137",
        "builtin-sum-rebound",
        "the file binds its own `sum`",
        "the loss is logged after the step and the file assigns, imports or defines `sum`",
        "the migrated loss logging (`loss = sum(_losses)`) needs the builtin",
        "`from numpy import sum`",
        "rename the file's `sum`, or migrate by hand",
    ),
    Code(
        "RPM138",
        "scaler-fallback-positional",
        "a GradScaler import fallback is called with an ambiguous positional argument",
        "`GradScaler` names both `torch.amp`'s and `torch.cuda.amp`'s class (a `try`/`except "
        "ImportError` fallback), and its first positional argument is neither a string (the device) "
        "nor a number (the legacy `init_scale`)",
        "the two classes read their positional arguments differently, so which one the call means is not certain",
        "`GradScaler(args.init_scale)` under `try: from torch.amp import GradScaler` / `except "
        "ImportError: from torch.cuda.amp import GradScaler`",
        "pass the arguments by keyword (`GradScaler(init_scale=args.init_scale)`)",
    ),
    Code(
        "RPM139",
        "model-parameter-shared",
        "a function gets the wrapped model at one call and another object at another",
        "a function of the file that the migration changes for the RoundPipe model it gets as a "
        "parameter (`evaluate(model)`) is also called with another object (`evaluate(model_ema)`, "
        "`evaluate(restored)`), leaves that parameter to its default, or is handed on as a value",
        "what is written into it for the RoundPipe model (`model.synchronize()`, `model.model.state_dict()`, "
        "`model.step(...)`) would fail on the other object",
        "`evaluate(model)` during training and `evaluate(baseline)` for a fresh model",
        "give the other objects their own function, or migrate by hand",
    ),
    Code(
        "RPM140",
        "gradient-read-after-step",
        "gradients are read on the main thread after the optimizer step",
        "a function holding a migrated step reads `.grad` after `optimizer.step()` (a gradient norm "
        "or histogram logged after the step, or at the top of the next iteration), or a caller of such "
        "a function (or of an optimizer wrapper's `step()`) reads it after the call or in a loop around it",
        "`model.step` hands the model's gradients to the optimizer copies, so the model holds none "
        "after it and the read would see other values",
        "`gnorm = sum(p.grad.norm() ** 2 for p in model.parameters())` after `scaler.update()`",
        "read the gradients before the step (they move into the step function with it), or migrate by hand",
    ),
    Code(
        "RPM141",
        "weights-written-after-wrap",
        "the model's weights are written in place after the RoundPipe wrap",
        "after the optimizer is built, the main thread writes through the wrapped model or the variable "
        "of a loop over its `parameters()`/`named_parameters()`/`modules()`/`children()`: an in-place "
        "method (`model.head.bias.zero_()`, `p.mul_(0.5)`; `requires_grad_` aside), `apply(...)`, "
        "`reset_parameters()`, an assignment to an attribute or subscript (`model.fc.weight.data = ...`), "
        "an augmented assignment (`p *= 0.5`), a `torch.nn.init` call on it, or a cast of its floating-point "
        "type (`.half()`, `.double()`, `.to(torch.float64)`, `.to(dtype=...)`; a device move alone is not); "
        "also an EMA written back into the model (`ema.copy_to(model)`, `ema.restore(model)`) or an EMA class "
        "of the file whose methods write the model they get or keep",
        "the optimizer holds RoundPipe's copies of the weights, and the next step writes them back over the write "
        "(in the copies' own type, after a cast)",
        "`nn.init.normal_(model.fc.weight, std=0.01)` right after the optimizer",
        "initialise the weights before the optimizer is built, or migrate by hand",
    ),
    Code(
        "RPM142",
        "wrapped-model-indexed",
        "the wrapped model is indexed or iterated where the wrapped module cannot stand in for it",
        "after the wrap, the model is indexed or iterated (`model[0]`, `for block in model`, `list(model)`) "
        "in its step function (`clip_grad_norm_(model[0].parameters(), 1.0)` between unscale and step), or "
        "in a statement moved into the loss function; elsewhere such a use goes to the wrapped module "
        "(`model.model[0]`, `len(model.model)`)",
        "a RoundPipe model is not a container of its layers; in the step function the wrapped module's "
        "layers hold the model's own weights from before the step, not the optimizer's copies, and a "
        "moved statement is rebuilt from its original text",
        "`torch.nn.utils.clip_grad_norm_(model[-1].parameters(), 1.0)` after `scaler.unscale_(optimizer)`",
        "reach the weights through `model.parameters()` in the step, read the layer into a name before the "
        "forward, or migrate by hand",
    ),
    Code(
        "RPM147",
        "model-run-through-method",
        "the wrapped model is trained through a method of its own, not its forward",
        "in the function of a migrated step, with gradients enabled, the model is called through a "
        "method that is neither `forward` nor one of `nn.Module`'s or RoundPipe's, and that is not proven "
        "to read none of its weights (`agent.get_action_and_value(obs, actions)`, `model.compute_loss(batch)`; "
        "a method of the file's model class whose body never names `self`, such as `parse_batch`, goes to "
        "`model.model`), or a layer reached by indexing or iterating the model may run there (`model[0](x)`)",
        "RoundPipe runs a model only through `model(...)`; another method reaches the wrapped module "
        "through attribute forwarding and runs it outside RoundPipe, on the weights it keeps in host memory",
        "`_, logprob, entropy, value = agent.get_action_and_value(obs, actions)` before the backward",
        "make the training computation the model's `forward` (or a module whose forward calls the method), "
        "call a method that only reads the weights under `torch.no_grad()`, then migrate",
    ),
    Code(
        "RPM158",
        "gradient-helper-does-more",
        "a project helper between the backward and the step does more than gradient work",
        "a function of the file called between the backward (or `scaler.unscale_`) and the step walks the "
        "parameters of the model it is handed but also reads or writes the weights, reads another attribute "
        "of the model or the parameter names in a way the copies' `model.` prefix changes, prints, writes "
        "state outside its locals or calls what the migration does not follow; or the call hands it "
        "something else than the trained model (or `model.parameters()`), or, in the asynchronous form, a "
        "variable the loop rebinds",
        "such a call must move into the step function, where the parameters are the optimizer copies: only "
        "work on their gradients (norms, clipping, dropping gradients) means the same there",
        "`if self.check_gradients(loss): scaler.step(optimizer)` where `check_gradients` prints and clips",
        "keep the helper to gradient work (move logging and loss checks out of it), or migrate by hand",
    ),
    Code(
        "RPM190",
        "internal-error",
        "internal error: the rewrite does not compile",
        "a rule produced text that does not compile",
        "a bug; the file is left unchanged",
        "-",
        "please report it with the file",
    ),
    Code(
        "RPM201",
        "apex-no-equivalent",
        "apex construct with no RoundPipe equivalent",
        "`delay_unscale`, `disable_casts`, `_amp_state`, `FusedLAMB`, an apex argument torch has no option for, ...",
        "no RoundPipe form exists",
        "`amp.scale_loss(loss, opt, delay_unscale=True)`",
        "migrate that part by hand (docs/apex.md)",
    ),
    Code("RPM301", "note", "note on the migrated code", "informational", "-", "-", "nothing"),
    Code(
        "RPM302",
        "shared-apex-scaler",
        "several apex losses now share one scaler",
        "apex `num_losses`/`loss_id`",
        "every loss now shares one scaler",
        "`num_losses=2`",
        "nothing, unless per-loss scales mattered to you",
    ),
    Code(
        "RPM303",
        "apex-kept-on-compat",
        "apex script kept on roundpipe.compat under `--apex-target plain`",
        "a setting or call that upstream RoundPipe's API cannot follow exactly: O1, a setting known "
        "only at run time, `min_loss_scale`, `amp.state_dict()`, gradient accumulation, ...",
        "the file is migrated to `roundpipe.compat` as without the flag; upstream RoundPipe has no `roundpipe.compat`",
        "`amp.initialize(model, opt, opt_level=args.opt_level)`",
        "run it on this project's RoundPipe, or port the named part by hand (docs/apex.md)",
    ),
    Code("RPM901", "syntax-error", "syntax error", "the file does not parse", "-", "-", "fix the file"),
    Code("RPM902", "io-error", "file could not be read or written", "-", "-", "-", "check permissions"),
    Code("RPM903", "not-utf8", "file is not UTF-8", "-", "-", "-", "re-encode it"),
    Code(
        "RPM904",
        "engine-crashed",
        "internal error in roundpipe-migrate (please report it)",
        "the engine raised, or a `-j` worker died (native crash, out of memory), on this file",
        "a bug or a limit of the parser; the file is left unchanged and the run goes on",
        "-",
        "please report it with the file",
    ),
    Code(
        "RPM905",
        "not-a-python-file",
        "not a regular Python file; skipped unread",
        "a FIFO, device or other non-regular file, or a notebook (`.ipynb`) given by name",
        "reading it could hang, and notebooks are not supported",
        "-",
        "give the `.py` files; export a notebook to a script first",
    ),
)

#: code -> its documentation
REGISTRY: Dict[str, Code] = {c.code: c for c in _CODES}


def markdown_table() -> str:
    """The diagnostics table of docs/migrate.md."""
    rows = ["| code | name | what was found | why it is left alone | what to do |", "|---|---|---|---|---|"]
    rows += [f"| {c.code} | `{c.name}` | {c.what} | {c.why} | {c.action} |" for c in _CODES]
    return "\n".join(rows) + "\n"
