"""Write docs/api.md, the API reference, from the docstrings of vedart's public surface.

    python tools/api_reference.py          # rewrite docs/api.md
    python tools/api_reference.py --check  # exit 1 if docs/api.md is not current

The public surface is ``vedart.__all__`` (every name must sit in one of ``SECTIONS``) and the
objects reached through it that a user calls: ``runtime.gpu`` (GPUContext), the handle
``@veda.gpu_kernel`` returns, and the device API in ``vedart.backends``.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
API_PAGE = ROOT / "docs" / "api.md"
sys.path.insert(0, str(ROOT))

import vedart  # noqa: E402  (the checkout's vedart, not an installed one)
from vedart.backends import CPUBackend, CUDABackend, get_backend  # noqa: E402
from vedart.gpu.context import GPUContext  # noqa: E402
from vedart.kernels.registry import KernelHandle  # noqa: E402

# (title, [(name as the reader writes it, object)]); names from vedart.__all__ are bare.
SECTIONS: list[tuple[str, list[tuple[str, Any]]]] = [
    ("Runtime", [("init", vedart.init), ("get_runtime", vedart.get_runtime),
                 ("shutdown", vedart.shutdown), ("Runtime", vedart.Runtime)]),
    ("Configuration", [("Config", vedart.Config), ("ConfigBuilder", vedart.ConfigBuilder)]),
    ("Offload: @veda.gpu", [("gpu", vedart.gpu), ("Decision", vedart.Decision),
                            ("force", vedart.force), ("to_host", vedart.to_host),
                            ("report", vedart.report), ("empty_cache", vedart.empty_cache)]),
    ("Pipelines: par_iter", [("par_iter", vedart.par_iter), ("ParIter", vedart.ParIter)]),
    ("Kernels: @veda.gpu_kernel", [("gpu_kernel", vedart.gpu_kernel),
                                   ("get_kernel", vedart.get_kernel),
                                   ("KernelHandle", KernelHandle)]),
    ("Devices: runtime.gpu", [("GPUContext", GPUContext), ("DeviceInfo", vedart.DeviceInfo)]),
    ("Device API: vedart.backends", [("vedart.backends.CUDABackend", CUDABackend),
                                     ("vedart.backends.CPUBackend", CPUBackend),
                                     ("vedart.backends.get_backend", get_backend)]),
    ("Errors and warnings", [(name, getattr(vedart, name)) for name in (
        "VedaError", "ConfigError", "DeviceError", "GPUUnavailableError", "CUDADriverError",
        "KernelLaunchError", "OffloadError", "OffloadWarning", "ParIterError", "SchedulerUnavailableError",
        "SimulatorWarning")]),
]

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc):`~?(?:[\w.]+\.)?([\w]+)`")


def _markdown(docstring: str) -> str:
    """A docstring as Markdown: reST roles and literals as code, indented lists as lists."""
    text = _ROLE.sub(r"`\1`", docstring).replace("``", "`")
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("    ") and lines and lines[-1].startswith("- "):
            lines[-1] += " " + line.strip()  # a list item's continuation
        elif line.startswith("  ") and not line.startswith("  -"):
            if lines and lines[-1] and not lines[-1].startswith("- "):
                lines.append("")
            lines.append("- " + line.strip())
        else:
            if line and lines and lines[-1].startswith("- ") and not line.startswith("- "):
                lines.append("")
            lines.append(line)
    return "\n".join(lines).strip()


def _signature(name: str, obj: Any) -> str:
    """``name(parameters) -> result``, annotations unquoted, without ``self``, and no
    memory address (a sentinel default shows as ``...``), so the page is the same each run."""
    try:
        signature = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return name
    signature = re.sub(r"(: |-> )'([^']*)'", r"\1\2", signature)
    signature = re.sub(r"<object object at 0x[0-9a-f]+>", "...", signature)
    signature = re.sub(r"<class '([\w.]+)'>", r"\1", signature)
    return name + signature.replace("(self, ", "(").replace("(self)", "()")


def _members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties a class defines or inherits from vedart classes."""
    members = []
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") or not (inspect.isfunction(member) or isinstance(
                inspect.getattr_static(cls, name), (property, classmethod, staticmethod))):
            continue
        owner = next(base for base in cls.__mro__ if name in vars(base))
        if owner.__module__.startswith("vedart"):
            members.append((name, member))
    return members


def _entry(name: str, obj: Any) -> list[str]:
    lines = [f"### `{name}`", ""]
    if not inspect.isclass(obj) or not issubclass(obj, BaseException):
        lines += ["```text", _signature(name, obj), "```", ""]
    lines += [_markdown(inspect.getdoc(obj) or ""), ""]
    if inspect.isclass(obj) and not issubclass(obj, BaseException):
        for member_name, member in _members(obj):
            static = inspect.getattr_static(obj, member_name)
            shown = f"{obj.__name__}.{member_name}"
            heading = shown if isinstance(static, property) else _signature(shown, member)
            text = _markdown(inspect.getdoc(member) or "").replace("\n\n", " ")
            lines.append(f"- `{heading}`" + (": " + text.replace("\n", " ") if text else ""))
        lines.append("")
    return lines


def render() -> str:
    """The text of docs/api.md."""
    listed = {name for _, entries in SECTIONS for name, _ in entries}
    missing = sorted(set(vedart.__all__) - listed - {"__version__"})
    if missing:
        raise SystemExit(f"tools/api_reference.py: add to SECTIONS: {', '.join(missing)}")
    lines = ["# API reference", "",
             "Generated from the docstrings by `python tools/api_reference.py` (a test checks it "
             "is current). `import vedart as veda`; every name below is `veda.NAME` unless "
             "written in full. `veda.__version__` is the version string.", ""]
    for title, entries in SECTIONS:
        lines += [f"## {title}", ""]
        for name, obj in entries:
            lines += _entry(name, obj)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if API_PAGE.read_text(encoding="utf-8") != text:
            print("docs/api.md is not current: run python tools/api_reference.py")
            return 1
        return 0
    API_PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
