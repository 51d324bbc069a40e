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
        "a scaler used in a function nobody in the file calls, through a container or an attribute "
        "of an object that is not `self` (`state.scaler.scale(loss)`), or with methods outside a "
        "recognised step",
        "the step it drives cannot be rewritten with certainty",
        "`state.scaler.scale(loss).backward()`",
        "keep the scaler in a plain variable or an attribute of the trainer class, or migrate by hand",
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
        "training step not recognised",
        "the statements around the backward are not one of the recognised shapes (the message says which part)",
        "a rewrite that is not certain is never made",
        "`optimizer.step()` with no `scaler.step` after `scaler.scale(loss).backward()`",
        "move unrelated statements out of the forward/step, or migrate by hand",
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
        "loss-scaler wrapper class not migrated",
        "a class holding a GradScaler on `self` with a `__call__` (timm's `NativeScaler` shape) that is not "
        "the recognised one, built where no optimizer on `model.parameters()` is built, or called with "
        "`parameters=` that are not `model.parameters()`; or a file calling a wrapper class of another "
        "given file that is not migrated (an optimizer-like wrapper with `backward`/`step` methods)",
        "the wrapper and every file that builds or calls it change together, or none of them",
        "`loss_scaler(loss, optimizer, parameters=model.parameters())`",
        'bring the wrapper to the shape in docs/migrate.md ("Loss-scaler wrappers"), or migrate by hand',
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
        "`torch.compile(model)`, an EMA/averaged copy, `deepcopy`, `model.module`, or an alias "
        "bound before the RoundPipe wrap and used after it",
        "RoundPipe must be the only thing training the model; an old alias misses its weights",
        "`model_without_ddp = model` before the wrap, saved after training",
        "bind aliases after the wrap (to `model.model` for the module), drop compile/EMA for RoundPipe",
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
        "scaler methods, the class derives from a class of a file not given (a mixin), or a "
        "scaler handed to the constructor may be one the program does not show",
        "the object the attribute holds at the step is not certain",
        "`self.scaler = GradScaler()` in `__init__` and `self.scaler = None` in `close()`",
        "bind the attribute once in `__init__` and use it only in the class, or migrate by hand",
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
