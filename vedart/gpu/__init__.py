"""The GPU layer: device discovery, NVML queries and the runtime's GPU context."""
