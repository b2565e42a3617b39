"""What SGLang's DFLASH worker uses of its draft model, read from the installed worker's source.

`worker_uses(module)` parses the module (no execution) and records, for three kinds of object,
every attribute the code reads and every method call's shape:

* the draft model: any expression ending in `draft_model` (`self.draft_model`, a `draft_model`
  parameter, `bundle.draft_model`), and `getattr`/`hasattr` on it (recorded as optional);
* its decoder layers: loop variables over, and indexing of, `<draft model>.layers`;
* their attention modules: `<layer>.self_attn`, and names assigned from such an expression
  (`attn = layer.self_attn`); plus attributes of `<attention>.attn` (SGLang's RadixAttention).

The tests compare the result with this project's class (and SGLang's own DFlashDraftModel, for
signatures), so a new call in a future SGLang fails them until the adapter provides it.
"""

from __future__ import annotations

import ast
import inspect
from collections import defaultdict
from dataclasses import dataclass, field

MODEL, LAYER, ATTENTION, RADIX = "model", "layer", "attention", "radix attention"


@dataclass
class Call:
    positional: int
    keywords: tuple[str, ...]
    line: int


@dataclass
class Uses:
    attributes: dict[str, dict[str, list[int]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))  # kind -> name -> lines
    optional: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    calls: dict[str, dict[str, list[Call]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))

    def names(self, kind: str) -> set[str]:
        return set(self.attributes[kind])


def _is_model(node) -> bool:
    return ((isinstance(node, ast.Name) and node.id == "draft_model")
            or (isinstance(node, ast.Attribute) and node.attr == "draft_model"))


class _Scanner(ast.NodeVisitor):
    def __init__(self):
        self.uses = Uses()
        self.layer_lists: set[str] = set()  # names bound to `<draft model>.layers`
        self.layer_names: set[str] = set()
        self.attention_names: set[str] = set()

    # -- what kind of object an expression is -------------------------------------------------
    def is_layer_list(self, node) -> bool:
        return ((isinstance(node, ast.Attribute) and node.attr == "layers"
                 and self.kind_of(node.value) == MODEL)
                or (isinstance(node, ast.Name) and node.id in self.layer_lists))

    def kind_of(self, node) -> str | None:
        if _is_model(node):
            return MODEL
        if isinstance(node, ast.Name):
            if node.id in self.layer_names:
                return LAYER
            if node.id in self.attention_names:
                return ATTENTION
        if isinstance(node, ast.Subscript) and self.is_layer_list(node.value):
            return LAYER
        if isinstance(node, ast.Attribute):
            if node.attr == "self_attn" and self.kind_of(node.value) == LAYER:
                return ATTENTION
            if node.attr == "attn" and self.kind_of(node.value) == ATTENTION:
                return RADIX
        return None

    # -- bindings --------------------------------------------------------------------------------
    def visit_FunctionDef(self, node):
        saved = set(self.layer_lists), set(self.layer_names), set(self.attention_names)
        self.generic_visit(node)
        self.layer_lists, self.layer_names, self.attention_names = saved

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_For(self, node):
        target, source = node.target, node.iter
        if isinstance(source, ast.Call) and getattr(source.func, "id", None) == "enumerate" \
                and source.args and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            target, source = target.elts[1], source.args[0]
        if isinstance(target, ast.Name) and self.is_layer_list(source):
            self.layer_names.add(target.id)
        self.generic_visit(node)

    def visit_Assign(self, node):
        self.visit(node.value)
        kind = self.kind_of(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                if kind == ATTENTION:
                    self.attention_names.add(target.id)
                elif kind == LAYER:
                    self.layer_names.add(target.id)
                elif self.is_layer_list(node.value):
                    self.layer_lists.add(target.id)
            self.visit(target)

    # -- uses ------------------------------------------------------------------------------------
    def visit_Attribute(self, node):
        kind = self.kind_of(node.value)
        if kind is not None:
            self.uses.attributes[kind][node.attr].append(node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute) and self.kind_of(func.value) is not None:
            keywords = tuple(k.arg for k in node.keywords if k.arg)
            self.uses.calls[self.kind_of(func.value)][func.attr].append(
                Call(len(node.args), keywords, node.lineno))
        if isinstance(func, ast.Name) and func.id in ("getattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            kind = self.kind_of(node.args[0])
            if kind is not None:
                self.uses.optional[kind].add(node.args[1].value)
        self.generic_visit(node)


def worker_uses(module) -> Uses:
    scanner = _Scanner()
    scanner.visit(ast.parse(inspect.getsource(module)))
    return scanner.uses


def signature_shape(func) -> list[tuple[str, str, bool]]:
    """(name, kind, has default) of each parameter but `self`; annotations are ignored."""
    params = list(inspect.signature(func).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [(p.name, p.kind.name, p.default is not inspect.Parameter.empty) for p in params]


def accepts(func, call: Call) -> bool:
    """Would `func` (bound) accept a call with this many positional args and these keywords?"""
    try:
        inspect.signature(func).bind(*range(call.positional), **{k: None for k in call.keywords})
    except TypeError:
        return False
    return True
