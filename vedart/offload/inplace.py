"""The parameters a function's code may write into in place, read from its source.

On the CPU path a function that writes into an argument array (``x -= x.mean()``,
``x[x < 0] = 0``, ``np.clip(x, 0, 1, out=x)``, ``x.sort()``) changes the caller's array; on
the GPU path it writes into the device copy. :func:`found_writes` finds such writes so that
the GPU path copies those arguments back, as it does for ``writes=``.

What counts as a write into a parameter ``x``, or into a name that may hold ``x`` or a view of
it at that point (``y = x``, ``y = x[1:]``, ``y = x.T``, ``y = np.reshape(x, ...)``, ``a, b =
np.split(x, 2)``, ``y = np.asarray(x)``, ``for row in x``, ``for i, row in enumerate(x)``,
``[row.sort() for row in x]``, ``d = {"x": x}``):

- an augmented assignment to the name (``x += 1``: in place for an array);
- an assignment into an item or slice of it, or to an attribute that writes into an array
  (``x[i] = v``, ``x[m] += 1``, ``x.real[:] = 0``, ``x.imag += 1``);
- ``out=`` or ``output=`` naming it (``np.add(a, b, out=x)``, ``out=(x,)``, ``out=x[1:]``,
  SciPy's ``ndimage.gaussian_filter(x, 2, output=x)``), a NumPy ufunc's outputs given by
  position (``np.multiply(y, 2, x)``) and the ``out`` position of ``np.dot``, ``np.clip``,
  ``np.round``, ``np.cumsum`` and the reductions (``np.clip(x, 0, 1, x)``);
- a method that changes an array's values (``x.sort()``, ``x.fill(0)``, ``x.put(i, v)``,
  ...); a NumPy function that changes its first argument (``np.copyto(x, v)``,
  ``np.copyto(dst=x, src=v)``, ``np.put``, ``np.place``, ``np.putmask``,
  ``np.fill_diagonal``, ``np.put_along_axis``, ``np.add.at(x, i, v)``), a generator's
  ``shuffle(x)``, and ``np.nan_to_num(x, copy=False)``;
- a helper called by name (a function of the module's or imported by name, not NumPy's,
  SciPy's, CuPy's or vedart's; ``HELPER_DEPTH`` calls deep) or defined inside, writing into
  the parameter the call passes the array to.

Names are followed in order through assignments (``:=`` too), branches and loops: a name
rebound to a new array (``x = x - x.mean()``) no longer holds the parameter, an index that
copies (``v = x[x > 0]``, ``x[[0, 2]]``, ``x[~m]``) holds none, and after ``if``/``else`` a
name holds what either branch left.

A step that copies an array only for its layout (``x.reshape(-1)``, ``np.ravel``,
``np.ascontiguousarray``, ``np.asarray(x, dtype=...)``, ``x.astype(t, copy=False)``) copies a
non-contiguous or byte-swapped argument on the CPU, where its device copy (contiguous and in
native byte order) is not copied: parameters written into only through such a step are
``through_copies``, and the GPU path leaves calls with such arguments on the CPU.

What this cannot see, and so does not copy back: writes made by methods and by functions
reached otherwise (``obj.fill(x)``, ``module.fill(x)``, one passed in), writes into the arrays
in a list, dict or tuple argument (its items are not parameters), changes of an array's shape
or dtype (``x.shape = s``, ``x.resize(n)``), and functions without source (made by ``exec``,
or a lambda sharing its line with another).
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import textwrap
import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

# Array methods that change the array they are called on.
MUTATING_METHODS = frozenset({
    "sort", "fill", "put", "itemset", "partition", "setfield", "byteswap"})
# NumPy functions that change their first argument, with its keyword name.
FIRST_ARGUMENT_WRITERS = {
    "copyto": "dst", "put": "a", "place": "arr", "putmask": "a", "fill_diagonal": "a",
    "put_along_axis": "arr"}
# The position of ``out`` among NumPy functions' positional parameters (not ufuncs').
POSITIONAL_OUT = {
    "dot": 2, "clip": 3, "round": 2, "around": 2, "cumsum": 3, "cumprod": 3, "sum": 3,
    "prod": 3, "mean": 3, "std": 3, "var": 3, "max": 2, "min": 2, "amax": 2, "amin": 2,
    "any": 2, "all": 2, "take": 3, "trace": 5, "compress": 3}
# Attributes of an array whose assignment writes into the array (``x.real = 0``). (Those that
# change its shape or dtype, ``x.shape = s``, are not copied back: the copy would not fit.)
WRITABLE_ATTRIBUTES = frozenset({"real", "imag", "flat"})
# Attributes and methods of an array that are views of it.
VIEW_ATTRIBUTES = frozenset({"T", "mT", "real", "imag", "flat"})
VIEW_METHODS = frozenset({"view", "transpose", "swapaxes", "squeeze", "diagonal", "getfield"})
# Methods and NumPy functions that copy an array only for its layout or dtype (see the
# module docstring): the argument itself where nothing needs copying.
LAYOUT_METHODS = frozenset({"reshape", "ravel"})
LAYOUT_FUNCTIONS = frozenset({
    "asarray", "asanyarray", "ascontiguousarray", "asfortranarray", "require", "reshape",
    "ravel"})
# NumPy functions whose results are views of their first argument.
VIEW_FUNCTIONS = frozenset({
    "transpose", "swapaxes", "moveaxis", "rollaxis", "squeeze", "expand_dims", "atleast_1d",
    "atleast_2d", "atleast_3d", "real", "imag", "diagonal", "matrix_transpose",
    "permute_dims", "split", "array_split", "hsplit", "vsplit", "dsplit", "flip", "flipud",
    "fliplr", "rot90", "broadcast_arrays"})
# Builtins whose items are their arguments' items (rows of an array are views of it).
ITEM_BUILTINS = frozenset({
    "enumerate", "zip", "reversed", "iter", "list", "tuple", "sorted", "filter", "next"})
HELPER_DEPTH = 3  # calls below the function whose helpers' writes are followed
# Packages whose functions are not read as helpers: their writes are the calls listed above.
LIBRARIES = frozenset({"numpy", "scipy", "cupy", "cupyx", "vedart"})
_TRY = (ast.Try, getattr(ast, "TryStar", ast.Try))  # (try/except* from Python 3.11)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_LOOP_PASSES = 8  # a loop body is walked until what its names hold stops growing, at most
_UNWRAP = 16  # partials, bound methods and wrappers looked through, at most

# What a name may hold: marks of the parameters it may be or be a view of, "x"; "~x" where a
# layout step may have copied it (a device copy's would not have).
_Holds = dict[str, frozenset[str]]
_NOTHING: frozenset[str] = frozenset()
_COPIED = "~"


@dataclass(frozen=True)
class FoundWrites:
    """What :func:`found_writes` found: ``names``, the parameters written into, in signature
    order; ``through_copies``, those written into only through a layout step (see the module
    docstring); ``code``, the code read (None: nothing read)."""

    names: tuple[str, ...] = ()
    through_copies: frozenset[str] = frozenset()
    code: types.CodeType | None = None


def analysed_function(func: object) -> types.FunctionType | None:
    """The plain function whose code runs for ``func``: ``func`` itself, or the function a
    ``functools.partial``, a bound method or a ``functools.wraps`` wrapper runs."""
    for _ in range(_UNWRAP):
        if isinstance(func, functools.partial):
            func = func.func
        elif isinstance(func, types.MethodType):
            func = func.__func__
        elif type(func) is types.FunctionType and \
                type(getattr(func, "__wrapped__", None)) is types.FunctionType:
            func = func.__wrapped__
        else:
            break
    return func if type(func) is types.FunctionType else None


def found_writes(func: object) -> FoundWrites:
    """The parameters of the function ``func`` runs (:func:`analysed_function`) that its code
    may write into in place (see the module docstring). Never raises: what cannot be read is
    taken as writing nothing."""
    function = analysed_function(func)
    if function is None:
        return FoundWrites()
    try:
        written, copied = _written(function, HELPER_DEPTH, set())
    except Exception:  # noqa: BLE001  # (RecursionError of a deep tree, an odd source file)
        return FoundWrites(code=function.__code__)
    return FoundWrites(written, frozenset(copied), function.__code__)


def _written(func: types.FunctionType, depth: int, reading: set[types.CodeType]
             ) -> tuple[tuple[str, ...], set[str]]:
    """The parameters ``func`` writes into, and those of them written only through a layout
    step, following helpers ``depth`` calls deeper; ``reading``: the code of the functions
    being read (a helper calling back is not read again)."""
    node = _definition(func)
    if node is None:
        return (), set()
    parameters = _parameters(node)
    reading.add(func.__code__)
    finder = _Writes(func, depth, reading)
    finder.body(node.body if isinstance(node.body, list) else [ast.Expr(node.body)],
                {name: frozenset({name}) for name in parameters})
    reading.discard(func.__code__)
    written = tuple(name for name in parameters
                    if name in finder.written or _COPIED + name in finder.written)
    return written, {name for name in written if name not in finder.written}


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    return [argument.arg for argument in (
        *node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]


def _definition(func: types.FunctionType) -> ast.FunctionDef | ast.AsyncFunctionDef | \
        ast.Lambda | None:
    """The syntax tree of ``func``'s definition, or None without source."""
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a lambda's lines, cut out of a larger expression
        return None
    code = func.__code__
    kinds = (ast.Lambda,) if code.co_name == "<lambda>" else (
        ast.FunctionDef, ast.AsyncFunctionDef)
    found = [node for node in ast.walk(tree) if isinstance(node, kinds) and
             (code.co_name == "<lambda>" or node.name == code.co_name)]
    # The outermost definition of that name is the function; a lambda only when alone.
    return found[0] if found and (len(found) == 1 or code.co_name != "<lambda>") else None


