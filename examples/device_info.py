"""Show the GPU vedart sees, its memory and utilisation (the seed guide's monitoring snippet)."""

import vedart as veda

veda.init(veda.Config.builder().gpu(True).build())
runtime = veda.get_runtime()

if runtime.gpu:
    print(f"Backend: {runtime.gpu.backend}")
    print(f"Devices: {runtime.gpu.device_count}")
    stats = runtime.gpu.get_memory_stats()
    print(f"Used: {stats['used_mb']:.1f} MB")
    print(f"Free: {stats['free_mb']:.1f} MB")
    print(f"Total: {stats['total_mb']:.1f} MB")
    print(f"GPU Utilization: {runtime.gpu.get_utilization():.1f}%")
else:
    print(f"GPU not available: {runtime.gpu.unavailable_reason}")
