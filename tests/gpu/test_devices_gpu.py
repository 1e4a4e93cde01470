"""Device layer against the real GPU (on a GPU machine: ``pytest -m gpu``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import vedart as veda
from vedart.gpu.nvml import parse_pci_bus_id

pytestmark = pytest.mark.gpu


def nvidia_smi_cards() -> list[dict[str, str]]:
    """Every physical card, in NVML order, as nvidia-smi reports it."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on PATH")
    output = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,pci.bus_id,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True).stdout
    cards = []
    for line in output.strip().splitlines():
        name, bus_id, total_mib = (part.strip() for part in line.split(","))
        cards.append({"name": name, "bus_id": bus_id, "total_mib": total_mib})
    return cards


def test_device_list_matches_nvidia_smi() -> None:
    gpu = veda.init().gpu
    assert gpu is not None and gpu.is_available(), gpu and gpu.unavailable_reason
    cards = {parse_pci_bus_id(card["bus_id"]): card for card in nvidia_smi_cards()}
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        assert gpu.device_count == len(cards)
    for device in gpu.devices:
        card = cards[parse_pci_bus_id(device.pci_bus_id)]
        assert device.name == card["name"]
        assert device.compute_capability[0] >= 7
        assert abs(device.total_memory / 2**20 - float(card["total_mib"])) / float(card["total_mib"]) < 0.02


def test_memory_stats_match_cuda_mem_get_info_within_2_percent() -> None:
    import cupy

    gpu = veda.init().gpu
    assert gpu is not None
    for device in gpu.devices:
        with cupy.cuda.Device(device.ordinal):
            cuda_free, cuda_total = cupy.cuda.runtime.memGetInfo()
        stats = gpu.get_memory_stats(device.ordinal)
        assert stats["free_mb"] >= 0 and stats["used_mb"] >= 0
        assert abs(stats["free_mb"] * 2**20 - cuda_free) / cuda_total < 0.02
        assert abs(stats["total_mb"] * 2**20 - cuda_total) / cuda_total < 0.02
        assert stats["used_mb"] + stats["free_mb"] == pytest.approx(stats["total_mb"])


def test_free_memory_drops_when_the_device_allocates() -> None:
    import cupy

    gpu = veda.init().gpu
    assert gpu is not None
    before = gpu.free_memory(0)
    with cupy.cuda.Device(0):
        block = cupy.empty(2 * 2**30, dtype=cupy.uint8)
        block.fill(1)
        cupy.cuda.Device(0).synchronize()
        after = gpu.free_memory(0)
        del block
        cupy.get_default_memory_pool().free_all_blocks()
    assert before - after >= 2 * 2**30 * 0.98


def test_utilization_is_a_percentage() -> None:
    gpu = veda.init().gpu
    assert gpu is not None
    for device in gpu.devices:
        utilization = gpu.get_utilization(device.ordinal)
        assert isinstance(utilization, float) and 0.0 <= utilization <= 100.0


def test_cuda_visible_devices_maps_to_the_right_card() -> None:
    cards = nvidia_smi_cards()
    if len(cards) < 2:
        pytest.skip("needs two GPUs (nvidia-h200-x2)")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="1")
    result = subprocess.run([sys.executable, "-m", "vedart", "info", "--json"],
                            capture_output=True, text=True, env=env, check=True)
    devices = json.loads(result.stdout)["gpu"]["devices"]
    assert len(devices) == 1 and devices[0]["ordinal"] == 0
    assert parse_pci_bus_id(devices[0]["pci_bus_id"]) == parse_pci_bus_id(cards[1]["bus_id"])


def test_info_lists_the_gpu_with_its_memory() -> None:
    result = subprocess.run([sys.executable, "-m", "vedart", "info", "--json"],
                            capture_output=True, text=True, check=True)
    gpu = json.loads(result.stdout)["gpu"]
    assert gpu["available"] is True and gpu["devices"]
    assert all(row["total_mb"] > 1000 and row["free_mb"] > 0 for row in gpu["devices"])