def _called_name(node: ast.Call) -> str | None:
    """The name a call calls: ``f`` of ``f(...)`` and of ``module.f(...)``."""
    function = node.func
    return function.attr if isinstance(function, ast.Attribute) else \
        function.id if isinstance(function, ast.Name) else None


def _copied(marks: frozenset[str]) -> frozenset[str]:
    """``marks`` as a layout step leaves them (maybe copied)."""
    return frozenset(mark if mark.startswith(_COPIED) else _COPIED + mark for mark in marks)


def _copies(index: ast.expr) -> bool:
    """Whether indexing with ``index`` certainly copies (a boolean mask or a list of
    indices: ``x[x > 0]``, ``x[[0, 2]]``, ``x[~m]``, ``x[a & b]``); a name may be an
    integer, so ``x[i]`` may be a view."""
    if isinstance(index, ast.Tuple):
        return any(_copies(element) for element in index.elts)
    return isinstance(index, (ast.Compare, ast.List, ast.ListComp)) or (
        isinstance(index, ast.UnaryOp) and isinstance(index.op, (ast.Invert, ast.Not))) or (
        isinstance(index, ast.BinOp) and isinstance(index.op, (ast.BitAnd, ast.BitOr,
                                                               ast.BitXor)))


def _never_copies(node: ast.Call) -> bool:
    copy = next((keyword.value for keyword in node.keywords if keyword.arg == "copy"), None)
    return isinstance(copy, ast.Constant) and copy.value is False


