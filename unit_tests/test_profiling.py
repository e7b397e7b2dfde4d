"""Profiles: the step window, the ranking of kernels/operators, a real trace on the CPU, the
`--profile` flags, and the per-kernel diff the gate prints on FAIL."""

import json
from types import SimpleNamespace

import pytest

from inferlab.cli import main
from inferlab.errors import UsageError
from inferlab.look import tables
from inferlab.look.profile_diff import format_kernel_diff, kernel_diff, load_profile
from inferlab.measure import profiling
from inferlab.measure.bench import BenchConfig, result_from_dict, run_benchmark
from inferlab.measure.profiling import KernelTime, ProfileSummary


def event(key, count, device_type="DeviceType.CPU", self_cpu=0.0, self_device=0.0):
    return SimpleNamespace(key=key, count=count, device_type=device_type, self_cpu_time_total=self_cpu,
                           self_device_time_total=self_device)


def test_window_skips_the_prefill_and_warm_up_steps_and_needs_room():
    assert profiling.window(7, steps=3) == (3, 3)  # decode steps 3, 4, 5; the mark of token 6 closes step 5
    assert profiling.window(6, steps=3) is None  # too short: recorded whole
    assert profiling.window(100, steps=5) == (3, 5)


def test_kernels_are_ranked_by_device_time_per_step():
    events = [
        event("ProfilerStep#3", 1, self_cpu=900.0),
        event("aten::mm", 6, self_cpu=500.0, self_device=0.0),  # a CPU op: not a kernel
        event("gemv_kernel", 6, "DeviceType.CUDA", self_device=300.0),
        event("rmsnorm_kernel", 9, "DeviceType.CUDA", self_device=600.0),
    ]
    rows = profiling.rank_events(events, on_device=True, steps=3)
    assert rows == (KernelTime("rmsnorm_kernel", 200.0, 3.0), KernelTime("gemv_kernel", 100.0, 2.0))


def test_cpu_operators_are_ranked_by_self_cpu_time_per_step():
    events = [event("ProfilerStep#3", 2, self_cpu=900.0), event("aten::mm", 4, self_cpu=80.0),
              event("aten::add", 2, self_cpu=120.0), event("aten::view", 2, self_cpu=0.0)]
    rows = profiling.rank_events(events, on_device=False, steps=2)
    assert rows == (KernelTime("aten::add", 60.0, 1.0), KernelTime("aten::mm", 40.0, 2.0))


def test_a_profiled_bench_writes_a_chrome_trace_after_the_timed_runs(tiny, tmp_path):
    trace = tmp_path / "bench.trace.json"
    config = BenchConfig(prompt_length=4, output_length=8, warmup_runs=0, runs=2)
    result = run_benchmark(tiny, config, profile_trace=trace)
    assert len(result.runs) == 2 and all(r.num_tokens == 8 for r in result.runs)  # timed runs untouched
    summary = result.profile
    assert (summary.device_type, summary.unit, summary.steps, summary.window) == ("cpu", "operators", 3, "decode steps 3-5")
    assert summary.rows and all(r.name.startswith("aten::") for r in summary.rows)
    assert [r.us_per_step for r in summary.rows] == sorted((r.us_per_step for r in summary.rows), reverse=True)
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)
    assert [p.name for p in tmp_path.iterdir()] == ["bench.trace.json"]  # no scratch left behind
    assert result_from_dict(json.loads(json.dumps(result.to_dict()))).profile == summary
    assert "profile: top CPU operators by self time per step" in tables.format_result(result)


def test_a_short_request_is_profiled_whole(tiny, tmp_path):
    config = BenchConfig(prompt_length=4, output_length=3, warmup_runs=0, runs=1)
    summary = run_benchmark(tiny, config, profile_trace=tmp_path / "t.json").profile
    assert (summary.steps, summary.window) == (3, "the whole request (3 tokens)")


