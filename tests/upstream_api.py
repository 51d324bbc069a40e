"""A static check of a program's use of ``roundpipe`` against upstream RoundPipe 0.1.1.

:func:`check_program` parses a program with ``ast`` and reports, as :class:`Violation`
records with stable keys, every use that upstream's public API (recorded from the 0.1.1
wheel in ``tests/data/roundpipe_upstream_api.json``) cannot run as this project does:

* a ``roundpipe`` name that upstream does not have;
* a call of an upstream callable, or a method call on an object the program built with one
  (``roundpipe.RoundPipe(...)``, ``roundpipe.GradScaler(...)``, ...; followed through
  assignments, ``self.x`` and the program's own function calls), that does not bind to
  upstream's signature: an unknown keyword, too many positional arguments, a required
  parameter missing; where upstream's annotation is float, int, bool or str, a value whose
  type the program makes plain (a literal, a name assigned one) of another type, or a
  positional value of unknown type (its meaning would rest on position alone);
* a positional argument that binds to differently named parameters here and upstream;
* a method upstream's class lacks (its ``GradScaler`` has no ``state_dict``,
  ``load_state_dict`` or ``is_enabled``), or a ``RoundPipe`` method only this project
  defines (upstream forwards unknown attributes to the wrapped model).

``roundpipe.compat`` names are collected apart (:attr:`Report.compat_names`): upstream has
no ``roundpipe.compat``, and migrated apex scripts need it.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

__all__ = ["COMPAT", "Report", "Violation", "check_program"]

ROOT = Path(__file__).resolve().parent.parent
API = json.loads((ROOT / "tests" / "data" / "roundpipe_upstream_api.json").read_text())
COMPAT = "roundpipe.compat"

# What a call of each constructor-like upstream name returns, for tracking the objects a
# program builds (compat's functions included: the compat case is checked the same way).
RETURNS = {
    "roundpipe.RoundPipe": "roundpipe.RoundPipe",
    "roundpipe.GradScaler": "roundpipe.GradScaler",
    "roundpipe.optim.Adam": "roundpipe.optim.Adam",
    "roundpipe.compat.loss_scaler": "roundpipe.GradScaler",
    "roundpipe.compat.initialize": "roundpipe.RoundPipe",  # the models; first target
}
# Classes whose instances forward unknown attributes (RoundPipe: to the wrapped model) or
# inherit a torch base class: only methods upstream overrides are checked there.
OPEN_CLASSES = {"roundpipe.RoundPipe": "torch.nn.Module", "roundpipe.optim.Adam": "torch.optim.Optimizer"}


# ----------------------------------------------------------------------------- the API
@dataclass(frozen=True)
class Parameter:
    """One parameter of an upstream signature, as the JSON records it."""

    name: str
    kind: str  # inspect.Parameter.kind name
    required: bool
    annotation: Optional[str]


def _parameters(raw: Sequence[Dict[str, Any]]) -> Tuple[Parameter, ...]:
    return tuple(
        Parameter(p["name"], p["kind"], p["default"] is None and not p["kind"].startswith("VAR"), p["annotation"])
        for p in raw
        if p["name"] not in ("self", "cls")
    )


@dataclass
class UpstreamApi:
    """Upstream's names, callables (qualname -> parameters) and methods per class."""

    names: Set[str] = field(default_factory=set)
    callables: Dict[str, Tuple[Parameter, ...]] = field(default_factory=dict)
    methods: Dict[str, Dict[str, Tuple[Parameter, ...]]] = field(default_factory=dict)
    attributes: Dict[str, Set[str]] = field(default_factory=dict)

    @classmethod
    def load(cls, data: Dict[str, Any]) -> "UpstreamApi":
        api = cls(names={"roundpipe", "roundpipe.optim"})
        api.names.update(f"roundpipe.{name}" for name in data["roundpipe___all__"])
        api.names.update(f"roundpipe.optim.{name}" for name in data["roundpipe_optim___all__"])
        for entry in data["entries"]:
            qualname = entry["qualname"]
            api.names.add(qualname)
            if "parameters" in entry:
                api.callables[qualname] = _parameters(entry["parameters"])
            methods = {m["name"]: _parameters(m["parameters"]) for m in entry.get("methods", ())}
            if methods:
                api.methods[qualname] = methods
                if "__init__" in methods:
                    api.callables[qualname] = methods["__init__"]
                attributes = entry.get("attributes", {})
                api.attributes[qualname] = set(methods) | set(attributes)
        return api


