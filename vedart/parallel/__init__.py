"""Parallel pipelines: ``par_iter(items).map(f).gpu_map(g).collect()`` on the runtime's scheduler
(a worker pool shared by every pipeline, plus GPU lanes per device). See docs/par_iter.md.

The public names are re-exported by ``vedart`` itself; this package exports none, so that
``vedart.parallel.par_iter`` stays the module."""