def test_bench_and_sweep_take_profile(tmp_path, capsys):
    assert main(["bench", "tiny-random", "--device", "cpu", "--prompt-length", "4", "--output-length", "8",
                 "--runs", "1", "--warmup", "0", "--no-probe", "--profile", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "profile: top CPU operators" in out and "trace bench.trace.json" in out
    [folder] = tmp_path.glob("*-bench")
    assert (folder / "bench.trace.json").is_file()
    assert main(["sweep", "tiny-random", "--device", "cpu", "--prompt-lengths", "4", "--output-lengths", "2", "8",
                 "--runs", "1", "--warmup", "0", "--no-probe", "--profile", "--out", str(tmp_path)]) == 0
    [folder] = tmp_path.glob("*-sweep")
    assert sorted(p.name for p in (folder / "profiles").iterdir()) == ["eager-b1-p4-n2.trace.json", "eager-b1-p4-n8.trace.json"]


def summary(rows) -> ProfileSummary:
    return ProfileSummary("cuda", "kernels", 3, "decode steps 3-5", tuple(KernelTime(n, us, 1.0) for n, us in rows), "t.json")


def test_kernel_diff_ranks_growth_and_counts_a_missing_kernel_as_zero():
    base = summary([("gemv", 100.0), ("norm", 20.0), ("attn", 50.0)])
    head = summary([("gemv", 130.0), ("norm", 10.0), ("attn", 50.0), ("new_copy", 40.0)])
    changes = kernel_diff(base, head)
    assert [(c.name, c.delta_us) for c in changes] == [("new_copy", 40.0), ("gemv", 30.0)]  # norm shrank, attn same
    text = format_kernel_diff(changes, base, head)
    assert "base 170.0 us/step, head 230.0 us/step" in text and "+30.0  gemv" in text


def test_load_profile_refuses_a_result_without_one(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"schema": "inferlab.bench/1", "profile": None}))
    with pytest.raises(UsageError, match="holds no profile: run `inferlab bench --profile`"):
        load_profile(path)


def kernel_event(name, ts, dur, grid):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"grid": grid, "block": [128, 1, 1]}}


TWO_STEPS = [  # two decode steps of a two-matrix model: one projection kernel at two grids, then the step kernel
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 50.0},  # not a kernel
    kernel_event("_gemv_tma_kernel", 10.0, 6.0, [40, 3, 1]), kernel_event("_gemv_tma_kernel", 17.0, 9.0, [88, 1, 1]),
    kernel_event("_greedy_step_kernel", 27.0, 2.0, [4, 1, 1]),
    kernel_event("_greedy_step_kernel", 57.0, 3.0, [4, 1, 1]),  # listed out of order: sorted by start
    kernel_event("_gemv_tma_kernel", 40.0, 8.0, [40, 3, 1]), kernel_event("_gemv_tma_kernel", 49.0, 7.0, [88, 1, 1]),
]


# the same two steps after the end of a step the window caught in part: the trace's whole steps are the two
WITH_A_PARTIAL_STEP = [kernel_event("_gemv_tma_kernel", 2.0, 3.0, [88, 1, 1]),
                       kernel_event("_greedy_step_kernel", 6.0, 1.0, [4, 1, 1]), *TWO_STEPS]


def test_whole_steps_run_from_the_first_launch_of_the_closing_kernel_to_its_last():
    kept, steps = profiling.whole_steps(WITH_A_PARTIAL_STEP)
    assert steps == 2 and [e["ts"] for e in kept] == [10.0, 17.0, 27.0, 40.0, 49.0, 57.0]
    assert profiling.kernel_launches(kept, steps) == profiling.kernel_launches(TWO_STEPS, 2)
    assert profiling.whole_steps(TWO_STEPS)[1] == 1  # the first step's start is not known: one whole step
    assert profiling.whole_steps(WITH_A_PARTIAL_STEP, expected=2)[1] == 2
    many = [kernel_event("elementwise", float(t), 0.5, [8]) for t in range(12)]  # 12 alike: not step ends
    assert profiling.whole_steps(many, expected=3) == (many, 0) and profiling.whole_steps(many)[1] == 11
    one = [kernel_event("a", 0.0, 1.0, [1]), kernel_event("b", 2.0, 1.0, [1])]
    assert profiling.whole_steps(one) == (one, 0) and profiling.whole_steps([{"cat": "cpu_op"}]) == ([], 0)


def test_the_trace_ranking_adds_a_kernels_grids_over_whole_steps_only():
    rows, steps = profiling.trace_ranking(WITH_A_PARTIAL_STEP, 2)  # the partial step's 3 us are not counted
    assert steps == 2 and rows == (profiling.KernelTime("_gemv_tma_kernel", 15.0, 2.0),
                                   profiling.KernelTime("_greedy_step_kernel", 2.5, 1.0))
    assert profiling.trace_ranking(TWO_STEPS[:4], 1) == ((), 0)  # one step end: no whole step
    assert profiling.trace_ranking(WITH_A_PARTIAL_STEP, 5) == ((), 0)  # 2 steps where about 5 were recorded
    assert profiling._trace_events(b"{not json") == [] and profiling._trace_events(b'{"traceEvents": 3}') == []


