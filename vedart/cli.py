"""``python -m vedart`` / ``vedart``: the command line. Subcommands: ``demo``, ``info``,
``bench``, ``calibrate``."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from vedart._version import __version__, component_versions
from vedart.config import FIELD_SPECS
from vedart.errors import GPUUnavailableError, VedaError
from vedart.lifecycle import get_runtime
from vedart.offload.adaptive import ADAPTIVE_FLOOR
from vedart.runtime import Runtime
from vedart.units import format_bytes

# bench suites: name -> module in vedart.bench with run(quick) -> dict and format_table(dict).
BENCH_SUITES = ("ops", "overhead", "matmul", "transfer", "par_iter", "kernels", "dask",
                "helpers")
QUICK_BENCHMARKS = ("overhead", "matmul", "transfer", "par_iter", "kernels", "ops", "dask",
                    "helpers")  # tools/gpu-check.sh, --quick

def _device_rows(runtime: Runtime) -> list[dict[str, Any]]:
    assert runtime.gpu is not None
    rows = []
    for device in runtime.gpu.devices:
        stats = runtime.gpu.get_memory_stats(device.ordinal)
        try:
            utilization: float | None = runtime.gpu.get_utilization(device.ordinal)
        except GPUUnavailableError:
            utilization = None
        rows.append({
            "ordinal": device.ordinal,
            "name": device.name,
            "compute_capability": "{}.{}".format(*device.compute_capability),
            "pci_bus_id": device.pci_bus_id,
            "total_mb": round(stats["total_mb"], 1),
            "free_mb": round(stats["free_mb"], 1),
            "used_mb": round(stats["used_mb"], 1),
            "utilization_percent": utilization,
        })
    return rows


def collect_info(runtime: Runtime) -> dict[str, Any]:
    """Everything ``vedart info`` shows, as JSON-friendly data."""
    config = runtime.config
    values = config.as_dict()
    gpu = runtime.gpu
    if gpu is None:
        gpu_info: dict[str, Any] = {"available": False,
                                    "reason": runtime.gpu_unavailable_reason, "devices": []}
    else:
        gpu_info = {
            "available": gpu.is_available(),
            "reason": gpu.unavailable_reason,
            "backend": gpu.backend,
            "devices": _device_rows(runtime) if gpu.is_available() else [],
        }
    return {
        "vedart": __version__,
        "versions": component_versions(),
        "config": {name: {"value": values[name], "source": config.sources[name]}
                   for name in FIELD_SPECS},
        "gpu": gpu_info,
        "scheduler": {"threads": config.threads} if runtime.dask is None
        else runtime.dask.describe(),
    }


def _config_note(name: str, info: dict[str, Any]) -> str:
    """What a setting's line adds: the default threshold is the static rule's alone."""
    config = info["config"]
    if name == "offload_threshold" and config[name]["source"] == "default" and \
            config["cost_model"]["value"] == "adaptive":
        return f" (the static rule's; the adaptive model starts at {format_bytes(ADAPTIVE_FLOOR)})"
    return ""


def format_info(info: dict[str, Any]) -> str:
    """The human-readable form of :func:`collect_info`'s data."""
    lines = [f"vedart {info['vedart']}", "", "versions:"]
    lines += [f"  {name:<11} {version or 'not installed'}"
              for name, version in info["versions"].items()]
    lines += ["", "config (value, source):"]
    lines += [f"  {name:<20} {entry['value']!r:<14} {entry['source']}{_config_note(name, info)}"
              for name, entry in info["config"].items()]
    lines += ["", *_scheduler_lines(info["scheduler"])]
    gpu = info["gpu"]
    lines.append("")
    if not gpu["available"]:
        lines.append(f"GPU: not available: {gpu['reason']}")
        return "\n".join(lines)
    lines.append(f"GPU: available ({gpu['backend']}), {len(gpu['devices'])} device(s)")
    lines.append(f"  {'#':>2}  {'name':<28} {'CC':<5} {'total MiB':>10} {'free MiB':>10} "
                 f"{'util %':>6}  PCI bus id")
    for row in gpu["devices"]:
        utilization = "n/a" if row["utilization_percent"] is None else \
            f"{row['utilization_percent']:.0f}"
        lines.append(f"  {row['ordinal']:>2}  {row['name']:<28} {row['compute_capability']:<5} "
                     f"{row['total_mb']:>10.0f} {row['free_mb']:>10.0f} {utilization:>6}  "
                     f"{row['pci_bus_id']}")
    return "\n".join(lines)


