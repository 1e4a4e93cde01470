"""The parameters a function's code may write into in place, read from its source.

On the CPU path a function that writes into an argument array (``x -= x.mean()``,
``x[x < 0] = 0``, ``np.clip(x, 0, 1, out=x)``, ``x.sort()``) changes the caller's array; on
the GPU path it writes into the device copy. :func:`found_writes` finds such writes so that
the GPU path copies those arguments back, as it does for ``writes=``.

What counts as a write into a parameter ``x``, or into a name that may hold ``x`` or a view of
it at that point (``y = x``, ``y = x[1:]``, ``y = x.T``, ``y = np.reshape(x, ...)``, ``a, b =
np.split(x, 2)``, ``y = np.asarray(x)``, ``for row in x``, ``for i, row in enumerate(x)``,
``[row.sort() for row in x]``, ``d = {"x": x}``, ``bufs.append(x)``, ``y = interior(x)`` of
a helper returning a view of what it is passed; a list, dict or tuple parameter counts as
written when the arrays it holds are, ``for p in params: p -= step``):

- an augmented assignment to the name (``x += 1``: in place for an array);
- an assignment into an item or slice of it, or to an attribute that writes into an array
  (``x[i] = v``, ``x[m] += 1``, ``x.real[:] = 0``, ``x.imag += 1``);
- ``out=`` or ``output=`` naming it (``np.add(a, b, out=x)``, ``out=(x,)``, ``out=x[1:]``,
  SciPy's ``ndimage.gaussian_filter(x, 2, output=x)``), a NumPy ufunc's outputs given by
  position (``np.multiply(y, 2, x)``) and the ``out`` position of ``np.dot``, ``np.clip``,
  ``np.round``, ``np.cumsum`` and the reductions (``np.clip(x, 0, 1, x)``);
- a method that changes an array's values (``x.sort()``, ``x.fill(0)``, ``x.put(i, v)``,
  ``x.byteswap(inplace=True)``, ...); a NumPy function that changes its first argument
  (``np.copyto(x, v)``, ``np.copyto(dst=x, src=v)``, ``np.put``, ``np.place``,
  ``np.putmask``, ``np.fill_diagonal``, ``np.put_along_axis``, ``np.add.at(x, i, v)``), a
  generator's ``shuffle(x)``, and ``np.nan_to_num(x, copy=False)``;
- a helper called by name (a function of the module's or imported by name, decorated with
  ``@veda.gpu`` or not, but not NumPy's, SciPy's, CuPy's or vedart's; ``HELPER_DEPTH`` calls
  deep) or defined inside (a ``def``, or a lambda bound to a name), writing into the
  parameter the call passes the array to.

Names are followed in order through assignments (``:=`` too, and ``a, b = b, a``), branches
and loops: a name rebound to a new array (``x = x - x.mean()``) no longer holds the
parameter, an index that copies (``v = x[x > 0]``, ``x[[0, 2]]``, ``x[~np.isnan(x)]``) holds
none, and after ``if``/``else`` a name holds what either branch left.

What this cannot see, and so does not copy back: writes made by methods and by functions
reached otherwise (``obj.fill(x)``, ``module.fill(x)``, one passed in, or held by a default
or ``*args``), writes through an object holding the array (``s.data[:] = 0``), a structured
array's field assigned by name (``x["f"] = v``: read as a dict's item bound), changes of an
array's shape or dtype (``x.shape = s``, ``x.resize(n)``), the writes of a function wrapped
by another decorator than vedart's, and functions without source (made by ``exec``, or a
lambda sharing its line with another). A helper that cannot
be read (its file edited since import) is taken as writing nothing; the function's own
writes stand.
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import sys
import textwrap
import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

# Array methods that change the array they are called on.
MUTATING_METHODS = frozenset({"sort", "fill", "put", "itemset", "partition", "setfield"})
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
VIEW_METHODS = frozenset({
    "view", "transpose", "swapaxes", "squeeze", "diagonal", "getfield", "reshape", "ravel"})
# NumPy functions whose results may be their first argument or views of it.
VIEW_FUNCTIONS = frozenset({
    "asarray", "asanyarray", "ascontiguousarray", "asfortranarray", "require", "reshape",
    "ravel", "transpose", "swapaxes", "moveaxis", "rollaxis", "squeeze", "expand_dims",
    "atleast_1d", "atleast_2d", "atleast_3d", "real", "imag", "diagonal", "matrix_transpose",
    "permute_dims", "split", "array_split", "hsplit", "vsplit", "dsplit", "flip", "flipud",
    "fliplr", "rot90", "broadcast_arrays"})
# Builtins whose results hold their arguments' items (an array's rows are views of it).
ITEM_BUILTINS = frozenset({
    "enumerate", "zip", "reversed", "iter", "list", "tuple", "sorted", "filter", "next",
    "dict"})
# Methods of lists and dicts that hand out what they hold, and those that take in more.
HOLDER_GETTERS = frozenset({"values", "items", "get", "pop", "setdefault"})
HOLDER_ADDERS = frozenset({"append", "extend", "insert", "add", "update"})
HELPER_DEPTH = 3  # calls below the function whose helpers are read
# Packages whose functions are not read as helpers: their writes are the calls listed above.
LIBRARIES = frozenset({"numpy", "scipy", "cupy", "cupyx", "vedart"})
_TRY = (ast.Try, getattr(ast, "TryStar", ast.Try))  # (try/except* from Python 3.11)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_LOOP_PASSES = 8  # a loop body is walked until what its names hold stops growing, at most
_UNWRAP = 16  # partials, bound methods and wrappers looked through, at most

# What a name may hold: the marks of the parameters it may be or be a view of (a parameter's
# name; "@<definition>:<name>" for a parameter of a function defined inside).
_Holds = dict[str, frozenset[str]]
_NOTHING: frozenset[str] = frozenset()
_ABSENT = object()
_CLOSED = "$"  # the mark of a name a function defined inside closes over


@dataclass(frozen=True)
class _Reading:
    """What one function does with its parameters: those it writes into, those it may return
    (or return a view of), and its positional ones in order."""

    written: frozenset[str] = frozenset()
    returned: frozenset[str] = frozenset()
    positional: tuple[str, ...] = ()
    closed_over: frozenset[str] = frozenset()  # names of the enclosing function written into


def analysed_function(func: object) -> types.FunctionType | None:
    """The plain function whose code runs for ``func``: ``func`` itself, or the function a
    ``functools.partial``, a bound method or a ``@veda.gpu`` wrapper runs (another
    decorator's wrapper may change what it passes on: it is not looked through)."""
    for _ in range(_UNWRAP):
        if isinstance(func, functools.partial):
            func = func.func
        elif isinstance(func, types.MethodType):
            func = func.__func__
        elif type(func) is types.FunctionType and hasattr(func, "gpu_options") and \
                type(getattr(func, "__wrapped__", None)) is types.FunctionType:
            func = func.__wrapped__
        else:
            break
    return func if type(func) is types.FunctionType else None


def found_writes(func: object) -> tuple[str, ...]:
    """The names of the parameters of the function ``func`` runs (:func:`analysed_function`)
    that its code may write into in place (see the module docstring), in signature order.
    Never raises: what cannot be read is taken as writing nothing."""
    function = analysed_function(func)
    if function is None:
        return ()
    code = function.__code__
    written = _read(function, HELPER_DEPTH, {}).written
    return tuple(name for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
                 if name in written)


def _read(func: types.FunctionType, depth: int,
          reading: dict[int, tuple[types.FunctionType, int, _Reading | None]]) -> _Reading:
    """What ``func`` does with its parameters, reading its helpers ``depth`` calls deeper;
    ``reading``: the functions read so far in this :func:`found_writes`, by id, with the
    depth each was read from (None while being read: a helper calling back reads as doing
    nothing). A function that cannot be read (no source, a file edited since import, a tree
    too deep) does nothing."""
    known = reading.get(id(func))
    if known is not None and known[0] is func and (known[2] is None or known[1] >= depth):
        return known[2] or _Reading()
    reading[id(func)] = (func, depth, None)
    try:
        node = _definition(func)
        if node is None:
            result = _Reading()
        else:
            finder = _Writes(func, depth, reading)
            finder.returns(node, {name: frozenset({name}) for name in _parameters(node)})
            result = _Reading(frozenset(finder.written), frozenset(finder.returned),
                              _positional(node))
    except Exception:  # noqa: BLE001  # (RecursionError, tokenize.TokenError, ...)
        result = _Reading()
    reading[id(func)] = (func, depth, result)
    return result


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    return [*_positional(node), *(argument.arg for argument in node.args.kwonlyargs)]


def _positional(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> tuple[str, ...]:
    return tuple(argument.arg for argument in (*node.args.posonlyargs, *node.args.args))


def _package(value: Any) -> str:
    """The top-level package of the module ``value`` was defined in ("" if none)."""
    return str(getattr(value, "__module__", "")).partition(".")[0]


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


def _is_array_valued(node: ast.expr) -> bool:
    """Whether ``node`` is certainly an array or list, not an integer (``x > 0``,
    ``np.isnan(x)``, ``[0, 2]``)."""
    return isinstance(node, (ast.Compare, ast.Call, ast.List, ast.ListComp))


def _copies(index: ast.expr) -> bool:
    """Whether indexing with ``index`` certainly copies (a boolean mask or a list of
    indices: ``x[x > 0]``, ``x[[0, 2]]``, ``x[~np.isnan(x)]``, ``x[(a > 0) & (b > 0)]``); a
    name, or ``~k`` of one, may be an integer, so ``x[i]`` may be a view."""
    if isinstance(index, ast.Tuple):
        return any(_copies(element) for element in index.elts)
    if isinstance(index, (ast.Compare, ast.List, ast.ListComp)):
        return True
    if isinstance(index, ast.UnaryOp) and isinstance(index.op, (ast.Invert, ast.Not)):
        return _is_array_valued(index.operand)
    if isinstance(index, ast.BinOp) and isinstance(index.op, (ast.BitAnd, ast.BitOr,
                                                               ast.BitXor)):
        return _is_array_valued(index.left) or _is_array_valued(index.right)
    return False


def _is_container(node: ast.expr) -> bool:
    """Whether ``node`` makes a list, tuple, dict or set (whose ``+=`` adds items)."""
    return isinstance(node, (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp,
                             ast.DictComp, ast.SetComp)) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
        node.func.id in ("list", "tuple", "dict", "set"))


def _is_keyed_item(target: ast.expr) -> bool:
    """Whether ``target`` is an item of a dict named by a string (``state["w"]``): binding
    it writes into no array (a structured array's field, ``x["f"] = v``, is taken as such)."""
    return isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) and \
        isinstance(target.slice.value, str)