def test_kernel_launches_keep_each_grid_of_a_kernel_apart_in_launch_order_per_step():
    rows = profiling.kernel_launches(TWO_STEPS, steps=2)
    assert rows == (profiling.LaunchTime("_gemv_tma_kernel", (40, 3, 1), 7.0, 1.0, 7.0),
                    profiling.LaunchTime("_gemv_tma_kernel", (88, 1, 1), 8.0, 1.0, 8.0),
                    profiling.LaunchTime("_greedy_step_kernel", (4, 1, 1), 2.5, 1.0, 2.5))
    assert profiling.kernel_launches([{"cat": "cpu_op", "name": "aten::mm"}, "not an event"], steps=1) == ()


def test_a_kernel_launched_before_the_previous_ends_adds_only_the_time_past_that_end():
    overlapped = [kernel_event("a", 0.0, 5.0, [1]), kernel_event("b", 2.0, 6.0, [2]),  # b waits 3 us under PDL
                  kernel_event("c", 3.0, 2.0, [3]),  # ends before b: adds nothing
                  kernel_event("d", 20.0, 1.0, [4])]  # after an idle gap: its own duration, the gap not counted
    rows = profiling.kernel_launches(overlapped, steps=1)
    assert [(r.name, r.us_per_step, r.chain_us_per_step) for r in rows] == [
        ("a", 5.0, 5.0), ("b", 6.0, 3.0), ("c", 2.0, 0.0), ("d", 1.0, 1.0)]
    assert sum(r.chain_us_per_step for r in rows) == 9.0  # busy: 0-8 and 20-21


def run_step_kernels(*args):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, str(root / "perf_tests" / "scripts" / "step_kernels.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=root, env={"PYTHONPATH": str(root), "PATH": ""},
                          timeout=120)


def profiled_result(folder, events, steps=2):
    """A bench.json naming its trace, and the trace beside it, as `inferlab bench --profile` writes them."""
    summary = ProfileSummary("cuda", "kernels", steps, f"decode steps 3-{2 + steps}", (), "bench.trace.json")
    (folder / "bench.trace.json").write_text(json.dumps({"traceEvents": events}))
    result = folder / "bench.json"
    result.write_text(json.dumps({"profile": summary.to_dict()}))
    return result


def test_step_kernels_prints_each_launch_with_its_share_over_the_steps_its_result_names(tmp_path):
    done = run_step_kernels(profiled_result(tmp_path, WITH_A_PARTIAL_STEP, steps=3))  # the whole steps are 2
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "kernel launches per step, over 2 recorded steps, in launch order"
    assert lines[2].split() == ["1", "7.00", "7.00", "40.0%", "1.0", "40x3x1", "_gemv_tma_kernel"]
    assert lines[3].split() == ["2", "8.00", "8.00", "45.7%", "1.0", "88x1x1", "_gemv_tma_kernel"]
    assert lines[-1] == "total: 17.5 us of kernel time, 17.5 us of busy device time and 3 launches per step"
    sweep = tmp_path / "sweep"  # a sweep keeps its traces in profiles/, beside results/
    (sweep / "results").mkdir(parents=True)
    (sweep / "profiles").mkdir()
    result = profiled_result(sweep / "results", WITH_A_PARTIAL_STEP, steps=3)
    (sweep / "results" / "bench.trace.json").rename(sweep / "profiles" / "bench.trace.json")
    assert run_step_kernels(result).stdout == done.stdout


def test_step_kernels_refuses_what_it_cannot_read_in_one_line(tmp_path):
    cases = []
    for name, events in (("cpu", TWO_STEPS[:1]), ("gone", TWO_STEPS), ("broken", TWO_STEPS)):
        (tmp_path / name).mkdir()
        cases.append(profiled_result(tmp_path / name, events))
    (tmp_path / "gone" / "bench.trace.json").unlink()
    (tmp_path / "broken" / "bench.trace.json").write_text("{not json")
    unprofiled = tmp_path / "unprofiled.json"
    unprofiled.write_text(json.dumps({"profile": None}))
    for bad, says in ((cases[0], "holds no GPU kernel events"), (cases[1], "cannot read the trace"),
                      (cases[2], "is not a Chrome trace"), (unprofiled, "holds no profile"),
                      (tmp_path / "missing.json", "cannot read profile")):
        refused = run_step_kernels(bad)
        assert refused.returncode == 2 and says in refused.stderr, (bad, refused.stderr)
        assert len(refused.stderr.splitlines()) == 1 and "Traceback" not in refused.stderr