UPSTREAM = UpstreamApi.load(API)


def _local(qualname: str) -> Any:
    """This project's object for an upstream qualname (None where it has none)."""
    module_name, _, attribute = qualname.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError):
        owner = _local(module_name) if "." in module_name else None
        return getattr(owner, attribute, None)


def _local_positional(target: Any) -> Optional[List[str]]:
    """Names of the positional parameters of this project's ``target``, in order."""
    if target is None:
        return None
    signature = inspect.signature(target.__init__ if inspect.isclass(target) else target)
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.kind in kinds and p.name not in ("self", "cls")]


# --------------------------------------------------------------------------- programs
@dataclass(frozen=True)
class Violation:
    """One use of ``roundpipe`` that upstream 0.1.1 cannot run as this project does."""

    line: int
    key: str  # what is wrong, stable across programs (KNOWN_GAPS keys)
    detail: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.key}: {self.detail}"


@dataclass
class Report:
    """What one program needs beyond upstream: violations, and compat names apart."""

    violations: List[Violation] = field(default_factory=list)
    compat_names: Set[str] = field(default_factory=set)


class UpstreamChecker:
    """Checks one program's use of ``roundpipe`` against :data:`UPSTREAM`."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.report = Report()
        self.aliases: Dict[str, str] = {}  # local name -> qualified roundpipe name
        self.parents: Dict[ast.AST, ast.AST] = {}
        self.functions: Dict[str, ast.FunctionDef] = {}
        self.instances: Dict[Tuple[int, str], str] = {}  # (scope id, dotted name) -> class
        self.assigned: Dict[Tuple[int, str], List[ast.AST]] = {}  # (scope id, name) -> values
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
            if isinstance(parent, ast.FunctionDef):
                self.functions[parent.name] = parent

    def run(self) -> Report:
        self._imports()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                key = (id(self._scope(node)), node.targets[0].id)
                self.assigned.setdefault(key, []).append(node.value)
        self._track_instances()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                self._check_call(node)
            if isinstance(node, (ast.Attribute, ast.Name)) and not self._inside_chain(node):
                self._check_name(node)
        return self.report

    # ----------------------------------------------------------------- names
    def _imports(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "roundpipe":
                        self._use(alias.name, node)
                        if alias.asname:
                            self.aliases[alias.asname] = alias.name
                        else:
                            self.aliases["roundpipe"] = "roundpipe"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "roundpipe":
                for alias in node.names:
                    qualified = f"{node.module}.{alias.name}"
                    self._use(qualified, node)
                    self.aliases[alias.asname or alias.name] = qualified
        for node in ast.walk(self.tree):  # a program's subclass of an upstream class builds what it builds
            if isinstance(node, ast.ClassDef) and len(node.bases) == 1:
                base = self.qualified(node.bases[0])
                if base in RETURNS.values():
                    self.aliases[node.name] = base

    def qualified(self, node: ast.AST) -> Optional[str]:
        """The roundpipe name an expression spells (``roundpipe.RoundPipe``), if any."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = self.qualified(node.value)
            return f"{owner}.{node.attr}" if owner else None
        return None

    def _inside_chain(self, node: ast.AST) -> bool:
        parent = self.parents.get(node)
        return isinstance(parent, ast.Attribute) and self.qualified(parent) is not None

    def _check_name(self, node: ast.AST) -> None:
        name = self.qualified(node)
        if name is not None:
            self._use(name, node)

    def _use(self, name: str, node: ast.AST) -> None:
        if name == COMPAT or name.startswith(COMPAT + "."):
            self.report.compat_names.add(name)
            return
        owner, _, attribute = name.rpartition(".")
        if name in UPSTREAM.names or attribute in UPSTREAM.attributes.get(owner, ()):
            return
        self._violation(node, name, "not in upstream RoundPipe 0.1.1's public API")

    def _violation(self, node: ast.AST, key: str, detail: str) -> None:
        self.report.violations.append(Violation(getattr(node, "lineno", 0), key, detail))

    # ------------------------------------------------------------- instances
    def _scope(self, node: ast.AST) -> ast.AST:
        parent = self.parents.get(node)
        while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.Lambda)):
            parent = self.parents.get(parent)
        return parent if parent is not None else self.tree

    def _scopes_out(self, node: ast.AST) -> Iterator[ast.AST]:
        scope = self._scope(node)
        while True:
            yield scope
            if scope is self.tree:
                return
            scope = self._scope(scope)

    def instance_class(self, node: ast.AST) -> Optional[str]:
        """The upstream class of the object ``node`` names, when the program built it."""
        dotted = _dotted(node)
        if dotted is None:
            return None
        for scope in self._scopes_out(node):
            found = self.instances.get((id(scope), dotted))
            if found is not None:
                return found
        return None

    def _track_instances(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                built = RETURNS.get(self.qualified(node.value.func) or "")
                if built is None:
                    continue
                for target in node.targets:
                    if isinstance(target, (ast.Tuple, ast.List)) and target.elts:
                        target = target.elts[0]
                    for element in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                        dotted = _dotted(element)
                        if dotted is not None:  # self.x: seen from every method
                            scope = self.tree if dotted.startswith("self.") else self._scope(node)
                            self.instances[(id(scope), dotted)] = built
        changed = True
        while changed:  # objects handed to the program's own functions, by position or keyword
            changed = False
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.functions:
                    changed |= self._into_function(node, self.functions[node.func.id])

    def _into_function(self, call: ast.Call, function: ast.FunctionDef) -> bool:
        params = [a.arg for a in function.args.posonlyargs + function.args.args]
        pairs = list(zip(params, call.args)) + [(k.arg, k.value) for k in call.keywords if k.arg]
        changed = False
        for param, value in pairs:
            built = self.instance_class(value)
            key = (id(function), param)
            if built is not None and self.instances.get(key) != built:
                self.instances[key] = built
                changed = True
        return changed

    # ----------------------------------------------------------------- calls
    def _check_call(self, call: ast.Call) -> None:
        name = self.qualified(call.func)
        if name is not None and name in UPSTREAM.callables:
            self._check_arguments(call, name, UPSTREAM.callables[name], _local(name))
            return
        if not isinstance(call.func, ast.Attribute):
            return
        owner = self.instance_class(call.func.value)
        if owner is None:
            return
        method = call.func.attr
        upstream = UPSTREAM.methods.get(owner, {})
        if method in upstream:
            local_class = _local(owner)
            self._check_arguments(call, f"{owner}.{method}", upstream[method], getattr(local_class, method, None))
        elif owner not in OPEN_CLASSES:
            self._violation(call, f"{owner}.{method}", "upstream's class has no such method")
        elif _only_here(owner, method):
            self._violation(
                call, f"{owner}.{method}", "defined only by this project; upstream forwards it to the wrapped model"
            )

    def _check_arguments(self, call: ast.Call, name: str, params: Tuple[Parameter, ...], local: Any) -> None:
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            self._violation(call, f"{name}(*/**)", "unpacked arguments cannot be checked")
            return
        positional = [p for p in params if p.kind in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
        var_positional = any(p.kind == "VAR_POSITIONAL" for p in params)
        var_keyword = any(p.kind == "VAR_KEYWORD" for p in params)
        if len(call.args) > len(positional) and not var_positional:
            self._violation(
                call, f"{name}(positional)", f"{len(call.args)} positional arguments, upstream takes {len(positional)}"
            )
        bound = {p.name: value for p, value in zip(positional, call.args)}
        positional_names = set(bound)
        local_names = _local_positional(local)
        if local_names is not None:
            for index, param in enumerate(positional[: len(call.args)]):
                here = local_names[index] if index < len(local_names) else None
                if here != param.name:
                    self._violation(
                        call, f"{name}(position {index})", f"binds to {param.name} upstream but to {here} here"
                    )
        by_name = {p.name: p for p in params if p.kind in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")}
        for keyword in call.keywords:
            if keyword.arg in bound:
                self._violation(call, f"{name}({keyword.arg}=)", "given twice")
            elif keyword.arg in by_name:
                bound[keyword.arg] = keyword.value
            elif not var_keyword:
                self._violation(call, f"{name}({keyword.arg}=)", "no such parameter upstream")
        for param in params:
            if param.required and param.name not in bound:
                self._violation(call, f"{name}({param.name})", "required upstream, not given")
            value = bound.get(param.name)
            if value is None or param.annotation not in _SIMPLE_ANNOTATIONS:
                continue
            kind = self.constant_type(value)
            if kind is not None and not _type_fits(kind, param.annotation):
                self._violation(
                    call,
                    f"{name}({param.name}=<{kind.__name__}>)",
                    f"a {kind.__name__} where upstream's annotation is {param.annotation}",
                )
            elif kind is None and param.name in positional_names:
                # A positional value of unknown type: its meaning rests on position alone,
                # and this project's GradScaler takes a leading device there.
                self._violation(
                    call,
                    f"{name}({param.name}=<?>)",
                    f"a positional value whose type cannot be shown to be {param.annotation}",
                )

    def constant_type(self, node: ast.AST, depth: int = 0) -> Optional[type]:
        """The type of the constant ``node`` evaluates to, when the program makes it plain:
        a literal, an f-string, arithmetic of numbers, ``a if c else b`` of one type, or a
        name every assignment of which (in this or an enclosing scope) is such a value.
        None when unknown."""
        if isinstance(node, ast.Constant):
            return type(node.value)
        if isinstance(node, ast.JoinedStr):
            return str
        if isinstance(node, ast.UnaryOp):
            return self.constant_type(node.operand, depth)
        if isinstance(node, ast.BinOp):  # arithmetic of numbers: 2.0 ** 10
            operands = {self.constant_type(node.left, depth), self.constant_type(node.right, depth)}
            if operands <= {int, float}:
                return float if float in operands else int
            return None
        if isinstance(node, ast.IfExp):
            branches = {self.constant_type(node.body, depth), self.constant_type(node.orelse, depth)}
            return branches.pop() if len(branches) == 1 else None
        if isinstance(node, ast.Name) and depth < 4:
            for scope in self._scopes_out(node):
                values = self.assigned.get((id(scope), node.id))
                if values:
                    kinds = {self.constant_type(value, depth + 1) for value in values}
                    return kinds.pop() if len(kinds) == 1 else None
        return None


def _dotted(node: ast.AST) -> Optional[str]:
    """``model`` or ``self.model`` as a string; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _dotted(node.value)
        return f"{owner}.{node.attr}" if owner else None
    return None


_SIMPLE_ANNOTATIONS = {"float": (int, float), "int": (int,), "bool": (bool,), "str": (str,)}


def _type_fits(kind: type, annotation: Optional[str]) -> bool:
    """False only for a constant type that a simple annotation (float, int, bool, str)
    excludes; bool counts only as bool."""
    if annotation not in _SIMPLE_ANNOTATIONS:
        return True
    if kind is bool:
        return annotation == "bool"
    return issubclass(kind, _SIMPLE_ANNOTATIONS[annotation])


@functools.lru_cache(maxsize=None)
def _only_here(owner: str, method: str) -> bool:
    """This project's class defines ``method`` beyond its torch base, upstream does not."""
    base_module, _, base_name = OPEN_CLASSES[owner].rpartition(".")
    base = getattr(importlib.import_module(base_module), base_name)
    local = _local(owner)
    return local is not None and hasattr(local, method) and not hasattr(base, method)


def check_program(source: str) -> Report:
    """The upstream violations and compat names of one migrated program."""
    return UpstreamChecker(ast.parse(source)).run()
