"""The parameters a function's code may write into in place, read from its source.

On the CPU path a function that writes into an argument array (``x -= x.mean()``,
``x[x < 0] = 0``, ``np.clip(x, 0, 1, out=x)``, ``x.sort()``) changes the caller's array; on
the GPU path it writes into the device copy. :func:`written_parameters` finds such writes so
that the GPU path copies those arguments back, as it does for ``writes=``.

What counts as a write into a parameter ``x``, or into a name that may hold ``x`` or a view of
it at that point (``y = x``, ``y = x[1:]``, ``y = x.T``, ``y = x.reshape(...)``, ``y =
np.asarray(x)``, ``for row in x``):

- an augmented assignment to the name (``x += 1``: in place for an array);
- an assignment into an item or slice of it, or to an attribute that changes an array
  (``x[i] = v``, ``x[m] += 1``, ``x.real[:] = 0``, ``x.imag += 1``);
- ``out=`` naming it (``np.add(a, b, out=x)``, ``out=(x,)``, ``out=x[1:]``), and a NumPy
  ufunc's outputs given by position (``np.multiply(x, 2, x)``);
- a method that changes an array's values (``x.sort()``, ``x.fill(0)``, ``x.put(...)``,
  ...), and a function that changes its first argument (``np.copyto(x,
  v)``, ``np.put``, ``np.place``, ``np.putmask``, ``np.fill_diagonal``, ``np.put_along_axis``,
  ``rng.shuffle(x)``, ``np.add.at(x, i, v)``).

Names are followed in order through assignments, branches and loops (a name rebound to a new
array, ``x = x - x.mean()``, no longer holds the parameter; after ``if``/``else`` it holds what
either branch left), into functions defined inside, and into the helpers called by name
(``normalise(x)``: a function in the module's globals, not NumPy's, SciPy's, CuPy's or
vedart's), ``HELPER_DEPTH`` calls deep, whose parameters written into are what the call passes
them. What this cannot see, and so does not copy back: writes made by methods and by functions
reached otherwise (``obj.fill(x)``, ``module.fill(x)``, one passed in), writes into the arrays in
a list, dict or tuple argument (its items are not parameters), changes of an array's shape or
dtype (``x.shape = s``, ``x.resize(n)``), and functions without source (made by ``exec``, or a
lambda sharing its line with another).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Iterable

import numpy as np

# Array methods that change the array they are called on.
MUTATING_METHODS = frozenset({
    "sort", "fill", "put", "itemset", "partition", "setfield", "byteswap"})
# Functions (NumPy's, and a Generator's ``shuffle``) that change their first argument.
MUTATING_FUNCTIONS = frozenset({
    "copyto", "put", "place", "putmask", "fill_diagonal", "put_along_axis", "shuffle", "at"})
# Attributes of an array whose assignment writes into the array (``x.real = 0``). (Those that
# change its shape or dtype, ``x.shape = s``, are not copied back: the copy would not fit.)
WRITABLE_ATTRIBUTES = frozenset({"real", "imag", "flat"})
# Attributes and methods of an array that are views of it (or it).
VIEW_ATTRIBUTES = frozenset({"T", "mT", "real", "imag", "flat"})
VIEW_METHODS = frozenset({
    "view", "reshape", "ravel", "transpose", "swapaxes", "squeeze", "diagonal", "getfield"})
# NumPy functions whose result may be their first argument or a view of it.
VIEW_FUNCTIONS = frozenset({
    "asarray", "asanyarray", "ascontiguousarray", "asfortranarray", "require", "reshape",
    "ravel", "transpose", "swapaxes", "moveaxis", "rollaxis", "squeeze", "expand_dims",
    "atleast_1d", "atleast_2d", "atleast_3d", "real", "imag", "diagonal", "matrix_transpose",
    "permute_dims"})
# NumPy's ufuncs by name, with how many inputs each takes: the positions after are outputs.
UFUNC_INPUTS = {name: value.nin for name, value in vars(np).items()
                if isinstance(value, np.ufunc)}
HELPER_DEPTH = 3  # calls below the function whose helpers' writes are followed
# Packages whose functions are not read as helpers: their writes are the calls listed above.
LIBRARIES = frozenset({"numpy", "scipy", "cupy", "cupyx", "vedart"})
_TRY = (ast.Try, getattr(ast, "TryStar", ast.Try))  # (try/except* from Python 3.11)
_LOOP_PASSES = 8  # a loop body is walked until what its names hold stops growing, at most

_Holds = dict[str, frozenset[str]]  # name -> the parameters it may hold (or a view of)
_NOTHING: frozenset[str] = frozenset()


def written_parameters(func: object) -> tuple[str, ...]:
    """The names of ``func``'s parameters that its own code, or a helper it calls by name,
    may write into in place (see the module docstring), in signature order; ``()`` for
    anything but a plain Python function with source. Never raises: what cannot be read is
    taken as writing nothing."""
    if type(func) is not types.FunctionType:
        return ()
    try:
        return _written(func, HELPER_DEPTH, set())
    except Exception:  # noqa: BLE001  # (RecursionError of a deep tree, an odd source file)
        return ()


def _written(func: types.FunctionType, depth: int, reading: set[types.CodeType]
             ) -> tuple[str, ...]:
    """:func:`written_parameters` of ``func``, following helpers ``depth`` calls deeper;
    ``reading``: the code of the functions being read (a helper calling back is not read
    again)."""
    node = _definition(func)
    if node is None:
        return ()
    parameters = [argument.arg for argument in (
        *node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
    reading.add(func.__code__)
    finder = _Writes(func, depth, reading)
    finder.body(node.body if isinstance(node.body, list) else [ast.Expr(node.body)],
                {name: frozenset({name}) for name in parameters})
    reading.discard(func.__code__)
    return tuple(name for name in parameters if name in finder.written)


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


def _join(first: _Holds, second: _Holds) -> _Holds:
    joined = dict(first)
    for name, held in second.items():
        joined[name] = joined.get(name, _NOTHING) | held
    return joined


class _Writes:
    """Walks ``func``'s statements in order with what each name may hold, collecting the
    parameters written into (``written``), and reading the helpers it calls by name
    ``depth`` calls deeper."""

    def __init__(self, func: types.FunctionType, depth: int,
                 reading: set[types.CodeType]) -> None:
        self.written: set[str] = set()
        self._func = func
        self._depth = depth
        self._reading = reading

    def body(self, statements: Iterable[ast.stmt], holds: _Holds) -> _Holds:
        for statement in statements:
            holds = self.statement(statement, holds)
        return holds

    def statement(self, node: ast.stmt, holds: _Holds) -> _Holds:
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
            entry = self.assign(node.target, None, self.held(node.iter, holds), holds)
            return self.body(node.orelse, self.loop(node.body, entry))
        if isinstance(node, ast.While):
            self.scan(node.test, holds)
            return self.body(node.orelse, self.loop(node.body, holds))
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
        when it runs (taken as what they hold where it is defined)."""
        own = {argument.arg for argument in (
            *node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
        if node.args.vararg is not None:
            own.add(node.args.vararg.arg)
        if node.args.kwarg is not None:
            own.add(node.args.kwarg.arg)
        inside = {name: held for name, held in holds.items() if name not in own}
        if isinstance(node, ast.Lambda):
            self.scan(node.body, inside)
        else:
            self.body(node.body, inside)

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
        self.write(target, holds)  # x[i] = v, x.attribute = v
        return holds

    def write(self, target: ast.expr, holds: _Holds) -> None:
        """Note a write into what ``target`` (of an assignment into it) holds: a name's
        value for ``x += 1``, what a subscript is taken of for ``x[i] = v``, and the array
        whose ``shape``, ``real``, ... is set (``self.coef = v`` writes into no array)."""
        self.scan(target, holds)
        if isinstance(target, ast.Attribute) and target.attr not in WRITABLE_ATTRIBUTES:
            return
        if isinstance(target, (ast.Subscript, ast.Attribute)):
            target = target.value
        self.written.update(self.held(target, holds))

    def held(self, node: ast.expr, holds: _Holds) -> frozenset[str]:
        """The parameters the value of ``node`` may be, or be a view of."""
        if isinstance(node, ast.Name):
            return holds.get(node.id, _NOTHING)
        if isinstance(node, ast.Subscript):
            return self.held(node.value, holds)
        if isinstance(node, ast.Attribute):
            return self.held(node.value, holds) if node.attr in VIEW_ATTRIBUTES else _NOTHING
        if isinstance(node, ast.Call):
            function = node.func
            if isinstance(function, ast.Attribute) and function.attr in VIEW_METHODS:
                return self.held(function.value, holds)
            copy = next((keyword.value for keyword in node.keywords if keyword.arg == "copy"),
                        None)
            never_copies = isinstance(copy, ast.Constant) and copy.value is False
            name = _called_name(node)
            if (name in VIEW_FUNCTIONS and (copy is None or never_copies)) or (
                    name in ("array", "astype") and never_copies):
                held = self.held(function.value, holds) if name == "astype" and \
                    isinstance(function, ast.Attribute) else \
                    self.held(node.args[0], holds) if node.args else _NOTHING
                return held
            return _NOTHING
        if isinstance(node, ast.IfExp):
            return self.held(node.body, holds) | self.held(node.orelse, holds)
        if isinstance(node, ast.BoolOp):
            return frozenset().union(*(self.held(value, holds) for value in node.values))
        if isinstance(node, (ast.Tuple, ast.List)):
            return frozenset().union(*(self.held(value, holds) for value in node.elts))
        if isinstance(node, (ast.Starred, ast.NamedExpr)):
            return self.held(node.value, holds)
        return _NOTHING

    def scan(self, node: ast.expr, holds: _Holds) -> None:
        """Note the writes an expression makes by calling (``out=``, mutating methods and
        functions) and in the functions it defines."""
        for child in ast.walk(node):
            if isinstance(child, ast.Lambda):
                self.inner(child, holds)
            elif isinstance(child, ast.Call):
                self.call(child, holds)

    def call(self, node: ast.Call, holds: _Holds) -> None:
        for keyword in node.keywords:
            if keyword.arg == "out":
                self.written.update(self.held(keyword.value, holds))
        function, name = node.func, _called_name(node)
        if isinstance(function, ast.Attribute) and name in MUTATING_METHODS:
            self.written.update(self.held(function.value, holds))
        if name in MUTATING_FUNCTIONS and node.args:
            self.written.update(self.held(node.args[0], holds))
        inputs = UFUNC_INPUTS.get(name) if name is not None else None
        if inputs is not None:
            for output in node.args[inputs:]:
                self.written.update(self.held(output, holds))
        if isinstance(function, ast.Name):
            self.helper(function.id, node, holds)

    def helper(self, name: str, node: ast.Call, holds: _Holds) -> None:
        """Note the writes of the helper ``name`` (a module-level function of the user's,
        found in ``func``'s globals) into what this call passes it."""
        code = self._func.__code__
        helper = self._func.__globals__.get(name)
        if self._depth <= 0 or name in code.co_varnames or name in code.co_freevars or \
                type(helper) is not types.FunctionType or helper.__code__ in self._reading or \
                str(getattr(helper, "__module__", "")).partition(".")[0] in LIBRARIES:
            return
        written = _written(helper, self._depth - 1, self._reading)
        if not written:
            return
        positional = helper.__code__.co_varnames[:helper.__code__.co_argcount]
        for index, argument in enumerate(node.args):
            if isinstance(argument, ast.Starred):
                break
            if index < len(positional) and positional[index] in written:
                self.written.update(self.held(argument, holds))
        for keyword in node.keywords:
            if keyword.arg in written:
                self.written.update(self.held(keyword.value, holds))
