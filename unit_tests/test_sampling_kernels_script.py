"""perf_tests/scripts/sampling_kernels.py: on the CPU (Triton's interpreter) every kernel and
phase it times runs and draws as `pick` does, the results keep every row, and bad arguments are
refused in one line with nothing written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "perf_tests" / "scripts" / "sampling_kernels.py"

pytest.importorskip("triton", reason="Triton is not installed (requirements/test.txt installs it)")


def run(tmp_path, *args, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), *args], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=timeout)


def test_every_kernel_and_phase_runs_on_the_cpu_and_draws_as_pick(tmp_path):
    # 1000 logits in 4 programs of 256 of 4 and of 2 warps, 2 rows
    done = run(tmp_path, "--device", "cpu", "--vocab", "1000", "--rows", "2", "--hidden", "8", "--chunk", "256",
               "--warps", "4,2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "no times" in done.stdout and "DIFFER" not in done.stdout
    saved = json.loads(next(tmp_path.glob("*-sampling/sampling.json")).read_text())
    rows = saved["rows"]
    assert saved["barrier_errors"] == 0
    assert {(r["vocab"], r["rows"]) for r in rows} == {(1000, 2)}
    kernels = [(r["setting"], r["kernel"]) for r in rows]
    assert ("greedy", "greedy step") in kernels
    shapes = ("split 256/4w", "split 256/2w")
    for setting in ("temperature 0.7", "temperature 0.7, top-p 0.9", "temperature 0.7, top-k 50"):
        assert (setting, "one program a row") in kernels and all((setting, shape) in kernels for shape in shapes)
        variants = {(setting, f"one program a row, {path}") in kernels for path in ("bisection", "fallback")}
        assert variants == {"top-p" in setting}
    # the maximum, the sum, the race with temperature only; the maximum, 4 top-p rounds, the race;
    # with top-k too, its 4 rounds before them
    for setting, phases in (("temperature 0.7", 3), ("temperature 0.7, top-p 0.9", 6),
                            ("temperature 0.8, top-k 50, top-p 0.9", 10)):
        assert sum(1 for s, k in kernels if s == setting and k.startswith("split 256/4w, phase")) == phases
    assert all(r["tokens_equal"] for r in rows if "tokens_equal" in r)
    assert all(r["us"] is None for r in rows)  # no clock under the interpreter


@pytest.mark.parametrize("args", [["--vocab", "32k"], ["--rows", "0"], ["--chunk", "300"], ["--warps", "3"]])
def test_bad_arguments_are_refused_in_one_line_and_nothing_is_written(tmp_path, args):
    done = run(tmp_path, "--device", "cpu", *args, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "sampling_kernels:" in done.stderr
    assert not list(tmp_path.iterdir())
