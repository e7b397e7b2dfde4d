"""Layouts across devices: parsing, pipeline placement, the torchrun launch, and tensor
parallelism run for real on the CPU (gloo) with two processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inferlab.cli import main
from inferlab.errors import UsageError
from inferlab.model.layouts import Layout, check_devices, parse_layout, pipeline_device_map, torchrun_command

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, layout", [
    (None, Layout()), ("single", Layout()), ("tp:2", Layout("tp", 2)), ("pipeline:4", Layout("pipeline", 4)),
])
def test_layouts_parse(text, layout):
    assert parse_layout(text) == layout
    assert str(layout) == (text or "single")


@pytest.mark.parametrize("text", ["tp", "tp:1", "tp:x", "ring:2", "pipeline:0"])
def test_bad_layouts_are_refused(text):
    with pytest.raises(UsageError, match="use single, tp:N or pipeline:N"):
        parse_layout(text)


def test_pipeline_places_consecutive_layers_evenly():
    placement = pipeline_device_map(22, 2, tied=False)  # TinyLlama: 11 layers per GPU
    assert [placement[f"model.layers.{i}"] for i in range(22)] == [0] * 11 + [1] * 11
    assert placement["model.embed_tokens"] == 0 and placement["lm_head"] == 1 and placement["model.norm"] == 1
    uneven = pipeline_device_map(22, 3, tied=False)
    assert [list(uneven.values()).count(d) for d in range(3)] == [8 + 2, 7, 7 + 2]  # 8/7/7 layers plus ends


def test_a_tied_head_stays_with_the_embeddings():
    assert pipeline_device_map(30, 2, tied=True)["lm_head"] == 0


def test_more_devices_than_layers_is_refused():
    with pytest.raises(UsageError, match="cannot split 2 layers over 3 devices"):
        pipeline_device_map(2, 3, tied=False)


def test_the_launch_reruns_the_same_command_under_torchrun():
    command = torchrun_command(Layout("tp", 2), ["bench", "tiny-random", "--layout", "tp:2"])
    assert command[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m"]
    assert command[6:] == ["inferlab.cli", "bench", "tiny-random", "--layout", "tp:2"]


def test_pipeline_needs_gpus():
    with pytest.raises(UsageError, match="pipeline layout places layers on several GPUs"):
        check_devices(Layout("pipeline", 2), torch.device("cpu"))
    check_devices(Layout("tp", 2), torch.device("cpu"))  # gloo on the CPU: allowed


@pytest.mark.parametrize("argv, fragment", [
    (["--layout", "pipeline:2"], "pipeline layout places layers on several GPUs"),
    (["--layout", "tp:2", "--engine", "fast"], "engine 'fast' runs on one device"),
    (["--layout", "mesh"], "unknown layout 'mesh'"),
])
def test_cli_refuses_impossible_layouts_in_one_line(capsys, tmp_path, argv, fragment):
    code = main(["bench", "tiny-random", "--device", "cpu", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and fragment in err[0]
    assert list(tmp_path.iterdir()) == []  # nothing written


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def test_tensor_parallel_bench_runs_two_ranks_and_rank_0_reports(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "inferlab.cli", "bench", "tiny-random", "--device", "cpu", "--layout", "tp:2",
         "--prompt-length", "8", "--output-length", "4", "--runs", "2", "--warmup", "0", "--no-probe",
         "--out", str(tmp_path)],
        env=_env(), capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert out.stdout.count("TPOT (ms)") == 1  # one report, from rank 0
    [saved] = tmp_path.glob("*-bench/bench.json")
    fingerprint = json.loads(saved.read_text())["fingerprint"]
    assert fingerprint["layout"] == "tp:2" and fingerprint["layout_devices"] == 2


WORKER = """
import sys, torch
from inferlab.decode.loop import DecodeConfig, generate_steps
from inferlab.model.layouts import Layout, leave_world, rank
from inferlab.model.registry import load_model
from inferlab.decode.prompts import random_prompt

loaded = load_model("tiny-random", torch.device("cpu"), torch.float32, layout=Layout("tp", 2))
shard = loaded.model.model.layers[0].self_attn.q_proj.weight.to_local().shape
prompt = random_prompt(512, 9, 2, torch.Generator().manual_seed(3), torch.device("cpu"))
steps = [(s.tokens.clone(), s.logits.clone()) for s in generate_steps(loaded.model, prompt, DecodeConfig(12, ignore_eos=True))]
if rank() == 0:
    torch.save({"shard": list(shard), "tokens": torch.stack([t for t, _ in steps], 1),
                "logits": torch.stack([l for _, l in steps], 1)}, sys.argv[1])
leave_world()
"""


def test_tensor_parallel_decoding_matches_the_single_device_model(tiny, tmp_path):
    from inferlab.decode.prompts import random_prompt

    script, saved = tmp_path / "worker.py", tmp_path / "tp.pt"
    script.write_text(WORKER)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          str(script), str(saved)],
                         env={**_env(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    tp = torch.load(saved)
    assert tp["shard"] == [32, 64]  # q_proj [64, 64] split by output rows over 2 ranks
    prompt = random_prompt(512, 9, 2, torch.Generator().manual_seed(3), torch.device("cpu"))
    # Teacher-forced on the TP run's own tokens: a full recompute on one device gives the logits
    # each cached TP step chose from. fp32; sharded sums add in another order, hence 1e-5.
    ids = torch.cat([prompt.input_ids, tp["tokens"][:, :-1]], dim=1)
    with torch.inference_mode():
        single = tiny.model(input_ids=ids).logits[:, prompt.length - 1 :].float()
    torch.testing.assert_close(tp["logits"], single, rtol=1e-4, atol=1e-5)
    assert torch.equal(tp["tokens"], tp["logits"].argmax(-1))  # greedy: each token is its step's argmax


def test_leaving_the_world_closes_the_process_group(tmp_path):
    import torch.distributed as dist

    from inferlab.model.layouts import leave_world

    leave_world()  # outside a world: nothing to close
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert dist.is_initialized()
    leave_world()
    assert not dist.is_initialized()
