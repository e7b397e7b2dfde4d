"""perf_tests/scripts/fast_targets.py: the targets judged on measured p50s, and every case run end to end on the CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "perf_tests" / "scripts" / "fast_targets.py"


@pytest.fixture(scope="module")
def script(perf_script):
    return perf_script("fast_targets")


def test_absolute_and_relative_targets_are_judged_on_the_p50_and_a_missing_case_is_not_run(script):
    goals = [script.Target("fast b1", "tpot_ms", 0.60), script.Target("fast b4", "tpot_ms", 0.70),
             script.Target("fast prompt 1920", "tpot_ms", 1.15, relative_to="fast b1"),
             script.Target("fast sampled", "tpot_ms", 1.05, relative_to="fast b1"),
             script.Target("fast smollm2-135m", "tpot_ms", 0.20)]
    p50 = {"fast b1": {"tpot_ms": 0.686}, "fast b4": {"tpot_ms": 0.70},
           "fast prompt 1920": {"tpot_ms": 0.7612}, "fast sampled": {"tpot_ms": 0.74}}
    rows = script.judge(goals, p50)
    assert [row["verdict"] for row in rows] == ["missed", "met", "met", "missed", "not run"]  # 0.70 <= 0.70 is met
    assert rows[2]["limit_ms"] == pytest.approx(1.15 * 0.686) and rows[2]["ratio"] == pytest.approx(0.7612 / 0.686)
    assert rows[4]["measured_ms"] is None
    assert "TPOT <= 1.15 x fast b1" in script.table(rows)


def test_the_targets_follow_the_cases_that_run(script):
    made = script.cases("m", "small", [1, 4, 8], 1920)
    assert [case.name for case in made] == [
        "fast b1", "hf b1", "hf-static b1", "eager b1", "fast b1 no early_loads", "fast b1 prefill as before",
        "fast b1 l2 ahead 8M", "fast b1 l2 ahead 24M", "fast b1 l2 ahead 8M attention", "fast b1 o k-whole",
        "fast b1 o n4 k-whole", "fast b1 qkv+o k-whole", "fast b1 qkv+o+down k-whole", "fast b1 room gate/up n2",
        "fast b1 room o n4+gate/up n2", "fast b1 room o n8", "fast b1 room o n8+gate/up n2",
        "fast b1 room qkv n4+o n4+gate/up n2", "fast b4", "fast b8",
        "fast b1 previous defaults", "fast b4 previous defaults",
        "fast b4 gate/up k128 s3 2/SM", "fast b8 gate/up k128 s3 2/SM", "fast b4 o rowwise k-whole",
        "fast b4 qkv+o rowwise k-whole", "fast b8 o rowwise k-whole", "fast b8 qkv+o rowwise k-whole",
        "fast b4 down rowwise n4", "fast b4 down rowwise n2", "fast b4 gate/up rowwise n4", "fast b4 gate/up rowwise n2",
        "fast b4 down+gate/up rowwise n4", "fast b4 down+gate/up rowwise n2", "fast b4 qkv tma 80 programs",
        "fast b4 qkv tma 200 programs", "fast b4 down tma 80 programs", "fast b4 down tma 200 programs",
        *(f"fast b{b} gate/up l2 {tiles}" for b in (4, 8) for tiles in (0, 1, 2, 4, 8)),
        "fast b8 o l2 2", *(f"fast b{b} qkv l2 2" for b in (4, 8)),
        *(f"fast b{b} {label} s{stages}" for b in (4, 8) for label in ("down", "qkv", "qkv+down") for stages in (4, 5)),
        "fast b8 rms in tiles",
        *(f"fast b{b} {label} l2 0" for b in (4, 8) for label in ("qkv+o", "down", "qkv+o+down")),
        "fast b4 head l2 1", "fast b8 head l2 1",
        "fast b4 down l2 8", "fast b4 gate/up+down s2 down l2 8",
        "fast b4 l2 ahead 8M", "fast b4 l2 ahead 24M", "fast b4 l2 ahead 8M attention", "fast b8 l2 ahead 8M",
        "fast b8 l2 ahead 24M", "fast b8 l2 ahead 8M attention",
        "fast b1 t256 w8", "fast b4 t256 w8", "fast b8 t256 w8",
        "fast b1 whole256", "fast b4 whole256", "fast b8 whole256",
        "fast b1 attention-o", "fast b1 attention-o w16", "fast b1 attention-o t128",
        "fast b1 attention-o n512 t64 w16", "fast b1 attention-o r128", "fast b4 attention-o",
        "fast b8 attention-o", "fast b1 qkv-attention t32", "fast b1 qkv-attention t32 r48",
        "fast b1 qkv-attention t32 r56", "fast b1 qkv-attention t32 r64", "fast b1 qkv-attention t64 r64",
        "fast b1 qkv-attention t64 r80",
        "fast b4 rows={}", "fast b8 rows={}", "fast b4 stream per matrix", "fast b8 stream per matrix",
        "fast b4 stream down+o", "fast b8 stream down+o", "fast b4 tensor", "fast b8 tensor", "fast b4 tma 2/SM",
        "fast b8 tma 2/SM", "fast b4 tma prefetch 1", "fast b4 tma prefetch 2", "fast b4 tma prefetch 8",
        "fast b8 tma prefetch 1", "fast b8 tma prefetch 2", "fast b8 tma prefetch 8", "fast b4 tma narrow n32",
        "fast b4 tma narrow n16", "fast b8 tma narrow n32", "fast b8 tma narrow n16", "fast b4 tma narrow n32 prefetch 8",
        "fast b4 tma narrow n16 prefetch 8", "fast b8 tma narrow n32 prefetch 8", "fast b8 tma narrow n16 prefetch 8",
        "fast b4 tma all n16 prefetch 8", "fast b8 tma all n16 prefetch 8", "fast b4 tma all n16 early prefetch 8",
        "fast b8 tma all n16 early prefetch 8", "fast b4 tma s2 early prefetch 8", "fast b8 tma s2 early prefetch 8",
        "fast b4 tma s2 prefetch 0", "fast b4 tma s2 prefetch 8", "fast b8 tma s2 prefetch 0", "fast b8 tma s2 prefetch 8",
        "fast b4 stream tma 1/SM",
        "fast b4 stream tma 2/SM", "fast b8 stream tma 1/SM", "fast b8 stream tma 2/SM", "fast b4 ranges256", "fast b8 ranges256",
        "fast prompt 1920", "fast prompt 1920 whole256", "fast prompt 1920 prefill as before",
        "fast sampled",
        "fast sampled bisection", "fast sampled split", "fast sampled torch", "fast small",
        "fast small no early_loads", "fast small default shapes", "fast small persistent", "fast small l2 ahead 8M",
        "fast small attention-o", "fast small qkv-attention t32", "fast small qkv-attention t64",
        "fast small qkv-attention t32 r48"]
    launch = {case.name: case.launch for case in made}
    assert launch["fast sampled torch"] == (("sampling", "torch"),) and not launch["fast b1"]
    assert not launch["fast sampled"] and launch["fast b4 rows={}"] == (("rows", ()),)
    assert launch["fast b1 no early_loads"] == launch["fast small no early_loads"] == (("early_loads", False),)
    options = {case.name: case.options for case in made}
    assert options["fast b1 prefill as before"] == options["fast prompt 1920 prefill as before"] == (
        ("prefill_cache_write", "index"), ("prefill_head", "torch"))
    assert not any(options[name] for name in options if "prefill as before" not in name)
    assert launch["fast small persistent"] == (("persistent", True),)
    assert launch["fast b8 stream per matrix"] == (("rows", script.stream_per_matrix(8)),)
    assert launch["fast b4 tma 2/SM"] == (("tma_per_sm", 2),)
    assert script.launch_policy(launch["fast b8 ranges256"]).head_range == 256
    assert script.launch_policy(launch["fast b8 tma prefetch 2"]).tma_prefetch == 2
    two_stages = script.launch_policy(launch["fast b4 tma s2 prefetch 8"])
    assert (two_stages.tma_gemv.num_stages, two_stages.tma_gemv.block_n, two_stages.tma_prefetch) == (2, 64, 8)
    narrow = script.launch_policy(launch["fast b4 tma narrow n16 prefetch 8"])
    assert narrow.tma_prefetch == 8 and narrow.rows[2048, 2048, False, 4].config.block_n == 16
    assert narrow.rows[32000, 2048, False, 4] == script.launch_policy(()).rows[32000, 2048, False, 4]  # added, not replaced
    goals = script.targets([1, 4, 8], 1920, None)
    assert {goal.case for goal in goals} == {"fast b1", "fast b4", "fast b8", "fast prompt 1920", "fast sampled"}
    assert not script.SAMPLED.greedy and script.SAMPLED.temperature == 0.7 and script.SAMPLED.top_p == 0.9


def test_a_case_names_its_policy_in_hashable_pairs_mappings_included(script):
    """The engines are kept per (model, launch): a launch is pairs, a mapping's value its own pairs,
    and the policy made from them is the one the case names."""
    kernels = pytest.importorskip("inferlab.fast.kernels")
    made = {case.name: case for case in script.cases("m", "small", [1, 4], 1920)}
    for case in made.values():
        hash(case.launch)
    assert dict(script.launch_policy(made["fast b4 rows={}"].launch).rows) == {}
    default_shapes = script.launch_policy(made["fast small default shapes"].launch)
    assert default_shapes.gemv_config(960, 576, False) == kernels.DEFAULT_GEMV != kernels.gemv_config(960, 576, False)
    assert default_shapes.gemv_config(2560, 2048, False) == kernels.gemv_config(2560, 2048, False)
    assert script.launch_policy(made["fast sampled torch"].launch).sampling == "torch"
    assert script.launch_policy(made["fast sampled split"].launch).sampling == "split"
    assert script.launch_policy(made["fast sampled bisection"].launch).sample_candidates == 0
    per_matrix = script.launch_policy(made["fast b4 stream per matrix"].launch)
    assert per_matrix.rows_launch(5632, 2048, True, 4) == kernels.RowsLaunch("stream", kernels.LaunchConfig(64, 128, 4, 3), 264)
    assert per_matrix.rows_launch(2560, 2048, False, 4) == kernels.RowsLaunch("stream", kernels.LaunchConfig(64, 256, 4, 3), 132)
    assert per_matrix.rows_launch(2560, 2048, False, 3).kernel == "row"  # below the switch: only entries of 3 rows apply
    assert per_matrix.rows_launch(2048, 2048, False, 16).kernel == "tma"  # 16 rows: not in the b4 case
    down_o = script.launch_policy(made["fast b4 stream down+o"].launch)  # added to the measured table
    assert down_o.rows_launch(2048, 5632, False, 4) == kernels.RowsLaunch("stream", kernels.LaunchConfig(64, 128, 4, 4), 132)
    assert down_o.rows_launch(2048, 2048, False, 4).kernel == "stream"
    assert down_o.rows_launch(2560, 2048, False, 4) == kernels.DEFAULT_POLICY.rows_launch(2560, 2048, False, 4)
    assert set(down_o.rows) == set(kernels.DEFAULT_POLICY.rows) | {(2048, 5632, False, 4), (2048, 2048, False, 4)}
    before = script.launch_policy(made["fast b4 tensor"].launch)  # the batched step before the TMA kernel
    assert before.batched == "tensor" and dict(before.rows) == kernels.TENSOR_ROWS
    assert before.rows_launch(2560, 2048, False, 4).kernel == "cuda" and before.rows_launch(5632, 2048, True, 4).kernel == "tensor"
    assert script.launch_policy(made["fast b4 tma 2/SM"].launch).tma_per_sm == 2
    stream_tma = script.launch_policy(made["fast b4 stream tma 1/SM"].launch)
    assert stream_tma.stream_tma and stream_tma.stream_per_sm == 1 and stream_tma.rows_launch(2560, 2048, False, 4).kernel == "stream"
    assert stream_tma.rows_launch(2048, 2048, False, 4) == kernels.MEASURED_ROWS[2048, 2048, False, 4]  # measured: kept
    assert stream_tma.rows_launch(32000, 2048, False, 4) == kernels.MEASURED_ROWS[32000, 2048, False, 4]
    narrow = script.launch_policy(made["fast b4 tma narrow n16"].launch)
    assert narrow.rows_launch(2048, 5632, False, 4) == kernels.RowsLaunch("tma", kernels.LaunchConfig(16, 256, 4, 4))
    assert narrow.rows_launch(5632, 2048, True, 4) == kernels.MEASURED_ROWS[5632, 2048, True, 4]  # not narrowed: kept
    assert narrow.rows_launch(32000, 2048, False, 4) == kernels.MEASURED_ROWS[32000, 2048, False, 4]
    every = script.launch_policy(made["fast b4 tma all n16 prefetch 8"].launch)
    assert every.rows_launch(5632, 2048, True, 4) == every.rows_launch(2560, 2048, False, 4) == kernels.RowsLaunch(
        "tma", kernels.LaunchConfig(16, 256, 4, 4))
    assert every.tma_prefetch == 8 and every.rows_launch(32000, 2048, False, 4) == kernels.MEASURED_ROWS[32000, 2048, False, 4]
    assert not every.tma_early and script.launch_policy(made["fast b4 tma all n16 early prefetch 8"].launch).tma_early
    two_early = script.launch_policy(made["fast b4 tma s2 early prefetch 8"].launch)
    assert two_early.tma_early and two_early.tma_gemv == kernels.LaunchConfig(64, 256, 4, 2)
    assert kernels.DEFAULT_POLICY.sample_candidates == kernels.SAMPLE_CANDIDATES > 0
    assert kernels.DEFAULT_POLICY.sampling == "kernel" and kernels.DEFAULT_POLICY.early_loads
    ahead = script.launch_policy(made["fast b4 l2 ahead 24M"].launch)
    assert ahead.l2_ahead == 24 << 20 and ahead.l2_ahead_from == "all" and kernels.DEFAULT_POLICY.l2_ahead == 0
    attention_only = script.launch_policy(made["fast b1 l2 ahead 8M attention"].launch)
    assert attention_only.l2_ahead == 8 << 20 and attention_only.l2_ahead_from == "attention"
    assert script.launch_policy(made["fast small l2 ahead 8M"].launch).l2_ahead == 8 << 20
    one_tile = script.launch_policy(made["fast b1 t256 w8"].launch)
    assert (one_tile.head_block_t, one_tile.head_range, one_tile.head_warps) == (256, 256, 8)
    assert one_tile.head_range_for(256) == 0 and one_tile.decode_kernels(22, 256) == 22 * 5 + 2
    assert script.launch_policy(made["fast b4 whole256"].launch).head_launch_for(256) == (256, 0, 8)
    whole = script.launch_policy(made["fast b1 qkv+o k-whole"].launch)
    assert whole.gemv_config(2048, 2048, False) == whole.gemv_config(2560, 2048, False) == kernels.LaunchConfig(2, 2048, 4, 1)
    assert whole.gemv_config(5632, 2048, True) == kernels.gemv_config(5632, 2048, True)  # added to the table
    assert script.launch_policy(made["fast b1 qkv+o+down k-whole"].launch).gemv_config(2048, 5632, False).block_k == 8192
    two_per_sm = script.launch_policy(made["fast b4 gate/up k128 s3 2/SM"].launch)
    assert two_per_sm.rows_launch(5632, 2048, True, 4) == kernels.RowsLaunch("tma", kernels.LaunchConfig(64, 128, 4, 3), 264)
    assert two_per_sm.rows_launch(2048, 2048, False, 4) == kernels.DEFAULT_POLICY.rows_launch(2048, 2048, False, 4)
    rowwise = script.launch_policy(made["fast b4 qkv+o rowwise k-whole"].launch)
    assert rowwise.rows_launch(2560, 2048, False, 4) == kernels.RowsLaunch("rowwise", kernels.LaunchConfig(2, 2048, 4, 1))
    assert rowwise.rows_launch(2048, 5632, False, 4) == kernels.DEFAULT_POLICY.rows_launch(2048, 5632, False, 4)
    before = script.launch_policy(made["fast b4 previous defaults"].launch)
    assert before.head_launch_for(256, 4) == (kernels.ATTENTION_BLOCK_T, 128, 4) != kernels.DEFAULT_POLICY.head_launch_for(256, 4)
    assert before.rows_launch(2048, 2048, False, 4).kernel == "tma" and kernels.DEFAULT_POLICY.rows_launch(
        2048, 2048, False, 4).kernel == "rowwise"
    assert before.rows_launch(32000, 2048, False, 4) == kernels.MEASURED_ROWS[32000, 2048, False, 4]
    assert script.launch_policy(made["fast b1 previous defaults"].launch).head_launch_for(256) == (128, 128, 4)
    fused = script.launch_policy(made["fast b1 attention-o"].launch)
    assert fused.attention_o_for(256, 1) and not fused.attention_o_for(257, 1) and fused.decode_kernels(22, 256) == 22 * 4 + 2
    assert script.launch_policy(made["fast b1 attention-o w16"].launch).attention_o_warps == 16
    assert script.launch_policy(made["fast b1 attention-o r128"].launch).attention_o_registers == 128
    assert script.launch_policy(made["fast b1 attention-o t128"].launch).attention_o_block_t == 128
    assert script.launch_policy(made["fast b4 attention-o"].launch).attention_o_for(256, 4)
    both = script.launch_policy(made["fast b4 down+gate/up rowwise n2"].launch)
    assert {both.rows_launch(n, k, gated, 4) for n, k, gated in ((2048, 5632, False), (5632, 2048, True))} == {
        script.launch_policy(()).rows_launch(2048, 2048, False, 4)}  # o's default launch at 4 rows: (2, 2048)
    assert both.rows_launch(2560, 2048, False, 4).kernel == "tma"  # the rest as they were
    early = script.launch_policy(made["fast b4 gate/up+down s2 down l2 8"].launch)
    assert early.rows_launch(2048, 5632, False, 4).l2_tiles == 8 and early.rows_launch(5632, 2048, True, 4).l2_tiles == 0
    assert early.rows_launch(5632, 2048, True, 4).config.num_stages == 2
    default = script.launch_policy(())
    assert default.rows_launch(2560, 2048, False, 4).l2_tiles == default.rows_launch(2048, 5632, False, 16).l2_tiles == 1
    four = script.launch_policy(made["fast b4 qkv+o l2 0"].launch)
    eight = script.launch_policy(next(case for case in script.cases("m", "small", [8], 1920)
                                      if case.name == "fast b8 qkv+o+down l2 0").launch)
    assert four.rows_launch(2560, 2048, False, 4).l2_tiles == eight.rows_launch(2048, 2048, False, 8).l2_tiles == 0
    assert eight.rows_launch(2048, 5632, False, 8).l2_tiles == 0 and four.rows_launch(2048, 5632, False, 4).l2_tiles == 1
    assert four.rows_launch(2048, 2048, False, 4).kernel == "rowwise"  # o at 4 rows as it runs
    head = script.launch_policy(made["fast b4 head l2 1"].launch).rows_launch(32000, 2048, False, 4)
    assert (head.config, head.l2_tiles) == (kernels.TMA_HEAD, 1)  # the default's tile, with its request
    deep = script.launch_policy(made["fast b4 qkv+down s5"].launch)
    for n, k in ((2560, 2048), (2048, 5632)):  # the deeper pipeline, each keeping its first tile asked of L2
        launch = deep.rows_launch(n, k, False, 4)
        assert (launch.kernel, launch.config, launch.l2_tiles) == ("tma", kernels.LaunchConfig(64, 256, 4, 5), 1)
    assert deep.rows_launch(5632, 2048, True, 4) == default.rows_launch(5632, 2048, True, 4)  # [gate; up] as it runs
    assert script.launch_policy(made["fast b4 down s4"].launch).rows_launch(2560, 2048, False, 4).config is None
    eight = [case for case in script.cases("m", "small", [8], 1920) if case.name == "fast b8 rms in tiles"]
    assert default.rms_at_once and not script.launch_policy(eight[0].launch).rms_at_once
    split = script.launch_policy(made["fast b4 down tma 200 programs"].launch)
    assert split.rows_launch(2048, 5632, False, 4).target_programs == 200
    assert split.rows_launch(2560, 2048, False, 4).target_programs == 0
    capped = script.launch_policy(made["fast b1 qkv-attention t64 r80"].launch)
    assert (capped.qkv_attention_cache, capped.qkv_attention_block_t, capped.qkv_attention_registers) == (256, 64, 80)
    assert capped.decode_kernels(22, 256) == 22 * 4 + 2 and capped.decode_kernels(22, 257) == 22 * 6 + 2


def test_every_case_runs_on_the_cpu_and_the_json_keeps_the_raw_runs(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", "--model", "tiny-random",
                           "--small-model", "", "--batch-sizes", "1,2,4", "--long-prompt", "24", "--output-length", "4",
                           "--warmup", "0", "--runs", "2"],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "only shows that every case runs" in done.stdout
    saved = json.loads(next(tmp_path.glob("*-targets/targets.json")).read_text())
    assert set(saved["results"]) == {"fast b1", "hf b1", "hf-static b1", "eager b1", "fast b1 no early_loads", "fast b2",
                                     "fast b1 prefill as before", "fast prompt 24 prefill as before",
                                     "fast b4", "fast b4 rows={}", "fast prompt 24", "fast b4 stream per matrix",
                                     "fast b4 stream down+o", "fast b4 tensor", "fast b4 tma 2/SM", "fast b2 tma",
                                     "fast b4 tma prefetch 1", "fast b4 tma prefetch 2", "fast b4 tma prefetch 8",
                                     "fast b4 tma narrow n32", "fast b4 tma narrow n16", "fast b4 tma narrow n32 prefetch 8",
                                     "fast b4 tma narrow n16 prefetch 8", "fast b4 tma all n16 prefetch 8",
                                     "fast b4 tma all n16 early prefetch 8", "fast b4 tma s2 early prefetch 8",
                                     "fast b4 tma s2 prefetch 0",
                                     "fast b4 tma s2 prefetch 8", "fast b4 stream tma 1/SM",
                                     "fast b4 stream tma 2/SM", "fast b4 ranges256",
                                     *(f"fast b{b} l2 ahead {size}" for b in (1, 2, 4)
                                       for size in ("8M", "24M", "8M attention")),
                                     *(f"fast b1 {m} k-whole" for m in ("o", "o n4", "qkv+o", "qkv+o+down")),
                                     *(f"fast b1 room {m}" for m in ("gate/up n2", "o n4+gate/up n2", "o n8",
                                                                     "o n8+gate/up n2", "qkv n4+o n4+gate/up n2")),
                                     "fast b1 t256 w8", "fast b4 t256 w8", "fast b1 whole256", "fast b4 whole256",
                                     "fast prompt 24 whole256",
                                     "fast b4 gate/up k128 s3 2/SM", "fast b4 o rowwise k-whole",
                                     "fast b4 qkv+o rowwise k-whole",
                                     *(f"fast b4 {m} rowwise n{n}" for m in ("down", "gate/up", "down+gate/up")
                                       for n in (4, 2)),
                                     *(f"fast b4 {m} tma {p} programs" for m in ("qkv", "down") for p in (80, 200)),
                                     *(f"fast b4 gate/up l2 {tiles}" for tiles in (0, 1, 2, 4, 8)), "fast b4 down l2 8",
                                     "fast b4 qkv l2 2", "fast b4 qkv+o l2 0", "fast b4 down l2 0",
                                     *(f"fast b4 {m} s{stages}" for m in ("down", "qkv", "qkv+down") for stages in (4, 5)),
                                     "fast b4 qkv+o+down l2 0", "fast b4 head l2 1",
                                     "fast b4 gate/up+down s2 down l2 8",
                                     *(f"fast b1 attention-o{v}" for v in ("", " w16", " t128", " n512 t64 w16", " r128")),
                                     "fast b2 attention-o", "fast b4 attention-o",
                                     *(f"fast b1 qkv-attention {v}" for v in ("t32", "t32 r48", "t32 r56", "t32 r64",
                                                                              "t64 r64", "t64 r80")),
                                     "fast b1 previous defaults",
                                     "fast b2 previous defaults", "fast b4 previous defaults",
                                     "fast sampled", "fast sampled bisection", "fast sampled split",
                                     "fast sampled torch"}
    assert all(len(result["runs"]) == 2 for result in saved["results"].values()) and not saved["failed"]
    assert {row["verdict"] for row in saved["verdicts"]} <= {"met", "missed"}
    check = saved["correctness"]["tiny-random"]  # fp32 on the CPU: the fast engine's tokens are the eager loop's
    assert check["greedy_token_agreement_fast_vs_eager"] == 1.0 and check["max_abs_logit_err_fast_vs_fp32"] < 1e-3


def test_cases_picks_the_cases_by_name_and_a_bad_pattern_is_refused_in_one_line(tmp_path):
    common = [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", "--model", "tiny-random",
              "--small-model", "", "--batch-sizes", "1", "--long-prompt", "24", "--output-length", "2", "--warmup", "0",
              "--runs", "1"]
    env = {"PYTHONPATH": str(ROOT), "PATH": ""}
    bad = subprocess.run([*common, "--cases", "fast ("], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert bad.returncode == 2 and "--cases" in bad.stderr and "Traceback" not in bad.stderr
    assert not list(tmp_path.iterdir())  # nothing written
    done = subprocess.run([*common, "--cases", "sampled|^eager"], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads(next(tmp_path.glob("*-targets/targets.json")).read_text())
    assert set(saved["results"]) == {"eager b1", "fast sampled", "fast sampled bisection", "fast sampled split",
                                     "fast sampled torch"}


def test_bad_batch_sizes_are_refused_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", "--batch-sizes", "1,x"],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=120)
    assert done.returncode == 2 and "--batch-sizes" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_run_stopped_part_way_keeps_the_cases_it_timed(script, tmp_path, monkeypatch):
    """targets.json is rewritten after each case: a run cut off after its first case (a device
    call's time limit, say) still holds that case's raw runs."""
    timed = []

    def measure(case, *args):
        if timed:
            raise KeyboardInterrupt  # stopped during the second case
        timed.append(case.name)
        return {"summary": {"tpot_ms": {"p50": 1.0}, "ttft_ms": {"p50": 2.0}}, "runs": [{"tpot_ms": 1.0}]}

    monkeypatch.setattr(script, "measure", measure)
    monkeypatch.setattr(sys, "argv", ["fast_targets", "--out", str(tmp_path), "--device", "cpu", "--model", "tiny-random",
                                      "--small-model", "", "--batch-sizes", "1", "--cases", "^(eager|hf) b1$"])
    with pytest.raises(KeyboardInterrupt):
        script.main()
    saved = json.loads(next(tmp_path.glob("*-targets/targets.json")).read_text())
    assert timed == ["hf b1"] and list(saved["results"]) == ["hf b1"]
    assert saved["results"]["hf b1"]["runs"] == [{"tpot_ms": 1.0}] and not saved["failed"]


def test_an_uncompiled_prefill_touches_only_fast_cases_and_drops_the_ttft_targets(script):
    made = {case.name: case for case in script.cases("m", None, [1, 4], 1920)}
    plain = script.uncompiled_prefill(made["fast b4"])
    assert plain.options == (("compile", False),) and plain.launch == made["fast b4"].launch
    before = script.uncompiled_prefill(made["fast b1 prefill as before"])
    assert before.options == (*made["fast b1 prefill as before"].options, ("compile", False))
    assert script.uncompiled_prefill(plain) == plain  # once is enough
    assert script.uncompiled_prefill(made["hf b1"]) == made["hf b1"]  # not a fast engine: as it was
    metrics = {(goal.case, goal.metric) for goal in script.targets([1, 4], 1920, None, ttft=False)}
    assert metrics == {("fast b1", "tpot_ms"), ("fast b4", "tpot_ms"), ("fast prompt 1920", "tpot_ms"),
                       ("fast sampled", "tpot_ms")}
    assert ("fast b1", "ttft_ms") in {(goal.case, goal.metric) for goal in script.targets([1, 4], 1920, None)}


def test_a_run_with_an_uncompiled_prefill_still_checks_the_default_engines_tokens(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", "--model", "tiny-random",
                           "--small-model", "", "--batch-sizes", "1", "--output-length", "3", "--warmup", "0",
                           "--runs", "1", "--cases", "^fast b1$", "--uncompiled-prefill"],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads(next(tmp_path.glob("*-targets/targets.json")).read_text())
    assert saved["args"]["uncompiled_prefill"] and list(saved["results"]) == ["fast b1"]
    assert [row["target"] for row in saved["verdicts"] if row["case"] == "fast b1"] == ["TPOT <= 0.6 ms"]
    assert saved["correctness"]["tiny-random"]["greedy_token_agreement_fast_vs_eager"] == 1.0
