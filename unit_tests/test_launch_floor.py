"""perf_tests/scripts/launch_floor.py: the chain it times passes each kernel's result to the next,
its floor arithmetic, and its refusals."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "perf_tests" / "scripts" / "launch_floor.py"

pytest.importorskip("triton", reason="Triton is not installed (requirements/test.txt installs it)")


@pytest.fixture(scope="module")
def script(perf_script):
    return perf_script("launch_floor")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter case; on CUDA the script itself runs it")
@pytest.mark.parametrize("reduce", [False, True])
def test_each_link_reads_what_the_one_before_wrote(script, reduce):
    """Under Triton's interpreter: three links, each a function of the previous one's output."""
    a, b = torch.zeros(script.REDUCE_BLOCK), torch.zeros(script.REDUCE_BLOCK)
    a[:3] = torch.tensor([1.0, 2.0, 3.0])
    for launch in script.chain((a, b), 3, programs=2, reduce=reduce, pdl=False):
        launch()
    if reduce:  # a -> b: b[0:2] = 6 + 1; b -> a: a[0:2] = 14 + 1 (a[2] = 3 stays); a -> b: b[0:2] = 33 + 1
        assert b[:2].tolist() == [34.0, 34.0] and a[:3].tolist() == [15.0, 15.0, 3.0]
    else:  # each link reads element 0 and adds 1
        assert b[:2].tolist() == [4.0, 4.0] and a[:2].tolist() == [3.0, 3.0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter case; on CUDA the script itself runs it")
def test_each_barrier_separated_phase_reads_what_the_phase_before_wrote(script):
    """Under Triton's interpreter (one launch a phase): three phases, as three chained links."""
    a, b = torch.zeros(script.REDUCE_BLOCK), torch.zeros(script.REDUCE_BLOCK)
    a[:3] = torch.tensor([1.0, 2.0, 3.0])
    script.barrier_chain((a, b), 3, programs=2, sync=False)
    assert b[:2].tolist() == [34.0, 34.0] and a[:3].tolist() == [15.0, 15.0, 3.0]  # as the reduce links above


def test_the_step_floor_counts_every_kernel_and_every_byte(script):
    assert [script.POLICIES[p].decode_kernels(30, script.CACHE_LENGTH) for p in script.POLICIES] == [152, 182]
    # 152 boundaries of 1 us, and 270 MB at 3 TB/s (0.09 ms)
    assert script.step_floor_ms(152, 1.0, 270_000_000, 3e12) == pytest.approx(0.152 + 0.09)


@pytest.mark.parametrize("arguments, message", [(["--links", "1"], "--links must be at least 2"),
                                                (["--links", "50"], "needs a CUDA device")])
def test_it_refuses_in_one_line(arguments, message):
    if torch.cuda.is_available() and message == "needs a CUDA device":
        pytest.skip("this machine has a CUDA device")
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", "unused", *arguments], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=120)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
    assert not (ROOT / "unused").exists()