def _keyword(node: ast.Call, name: str) -> ast.expr | None:
    return next((keyword.value for keyword in node.keywords if keyword.arg == name), None)


def _is_false(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _join(first: _Holds, second: _Holds) -> _Holds:
    joined = dict(first)
    for name, held in second.items():
        joined[name] = joined.get(name, _NOTHING) | held
    return joined


class _Writes:
    """Walks ``func``'s statements in order with what each name may hold, collecting the
    marks written into (``written``) and returned (``returned``), reading the helpers it
    calls by name ``depth`` calls deeper."""

    def __init__(self, func: types.FunctionType, depth: int,
                 reading: dict[int, tuple[types.FunctionType, int, _Reading | None]]) -> None:
        self.written: set[str] = set()
        self.returned: set[str] = set()
        self._func = func
        self._depth = depth
        self._reading = reading
        self._inner: dict[str, _Reading] = {}  # functions defined inside, by name
        self._closing = 0  # functions defined inside being walked
        self._containers: set[str] = set()  # names bound to a list, tuple, dict or set
        self._modules: dict[str, Any] = {}  # modules imported inside, by name

    def returns(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
                holds: _Holds) -> None:
        """Walk a whole function (its body, or a lambda's expression, returned)."""
        if isinstance(node, ast.Lambda):
            self.scan(node.body, holds)
            self.returned.update(self.held(node.body, holds))
        else:
            self.body(node.body, holds)

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
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if isinstance(node.value, ast.Lambda) and len(targets) == 1 and \
                    isinstance(targets[0], ast.Name):
                self.define(targets[0].id, self.inner(node.value, holds))
            held = self.held(node.value, holds)
            if _is_container(node.value):
                self._containers.update(target.id for target in targets
                                        if isinstance(target, ast.Name))
            for target in targets:
                holds = self.assign(target, node.value, held, holds)
            return holds
        if isinstance(node, ast.AugAssign):
            self.scan(node.value, holds)
            target = node.target
            if isinstance(target, ast.Name) and target.id in self._containers:  # bufs += [x]
                return {**holds, target.id: holds.get(target.id, _NOTHING) |
                        self.held(node.value, holds)}
            self.write(target, holds)
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
            end = functools.reduce(_join, ends, self.body(node.orelse, tried))
            return self.body(node.finalbody, end)
        if isinstance(node, ast.Match):
            self.scan(node.subject, holds)
            end = holds
            for case in node.cases:
                end = _join(end, self.body(case.body, holds))
            return end
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.define(node.name, self.inner(node, holds))
            return {**holds, node.name: _NOTHING}
        if isinstance(node, ast.ClassDef):
            self.body(node.body, holds)
            return {**holds, node.name: _NOTHING}
        if isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    holds = {**holds, target.id: _NOTHING}
            return holds
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return self.imported(node, holds)
        if isinstance(node, ast.Return) and node.value is not None:
            self.returned.update(self.held(node.value, holds))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            holds = self.added(node.value, holds)
        for child in ast.iter_child_nodes(node):  # Expr, Return, Raise, Assert, ...
            if isinstance(child, ast.expr):
                self.scan(child, holds)
        return holds

    def imported(self, node: ast.Import | ast.ImportFrom, holds: _Holds) -> _Holds:
        """``holds`` after an import inside the function, whose modules (those loaded
        already: nothing is imported here) calls are then resolved through."""
        for alias in node.names:
            bound = alias.asname or alias.name.partition(".")[0]
            if isinstance(node, ast.Import):
                module = sys.modules.get(alias.name if alias.asname else bound)
            else:
                source = sys.modules.get(node.module or "") if not node.level else None
                module = None if source is None else vars(source).get(alias.name)
            if module is not None:
                self._modules[bound] = module
            holds = {**holds, bound: _NOTHING}
        return holds

    def added(self, node: ast.Call, holds: _Holds) -> _Holds:
        """``holds`` after ``bufs.append(x)`` and the like: the list or dict named holds what
        was put in it too."""
        function = node.func
        if isinstance(function, ast.Attribute) and function.attr in HOLDER_ADDERS and \
                isinstance(function.value, ast.Name):
            name = function.value.id
            added = frozenset().union(*(self.held(argument, holds)
                                        for argument in (*node.args, *(
                                            keyword.value for keyword in node.keywords))))
            if added:
                return {**holds, name: holds.get(name, _NOTHING) | added}
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
              holds: _Holds) -> _Reading:
        """A function defined inside: it may write into what the names it closes over hold
        when it runs (taken as what they hold where it is defined), noted as writes of this
        function; what it writes into and returns of its own parameters is what a call of
        it passes it."""
        own = _parameters(node)
        for extra in (node.args.vararg, node.args.kwarg):
            if extra is not None:
                own.append(extra.arg)
        prefix = f"@{id(node)}:"  # its own parameters' marks, apart from the outer ones
        # A name it closes over may hold, when it runs, what it holds here, or what it
        # holds where it is called ("$name", filled in there: see passed).
        inside = {name: held | {_CLOSED + name} for name, held in holds.items()}
        inside.update({name: frozenset({prefix + name}) for name in own})
        returned_before = set(self.returned)
        self._closing += 1
        try:
            self.returns(node, inside)
        finally:
            self._closing -= 1
        mine = {mark for mark in self.written if mark.startswith(prefix)}
        closed = {mark for mark in self.written if mark.startswith(_CLOSED)}
        self.written -= mine | closed
        if self._closing:  # (an enclosing inner function resolves them)
            self.written |= closed
        returned = {mark for mark in self.returned if mark.startswith(prefix)}
        self.returned = returned_before  # (its returns are not this function's)
        return _Reading(frozenset(mark[len(prefix):] for mark in mine),
                        frozenset(mark[len(prefix):] for mark in returned), _positional(node),
                        frozenset(mark[len(_CLOSED):] for mark in closed))

    def define(self, name: str, reading: _Reading) -> None:
        """Keep what the function defined inside as ``name`` does, for calls of it (with what
        another definition of that name, in another branch, does)."""
        known = self._inner.get(name)
        if known is not None:
            reading = _Reading(known.written | reading.written, known.returned | reading.returned,
                               reading.positional if len(reading.positional) >= len(
                                   known.positional) else known.positional,
                               known.closed_over | reading.closed_over)
        self._inner[name] = reading

    def assign(self, target: ast.expr, value: ast.expr | None, held: frozenset[str],
               holds: _Holds) -> _Holds:
        """``holds`` after ``target = value`` (``value`` None: unknown), where ``value`` may
        hold ``held``. Every value is read before any target is bound: ``a, b = b, a``."""
        for leaf, leaf_held in self.unpacked(target, value, held, holds):
            if isinstance(leaf, ast.Name):
                holds = {**holds, leaf.id: leaf_held}
                continue
            if _is_keyed_item(leaf):  # state["w"] = v: a dict's item bound, no array written
                self.scan(leaf, holds)
            else:
                self.write(leaf, holds)  # x[i] = v, x.real = v
            if isinstance(leaf, ast.Subscript) and isinstance(leaf.value, ast.Name) and \
                    leaf_held:  # d["x"] = x: the dict holds x too
                name = leaf.value.id
                holds = {**holds, name: holds.get(name, _NOTHING) | leaf_held}
        return holds

    def unpacked(self, target: ast.expr, value: ast.expr | None, held: frozenset[str],
                 holds: _Holds) -> list[tuple[ast.expr, frozenset[str]]]:
        """The names, items and attributes ``target = value`` binds, each with what it may
        hold, all read from ``holds`` (before any is bound)."""
        if isinstance(target, ast.Starred):
            return self.unpacked(target.value, None, held, holds)
        if not isinstance(target, (ast.Tuple, ast.List)):
            return [(target, held)]
        parts = value.elts if isinstance(value, (ast.Tuple, ast.List)) and \
            len(value.elts) == len(target.elts) and \
            not any(isinstance(part, ast.Starred) for part in (*target.elts, *value.elts)) \
            else None
        leaves = []
        for index, element in enumerate(target.elts):
            part = None if parts is None else parts[index]
            leaves += self.unpacked(element, part,
                                    held if part is None else self.held(part, holds), holds)
        return leaves

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
                helds = [_NOTHING if part is None else self.held(part, holds)
                         for part in parts]
                for element, held in zip(target.elts, helds):
                    holds = self.assign(element, None, held, holds)
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
        """``holds`` with the names ``node`` binds with ``:=`` (in a comprehension, to what
        its items hold: ``[(r := row) for row in x]``)."""
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            holds = self.walrus(node.value, holds)
            return {**holds, node.target.id: self.held(node.value, holds)}
        if isinstance(node, ast.Lambda):
            return holds
        if isinstance(node, _COMPREHENSIONS):
            inside = holds
            for generator in node.generators:
                inside = self.iterate(generator.target, generator.iter,
                                      self.walrus(generator.iter, inside))
                for condition in generator.ifs:
                    inside = self.walrus(condition, inside)
            parts = (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)
            for part in parts:
                inside = self.walrus(part, inside)
            bound = {child.target.id for child in ast.walk(node)
                     if isinstance(child, ast.NamedExpr) and isinstance(child.target, ast.Name)}
            # (bound on no pass when nothing is iterated: what it held before stays possible)
            return {**holds, **{name: holds.get(name, _NOTHING) | inside.get(name, _NOTHING)
                                for name in bound}}
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.keyword):
                child = child.value
            if isinstance(child, ast.expr):
                holds = self.walrus(child, holds)
        return holds

    def held(self, node: ast.expr, holds: _Holds) -> frozenset[str]:
        """The marks of the parameters the value of ``node`` may be, or be a view of."""
        if isinstance(node, ast.Name):
            held = holds.get(node.id)
            if held is None:  # inside a function defined inside: bound where it is called?
                return frozenset({_CLOSED + node.id}) if self._closing else _NOTHING
            return held
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
        if isinstance(node, _COMPREHENSIONS):  # [x[i:i + 2] for i in ...]
            inside = holds
            for generator in node.generators:
                inside = self.iterate(generator.target, generator.iter, inside)
            parts = (node.value,) if isinstance(node, ast.DictComp) else (node.elt,)
            return frozenset().union(*(self.held(part, inside) for part in parts))
        return _NOTHING

    def held_by_call(self, node: ast.Call, holds: _Holds) -> frozenset[str]:
        function = node.func
        if isinstance(function, ast.Attribute):
            receiver = self.held(function.value, holds)
            if receiver:  # a method of what may be the array, or a list or dict holding it
                if function.attr in VIEW_METHODS or function.attr in HOLDER_GETTERS or (
                        function.attr == "astype" and _is_false(_keyword(node, "copy"))):
                    return receiver
                return _NOTHING
            if function.attr == "setdefault" and len(node.args) == 2:  # d.setdefault("x", x)
                return self.held(node.args[1], holds)
        name = _called_name(node)
        if isinstance(function, ast.Name):  # a helper returning what it is passed, or a view
            reading = self.helper_reading(function.id)
            if reading is not None:
                return self.passed(reading, node, holds, returned=True)
        first = node.args[0] if node.args and not isinstance(node.args[0], ast.Starred) \
            else None
        if first is None:
            return _NOTHING
        copy = _keyword(node, "copy")
        if (name in VIEW_FUNCTIONS and (copy is None or _is_false(copy))) or (
                name == "array" and _is_false(copy)):
            return self.held(first, holds)
        if isinstance(function, ast.Name) and (name in ITEM_BUILTINS or (
                name in ("max", "min") and _keyword(node, "key") is not None)):
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
                    inside = self.walrus(condition, inside)
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
        """What a dotted name read from ``func``'s globals, the modules it imports inside or
        the builtins is (``np.add``, ``ndimage.convolve``), or None (a local, an attribute of
        anything but a module or a ufunc, a submodule not loaded: nothing is imported)."""
        if isinstance(node, ast.Name):
            if node.id in self._modules:
                return self._modules[node.id]
            if self._is_local(node.id):
                return None
            found = self._func.__globals__.get(node.id, _ABSENT)
            return getattr(builtins, node.id, None) if found is _ABSENT else found
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if isinstance(base, types.ModuleType):
                return vars(base).get(node.attr)
            if isinstance(base, np.ufunc) and node.attr == "at":
                return base.at
        return None

    def call(self, node: ast.Call, holds: _Holds) -> None:
        for keyword in node.keywords:
            if keyword.arg in ("out", "output"):
                self.written.update(self.held(keyword.value, holds))
        function, name = node.func, _called_name(node)
        inplace = _keyword(node, "inplace") or (node.args[0] if node.args else None)
        if isinstance(function, ast.Attribute) and (name in MUTATING_METHODS or (
                name == "byteswap" and isinstance(inplace, ast.Constant) and
                inplace.value is True)):
            self.written.update(self.held(function.value, holds))
        if name == "shuffle" and node.args:  # a Generator's, or NumPy's legacy one
            self.written.update(self.held(node.args[0], holds))
        if name == "nan_to_num" and node.args and _is_false(_keyword(node, "copy")):
            self.written.update(self.held(node.args[0], holds))
        called = self.resolve(function)
        if isinstance(called, np.ufunc):
            for output in node.args[called.nin:]:
                self.written.update(self.held(output, holds))
        elif isinstance(getattr(called, "__self__", None), np.ufunc) and node.args:
            self.written.update(self.held(node.args[0], holds))  # np.add.at(x, i, v)
        elif _package(called) == "numpy":
            self.numpy_call(node, getattr(called, "__name__", ""), holds)
        elif isinstance(function, ast.Name):
            reading = self.helper_reading(function.id)
            if reading is not None:
                self.written.update(self.passed(reading, node, holds, returned=False))

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

    def helper_reading(self, name: str) -> _Reading | None:
        """What the helper ``name`` does with its parameters: one defined inside, or a
        function of the user's (``@veda.gpu`` or not) in ``func``'s globals; None for any
        other name."""
        if name in self._inner:
            return self._inner[name]
        if self._depth <= 0 or self._is_local(name):
            return None
        helper = analysed_function(self._func.__globals__.get(name))
        if helper is None or _package(helper) in LIBRARIES:
            return None
        return _read(helper, self._depth - 1, self._reading)

    def _is_local(self, name: str) -> bool:
        """Whether ``name`` is a local or closure variable of ``func`` (not its global)."""
        code = self._func.__code__
        return name in code.co_varnames or name in code.co_freevars

    def passed(self, reading: _Reading, node: ast.Call, holds: _Holds, *,
               returned: bool) -> frozenset[str]:
        """The marks of what this call passes to the parameters ``reading`` writes into (or,
        ``returned``, may return)."""
        wanted = reading.returned if returned else reading.written
        closed = _NOTHING if returned else frozenset().union(*(
            self.held(ast.Name(name), holds) for name in reading.closed_over))
        if not wanted:
            return closed
        starred = next((index for index, argument in enumerate(node.args)
                        if isinstance(argument, ast.Starred)), len(node.args))
        passed = [*zip(reading.positional, node.args[:starred]),
                  *((keyword.arg, keyword.value) for keyword in node.keywords
                    if keyword.arg is not None)]
        return closed.union(*(self.held(argument, holds) for parameter, argument in passed
                              if parameter in wanted))