def _asks_a_copy(node: ast.Call) -> bool:
    copy = next((keyword.value for keyword in node.keywords if keyword.arg == "copy"), None)
    return copy is not None and not (isinstance(copy, ast.Constant) and copy.value in (
        False, None))


def _join(first: _Holds, second: _Holds) -> _Holds:
    joined = dict(first)
    for name, held in second.items():
        joined[name] = joined.get(name, _NOTHING) | held
    return joined


class _Writes:
    """Walks ``func``'s statements in order with what each name may hold, collecting the
    marks written into (``written``), and reading the helpers it calls by name ``depth``
    calls deeper."""

    def __init__(self, func: types.FunctionType, depth: int,
                 reading: set[types.CodeType]) -> None:
        self.written: set[str] = set()
        self._func = func
        self._depth = depth
        self._reading = reading
        # Functions defined inside: name -> (positional parameters, written, through copies).
        self._inner: dict[str, tuple[tuple[str, ...], set[str], set[str]]] = {}

    def body(self, statements: Iterable[ast.stmt], holds: _Holds) -> _Holds:
        for statement in statements:
            holds = self.statement(statement, holds)
        return holds

    def statement(self, node: ast.stmt, holds: _Holds) -> _Holds:
        for child in ast.iter_child_nodes(node):  # names bound by := in its expressions
            if isinstance(child, ast.expr):
                holds = self.walrus(child, holds)
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            if node.value is None:
                return holds
            self.scan(node.value, holds)
            held = self.held(node.value, holds)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                holds = self.assign(target, node.value, held, holds)
            return holds
        if isinstance(node, ast.AugAssign):
            self.scan(node.value, holds)
            self.write(node.target, holds)
            return holds
        if isinstance(node, (ast.For, ast.AsyncFor)):
            self.scan(node.iter, holds)
            entry = self.iterate(node.target, node.iter, holds)
            looped = self.loop(node.body, entry)
            return _join(looped, self.body(node.orelse, looped))  # (a break skips the else)
        if isinstance(node, ast.While):
            self.scan(node.test, holds)
            looped = self.loop(node.body, holds)
            return _join(looped, self.body(node.orelse, looped))
        if isinstance(node, ast.If):
            self.scan(node.test, holds)
            return _join(self.body(node.body, holds), self.body(node.orelse, holds))
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self.scan(item.context_expr, holds)
                if item.optional_vars is not None:
                    holds = self.assign(item.optional_vars, None, _NOTHING, holds)
            return self.body(node.body, holds)
        if isinstance(node, _TRY):
            tried = self.loop(node.body, holds)  # a handler may start from any point in it
            ends = [self.body(handler.body, tried) for handler in node.handlers]
            ends.append(self.body(node.orelse, tried))
            end = ends[0]
            for other in ends[1:]:
                end = _join(end, other)
            return self.body(node.finalbody, end)
        if isinstance(node, ast.Match):
            self.scan(node.subject, holds)
            end = holds
            for case in node.cases:
                end = _join(end, self.body(case.body, holds))
            return end
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.inner(node, holds)
            return {**holds, node.name: _NOTHING}
        if isinstance(node, ast.ClassDef):
            self.body(node.body, holds)
            return {**holds, node.name: _NOTHING}
        if isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    holds = {**holds, target.id: _NOTHING}
            return holds
        for child in ast.iter_child_nodes(node):  # Expr, Return, Raise, Assert, ...
            if isinstance(child, ast.expr):
                self.scan(child, holds)
        return holds

    def loop(self, statements: list[ast.stmt], holds: _Holds) -> _Holds:
        """What names may hold after a loop body run any number of times from ``holds``."""
        for _ in range(_LOOP_PASSES):
            after = _join(holds, self.body(statements, holds))
            if after == holds:
                break
            holds = after
        return holds

    def inner(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
              holds: _Holds) -> None:
        """A function defined inside: it may write into what the names it closes over hold
        when it runs (taken as what they hold where it is defined), and into what a call
        passes it (kept for such calls, when it has a name)."""
        own = _parameters(node)
        for extra in (node.args.vararg, node.args.kwarg):
            if extra is not None:
                own.append(extra.arg)
        prefix = f"@{id(node)}:"  # its own parameters' marks, apart from the outer ones
        inside = {**holds, **{name: frozenset({prefix + name}) for name in own}}
        if isinstance(node, ast.Lambda):
            self.scan(node.body, inside)
        else:
            self.body(node.body, inside)
        mine = {mark for mark in self.written if prefix in mark}
        self.written -= mine
        if not isinstance(node, ast.Lambda):
            positional = tuple(argument.arg for argument in (*node.args.posonlyargs,
                                                             *node.args.args))
            self._inner[node.name] = (
                positional, {mark.partition(":")[2] for mark in mine if mark[0] != _COPIED},
                {mark.partition(":")[2] for mark in mine if mark[0] == _COPIED})

    def assign(self, target: ast.expr, value: ast.expr | None, held: frozenset[str],
               holds: _Holds) -> _Holds:
        """``holds`` after ``target = value`` (``value`` None: unknown), where ``value`` may
        hold ``held``."""
        if isinstance(target, ast.Name):
            return {**holds, target.id: held}
        if isinstance(target, (ast.Tuple, ast.List)):
            parts = value.elts if isinstance(value, (ast.Tuple, ast.List)) and \
                len(value.elts) == len(target.elts) and \
                not any(isinstance(part, ast.Starred) for part in target.elts) else None
            for index, element in enumerate(target.elts):
                part = None if parts is None else parts[index]
                holds = self.assign(element, part,
                                    held if part is None else self.held(part, holds), holds)
            return holds
        if isinstance(target, ast.Starred):
            return self.assign(target.value, None, held, holds)
        self.write(target, holds)  # x[i] = v, x.real = v
        return holds

    def iterate(self, target: ast.expr, iterated: ast.expr, holds: _Holds) -> _Holds:
        """``holds`` after ``for target in iterated``: an item of ``zip(a, b)`` holds what an
        item of ``a`` and one of ``b`` do, one of ``enumerate(a)`` a number and an item of
        ``a``; any other item, what ``iterated`` holds."""
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(iterated, ast.Call) and \
                isinstance(iterated.func, ast.Name) and not iterated.keywords and \
                not any(isinstance(each, ast.Starred)
                        for each in (*iterated.args, *target.elts)):
            parts = list(iterated.args) if iterated.func.id == "zip" else \
                [None, iterated.args[0]] if iterated.func.id == "enumerate" and \
                len(iterated.args) == 1 else None
            if parts is not None and len(parts) == len(target.elts):
                for element, part in zip(target.elts, parts):
                    holds = self.assign(element, None, _NOTHING if part is None else
                                        self.held(part, holds), holds)
                return holds
        return self.assign(target, None, self.held(iterated, holds), holds)

    def write(self, target: ast.expr, holds: _Holds) -> None:
        """Note a write into what ``target`` (of an assignment into it) holds: a name's
        value for ``x += 1``, what a subscript is taken of for ``x[i] = v``, and the array
        whose ``real``, ``imag`` or ``flat`` is set (``self.coef = v`` writes into no
        array)."""
        self.scan(target, holds)
        if isinstance(target, ast.Attribute) and target.attr not in WRITABLE_ATTRIBUTES:
            return
        if isinstance(target, (ast.Subscript, ast.Attribute)):
            target = target.value
        self.written.update(self.held(target, holds))

    def walrus(self, node: ast.expr, holds: _Holds) -> _Holds:
        """``holds`` with the names ``node`` binds with ``:=``."""
        for child in ast.walk(node):
            if isinstance(child, ast.NamedExpr) and isinstance(child.target, ast.Name):
                holds = {**holds, child.target.id: self.held(child.value, holds)}
        return holds

    def held(self, node: ast.expr, holds: _Holds) -> frozenset[str]:
        """The marks of the parameters the value of ``node`` may be, or be a view of."""
        if isinstance(node, ast.Name):
            return holds.get(node.id, _NOTHING)
        if isinstance(node, ast.Subscript):
            return _NOTHING if _copies(node.slice) else self.held(node.value, holds)
        if isinstance(node, ast.Attribute):
            return self.held(node.value, holds) if node.attr in VIEW_ATTRIBUTES else _NOTHING
        if isinstance(node, ast.Call):
            return self.held_by_call(node, holds)
        if isinstance(node, ast.IfExp):
            return self.held(node.body, holds) | self.held(node.orelse, holds)
        if isinstance(node, ast.BoolOp):
            return frozenset().union(*(self.held(value, holds) for value in node.values))
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return frozenset().union(*(self.held(value, holds) for value in node.elts))
        if isinstance(node, ast.Dict):
            return frozenset().union(*(self.held(value, holds) for value in node.values))
        if isinstance(node, (ast.Starred, ast.NamedExpr)):
            return self.held(node.value, holds)
        return _NOTHING

    def held_by_call(self, node: ast.Call, holds: _Holds) -> frozenset[str]:
        function = node.func
        if isinstance(function, ast.Attribute):
            receiver = self.held(function.value, holds)
            if receiver:  # a method of what may be the array
                if function.attr in VIEW_METHODS:
                    return receiver
                if function.attr in LAYOUT_METHODS or (
                        function.attr == "astype" and _never_copies(node)):
                    return _copied(receiver)
                return _NOTHING
        name = _called_name(node)
        first = node.args[0] if node.args and not isinstance(node.args[0], ast.Starred) \
            else None
        if first is None:
            return _NOTHING
        if name in VIEW_FUNCTIONS:
            return self.held(first, holds)
        if (name in LAYOUT_FUNCTIONS and not _asks_a_copy(node)) or (
                name == "array" and _never_copies(node)):
            return _copied(self.held(first, holds))
        if name in ITEM_BUILTINS and isinstance(function, ast.Name):
            return frozenset().union(*(self.held(argument, holds) for argument in node.args))
        return _NOTHING

    def scan(self, node: ast.expr, holds: _Holds) -> None:
        """Note the writes an expression makes by calling (``out=``, mutating methods and
        functions, helpers) and in the functions and comprehensions it holds."""
        if isinstance(node, ast.Lambda):
            self.inner(node, holds)
            return
        if isinstance(node, _COMPREHENSIONS):
            inside = holds
            for generator in node.generators:
                self.scan(generator.iter, inside)
                inside = self.iterate(generator.target, generator.iter, inside)
                for condition in generator.ifs:
                    self.scan(condition, inside)
            parts = (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)
            for part in parts:
                self.scan(part, inside)
            return
        if isinstance(node, ast.Call):
            self.call(node, holds)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.keyword):
                child = child.value
            if isinstance(child, ast.expr):
                self.scan(child, holds)

    def resolve(self, node: ast.expr) -> Any:
        """What a dotted name read from ``func``'s globals or the builtins is (``np.add``,
        ``ndimage.convolve``), or None (a local, an attribute of anything but a module or
        a ufunc)."""
        if isinstance(node, ast.Name):
            code = self._func.__code__
            if node.id in code.co_varnames or node.id in code.co_freevars:
                return None
            found = self._func.__globals__.get(node.id, _ABSENT)
            return getattr(builtins, node.id, None) if found is _ABSENT else found
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if isinstance(base, (types.ModuleType, np.ufunc)):
                return getattr(base, node.attr, None)
        return None

    def call(self, node: ast.Call, holds: _Holds) -> None:
        for keyword in node.keywords:
            if keyword.arg in ("out", "output"):
                self.written.update(self.held(keyword.value, holds))
        function, name = node.func, _called_name(node)
        if isinstance(function, ast.Attribute) and name in MUTATING_METHODS:
            self.written.update(self.held(function.value, holds))
        if name == "shuffle" and node.args:  # a Generator's, or NumPy's legacy one
            self.written.update(self.held(node.args[0], holds))
        if name == "nan_to_num" and node.args and _never_copies(node):
            self.written.update(self.held(node.args[0], holds))
        called = self.resolve(function)
        if isinstance(called, np.ufunc):
            for output in node.args[called.nin:]:
                self.written.update(self.held(output, holds))
        elif called is not None and getattr(called, "__name__", None) == "at" and \
                isinstance(getattr(called, "__self__", None), np.ufunc) and node.args:
            self.written.update(self.held(node.args[0], holds))  # np.add.at(x, i, v)
        elif str(getattr(called, "__module__", "")).partition(".")[0] == "numpy":
            self.numpy_call(node, getattr(called, "__name__", ""), holds)
        elif isinstance(function, ast.Name):
            self.helper(function.id, node, holds)

    def numpy_call(self, node: ast.Call, name: str, holds: _Holds) -> None:
        """The writes of NumPy's function ``name`` into what this call passes it."""
        keyword = FIRST_ARGUMENT_WRITERS.get(name)
        if keyword is not None:
            for argument in (*node.args[:1], *(each.value for each in node.keywords
                                               if each.arg == keyword)):
                self.written.update(self.held(argument, holds))
        position = POSITIONAL_OUT.get(name)
        if position is not None and len(node.args) > position:
            self.written.update(self.held(node.args[position], holds))

    def helper(self, name: str, node: ast.Call, holds: _Holds) -> None:
        """Note the writes of the helper ``name`` (defined inside, or a module-level
        function of the user's found in ``func``'s globals) into what this call passes
        it."""
        if name in self._inner:
            positional, written, copied = self._inner[name]
        else:
            code = self._func.__code__
            helper = self._func.__globals__.get(name)
            if self._depth <= 0 or name in code.co_varnames or name in code.co_freevars or \
                    type(helper) is not types.FunctionType or \
                    helper.__code__ in self._reading or \
                    str(getattr(helper, "__module__", "")).partition(".")[0] in LIBRARIES:
                return
            found, through = _written(helper, self._depth - 1, self._reading)
            positional = helper.__code__.co_varnames[:helper.__code__.co_argcount]
            written, copied = set(found) - through, through
        if not written and not copied:
            return
        passed = [(positional[index], argument) for index, argument in enumerate(
            node.args[:len(positional)])]
        starred = next((index for index, argument in enumerate(node.args)
                        if isinstance(argument, ast.Starred)), len(node.args))
        passed = passed[:starred] + [(keyword.arg, keyword.value) for keyword in node.keywords
                                     if keyword.arg is not None]
        for parameter, argument in passed:
            if parameter in written:
                self.written.update(self.held(argument, holds))
            elif parameter in copied:
                self.written.update(_copied(self.held(argument, holds)))


_ABSENT = object()
