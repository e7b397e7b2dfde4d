"""The command line: what users run, and one-line errors with exit code 2 for bad input."""

import json

import pytest

from inferlab.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, fragment):
    assert code == 2
    lines = [line for line in err.splitlines() if not line.startswith("loading ")]
    assert len(lines) == 1, err
    assert lines[0].startswith("inferlab: error: ") and fragment in lines[0]
    assert "Traceback" not in err


def test_env_reports_cuda_and_versions(capsys):
    code, out, _ = run(capsys, "env")
    assert code == 0
    assert "torch" in out and "transformers" in out and "CUDA" in out


def test_bench_prints_a_table_and_saves_json(capsys, tmp_path):
    code, out, _ = run(capsys, "bench", "tiny-random", "--device", "cpu", "--prompt-length", "5", "--output-length", "4",
                       "--runs", "2", "--warmup", "0", "--no-probe", "--out", str(tmp_path))
    assert code == 0
    assert "TTFT (ms)" in out and "TPOT (ms)" in out and "roofline" in out
    saved = list(tmp_path.glob("*-bench/bench.json"))
    assert len(saved) == 1
    assert len(json.loads(saved[0].read_text())["runs"]) == 2


def test_a_second_bench_never_overwrites_the_first(capsys, tmp_path):
    args = ["bench", "tiny-random", "--device", "cpu", "--prompt-length", "3", "--output-length", "2", "--runs", "1",
            "--warmup", "0", "--no-probe", "--out", str(tmp_path)]
    assert run(capsys, *args)[0] == 0
    first = next(tmp_path.glob("*-bench/bench.json"))
    before = first.read_bytes()
    assert run(capsys, *args)[0] == 0
    assert len(list(tmp_path.glob("*-bench*/bench.json"))) == 2
    assert first.read_bytes() == before


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["inspect", "no-such-model"], "unknown model 'no-such-model'"),
        (["inspect", "./no/such/folder"], "unknown model './no/such/folder'"),
        (["bench", "tiny-random", "--device", "cpu", "--output-length", "0"], "output length must be a positive integer"),
        (["bench", "tiny-random", "--device", "cpu", "--prompt-length", "500", "--output-length", "100", "--no-probe"],
         "exceed tiny-random's context of 512"),
        (["bench", "tiny-random", "--device", "cpu", "--engine", "nope"], "unknown engine 'nope'"),
        (["bench", "tiny-random", "--device", "cpu", "--dtype", "fp8"], "unknown dtype 'fp8'"),
        (["generate", "tiny-random", "--device", "cpu", "--prompt", "hi"], "has no tokenizer"),
        (["generate", "tiny-random", "--device", "cpu", "--prompt", "hi", "--top-k", "0"], "`top_k` has to be a strictly positive integer"),
        (["generate", "tiny-random", "--device", "cpu", "--prompt", "hi", "--temperature", "-1"], "`temperature` has to be"),
        (["generate", "tiny-random", "--device", "cpu", "--prompt", "hi", "--top-p", "2"], "`top_p` has to be"),
    ],
)
def test_bad_input_gives_one_line_and_exit_code_2(capsys, tmp_path, argv, fragment):
    code, _, err = run(capsys, *argv, *(["--out", str(tmp_path)] if argv[0] == "bench" else []))
    assert_one_line_error(code, err, fragment)


def test_hub_id_not_available_offline_names_the_offline_models(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run(capsys, "inspect", "no-such-org/no-such-model", "--device", "cpu")
    assert_one_line_error(code, err, "could not load 'no-such-org/no-such-model'")
    assert "smollm2-135m, tinyllama-1.1b-random, tiny-random" in err


def test_unwritable_results_folder_is_refused(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, _, err = run(capsys, "bench", "tiny-random", "--device", "cpu", "--out", str(blocker / "sub"))
    assert_one_line_error(code, err, "cannot write results to")


@pytest.mark.slow
def test_generate_verbose_prints_each_step_then_the_answer(capsys):
    code, out, _ = run(capsys, "generate", "smollm2-135m", "--device", "cpu", "--prompt", "What is the capital of France?",
                       "--max-new-tokens", "12", "--verbose")
    assert code == 0
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 8  # "The capital of France is Paris." is 7 tokens, then EOS
    assert "logits (1, 49152)" in steps[0] and "device cpu" in steps[0]
    assert out.strip().endswith("The capital of France is Paris.")


@pytest.mark.slow
def test_generate_with_an_empty_prompt_is_refused(capsys):
    code, _, err = run(capsys, "generate", "smollm2-135m", "--device", "cpu", "--prompt", "  ")
    assert_one_line_error(code, err, "empty prompt")


def test_a_bad_argument_is_one_line_too(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "tiny-random", "--runs", "0"])
    _, err = capsys.readouterr()
    assert exit_info.value.code == 2
    assert err.splitlines() == ["inferlab: error: argument --runs: expected a positive integer, got 0 (see inferlab sweep --help)"]
