"""Per-call overhead of tensorbridge next to its peers, on the same calls, in one process.

``python -m tensorbridge bench`` runs these scripts (the wheel ships them as
``tensorbridge._benchmarks``); from a source checkout each also runs alone:
``python -m benchmarks.bench_dlpack --quick``.
"""

SCRIPTS = (
    "bench_dlpack",
    "bench_buffer",
    "bench_file",
    "bench_asarray",
    "bench_arrow",
    "bench_safetensors",
    "bench_scaleout",
)
