"""par_iter on Dask distributed: the same pipeline on an embedded cluster of worker processes.

    python examples/dask_pipeline.py [--quick]

Needs the `dask` extra (`pip install "vedart[dask]"`); on a host with a GPU and the `dask-cuda`
extra the embedded cluster is a LocalCUDACluster, one worker per GPU, and each worker's
gpu_map stage offloads to its own GPU. Functions travel to the workers by name, so they live
in a module (examples/_multi_gpu_work.py), and the script's work is guarded by
`if __name__ == "__main__":` because worker processes re-import it.
"""

import math
import sys
from pathlib import Path

import numpy as np

import vedart as veda

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _multi_gpu_work import column_sums_of_gram  # noqa: E402  (importable by the workers)

QUICK = "--quick" in sys.argv
COUNT, SIDE = (8, 128) if QUICK else (64, 1000)

if __name__ == "__main__":
    runtime = veda.init(veda.Config.builder().scheduler("dask").dask_workers(2).build())
    print(f"Dask cluster: {runtime.dask.client.scheduler.address}, workers: "
          f"{len(runtime.dask.client.scheduler_info()['workers'])}")

    roots = veda.par_iter(range(10_000)).map(math.sqrt).collect()  # pure Python, in processes
    assert roots[144] == 12.0

    rng = np.random.default_rng()
    matrices = [rng.random((SIDE, SIDE), dtype=np.float32) for _ in range(COUNT)]
    results = veda.par_iter(matrices).gpu_map(column_sums_of_gram).collect()
    for got, matrix in zip(results, matrices):
        np.testing.assert_allclose(got, (matrix @ matrix.T).sum(axis=0), rtol=1e-4)
    veda.report()  # the workers' @gpu calls, per worker and device
    veda.shutdown()  # closes the embedded cluster
    print("all results match NumPy")
