"""Kernel times from CUDA-graph replays: no launch overhead of the host in the figure.

A graph holding the launches once is replayed many times between two CUDA events; the time per
launch is the replay time over the launches. Used to shape kernels (perf_tests/scripts/kernel_configs.py).
"""

from __future__ import annotations

import torch


def time_per_launch_us(launches: list, replays: int = 20, repeats: int = 5) -> float:
    """Median over `repeats` of (graph replay time / launches), the graph holding every launch once.

    With programmatic dependent launch, consecutive launches overlap as they do in a decode step."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for launch in launches:
            launch()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for launch in launches:
            launch()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / (replays * len(launches)))
    del graph
    return sorted(samples)[len(samples) // 2]


def graph_us(body, replays: int = 200) -> float:
    """Median time of one replay of a CUDA graph of `body`, over 5 batches of `replays`."""
    return time_per_launch_us([body], replays=replays)
