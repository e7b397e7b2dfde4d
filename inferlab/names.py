"""Names shared across the package, spelled once: engines, gated metrics, compared machine keys."""

ENGINE_NAMES = ("eager", "hf", "hf-static", "fast", "fast-split", "fast-inductor", "fast-nocompile")

# The per-request series the perf suite saves, one pytest-benchmark entry each (the gate's unit).
SUITE_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")

# machine_info["inferlab"] keys two saved runs must share to be compared (plugin and gate).
COMPARED_KEYS = ("device_name", "device_count", "model", "dtype", "layout")