def _scheduler_lines(scheduler: dict[str, Any]) -> list[str]:
    if "address" not in scheduler:
        return [f"scheduler: threads ({scheduler['threads']} workers)"]
    started = f", embedded {scheduler['embedded']}" if scheduler["embedded"] else ""
    lines = [f"scheduler: Dask scheduler {scheduler['address']}{started}, "
             f"{len(scheduler['workers'])} worker(s)",
             f"  dashboard: {scheduler['dashboard'] or 'none (bokeh not installed)'}"]
    lines += [f"  {worker['address']:<28} {worker['threads']} thread(s), GPUs: "
              f"{', '.join(worker['gpus']) or 'none'}" for worker in scheduler["workers"]]
    return lines


def _info(arguments: argparse.Namespace) -> int:
    info = collect_info(get_runtime())
    print(json.dumps(info, indent=2) if arguments.json else format_info(info))
    return 0


def _bench(arguments: argparse.Namespace) -> int:
    from vedart.bench.harness import environment, write_json

    suite = importlib.import_module("vedart.bench.transfer_cold" if arguments.cold
                                    else f"vedart.bench.{arguments.suite}")
    options = {"sweep": True} if arguments.sweep else {}
    result = suite.run(quick=arguments.quick, **options)
    result["environment"] = environment(result.get("device_name"))
    header = result["environment"]
    print(f"vedart bench {arguments.suite}{' --cold' if arguments.cold else ''} | "
          f"{header['date']} | {header['device']} | "
          f"{header['cpu_count']} CPUs | vedart {header['vedart']}")
    print(suite.format_table(result))
    write_json(arguments.json, result)
    if arguments.plot:
        suite.plot(result, arguments.plot)
        print(f"plot written to {arguments.plot}")
    return 0


def _demo(arguments: argparse.Namespace) -> int:
    from vedart import demo

    return 0 if demo.run() else 1


def _calibrate(arguments: argparse.Namespace) -> int:
    from vedart import calibrate

    result = calibrate.run()
    print(calibrate.format_summary(result))
    return 0 if result["saved"] else 1


def _writable_place(path: str) -> bool:
    """Whether a file can be written at ``path``: its folder exists and takes new files, and
    the path is no folder."""
    folder = os.path.dirname(os.path.abspath(path))
    return os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK) and \
        not os.path.isdir(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vedart", description="vedart command line")
    parser.add_argument("--version", action="version", version=f"vedart {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="the guide's common patterns end to end, checked "
                               "against NumPy, with where each call ran and why")
    demo.set_defaults(handler=_demo)
    info = commands.add_parser("info", help="versions, configuration and GPU devices")
    info.add_argument("--json", action="store_true", help="print the same as JSON")
    info.set_defaults(handler=_info)
    bench = commands.add_parser("bench", help="benchmarks (medians, ratios within one run)")
    bench.add_argument("suite", nargs="?", default="ops", choices=BENCH_SUITES,
                       help="which benchmark to run (default: ops)")
    bench.add_argument("--quick", action="store_true", help="fewer repetitions")
    bench.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    bench.add_argument("--sweep", action="store_true",
                       help="transfer suite: also sweep piece size, slots and workers")
    bench.add_argument("--cold", action="store_true",
                       help="transfer suite: the first transfers of fresh processes instead")
    bench.add_argument("--plot", metavar="FILE.png",
                       help="ops suite: draw crossover curves (needs matplotlib)")
    bench.set_defaults(handler=_bench)
    calibrate = commands.add_parser("calibrate", help="measure this machine for the adaptive "
                                    "cost model and write its profile")
    calibrate.set_defaults(handler=_calibrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for usage errors, 1 for vedart errors)."""
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if getattr(arguments, "sweep", False) and arguments.suite != "transfer":
        parser.error("--sweep applies to the transfer suite only")
    if getattr(arguments, "cold", False) and arguments.suite != "transfer":
        parser.error("--cold applies to the transfer suite only")
    if getattr(arguments, "cold", False) and arguments.sweep:
        parser.error("--sweep times warm transfers: not with --cold")
    if getattr(arguments, "plot", None) and arguments.suite != "ops":
        parser.error("--plot applies to the ops suite only")
    if getattr(arguments, "plot", None) and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib (pip install 'vedart[plot]')")
    for option in ("json", "plot") if arguments.command == "bench" else ():
        output = getattr(arguments, option)  # checked before a run of minutes, not after it
        if output and not _writable_place(output):
            parser.error(f"--{option}: cannot write {output!r} (its folder is missing or "
                         "not writable)")
    try:
        return int(arguments.handler(arguments))
    except VedaError as error:
        print(f"vedart: error: {error}", file=sys.stderr)
        return 1
