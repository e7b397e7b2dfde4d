"""Every subcommand's error paths, in one table: one line on stderr, the README's exit code, no traceback."""

import re
from pathlib import Path

import pytest

from inferlab.cli import build_parser, main
from test_gate import SUITE, entry, noisy_rounds, run_dict, suite_file, write

README = Path(__file__).resolve().parents[1] / "README.md"
CPU = ["--device", "cpu"]
QUICK = ["--runs", "1", "--warmup", "0", "--no-probe"]


def files(tmp_path) -> dict:
    """Placeholders in the table, made real in tmp_path."""
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    base = suite_file(tmp_path / "base.json", seed=1)
    one_round = write(tmp_path / "one.json", run_dict([entry(c, noisy_rounds(m, 1, n=1)) for c, m in SUITE.items()]))
    machine = run_dict([entry(c, noisy_rounds(m, 1)) for c, m in SUITE.items()])
    machine["machine_info"]["inferlab"] = "cpu"
    return {"BROKEN": str(broken), "FILE": str(blocker), "UNWRITABLE": str(blocker / "sub"), "OUT": str(tmp_path / "out"),
            "BASE": base, "HEAD": suite_file(tmp_path / "head.json", seed=2), "ONE": one_round,
            "MACHINE": write(tmp_path / "machine.json", machine), "MISSING": str(tmp_path / "missing.json")}


CASES = [
    # command, argv, exit code, fragment of the one line
    ("env", ["env", "--verbose"], 2, "unrecognized arguments: --verbose"),
    ("inspect", ["inspect", "BROKEN", *CPU], 2, "config.json is not valid JSON"),
    ("inspect", ["inspect", "no-such-model", *CPU], 2, "unknown model 'no-such-model'"),
    ("inspect", ["inspect", "tiny-random", "--device", "warp9"], 2, "unknown device 'warp9'"),
    ("inspect", ["inspect", "tiny-random", *CPU, "--dtype", "fp7"], 2, "unknown dtype 'fp7'"),
    ("trace", ["trace", "tiny-random", *CPU, "--prompt", "hi", "--prompt-length", "4"], 2,
     "--prompt and --prompt-length both given"),
    ("trace", ["trace", "tiny-random", *CPU, "--prompt", "hi"], 2, "has no tokenizer (random weights)"),
    ("trace", ["trace", "tiny-random", *CPU, "--batch-size", "0"], 2, "expected a positive integer, got 0"),
    ("trace", ["trace", "tiny-random", *CPU, "--batch-size", "1000000000"], 5, "needs at least"),
    ("generate", ["generate", "tiny-random", *CPU, "--prompt", "hi"], 2, "has no tokenizer, and generate needs one"),
    ("generate", ["generate", "tiny-random", *CPU, "--prompt", "hi", "--temperature", "inf"], 2,
     "expected a finite number, got 'inf'"),
    ("generate", ["generate", "tiny-random", *CPU, "--prompt", "hi", "--top-p", "nan"], 2,
     "expected a finite number, got 'nan'"),
    ("generate", ["generate", "tiny-random", *CPU, "--prompt", "hi", "--seed", str(2**64)], 2,
     "expected an integer from 0 to 2**63 - 1"),
    ("bench", ["bench", "tiny-random", *CPU, "--prompt", "hi", "--prompt-length", "4", *QUICK], 2,
     "--prompt and --prompt-length both given"),
    ("bench", ["bench", "tiny-random", *CPU, "--seed", "1" + "0" * 30, *QUICK], 2, "expected an integer from 0 to 2**63 - 1"),
    ("bench", ["bench", "tiny-random", *CPU, "--engine", "warp", *QUICK, "--out", "OUT"], 2, "unknown engine 'warp'"),
    ("bench", ["bench", "tiny-random", *CPU, *QUICK, "--out", "UNWRITABLE"], 2, "cannot write results to"),
    ("bench", ["bench", "tiny-random", *CPU, "--batch-size", "100000000", "--prompt-length", "8", "--output-length", "4",
               *QUICK, "--out", "OUT"], 5, "needs at least"),
    ("bench", ["bench", "BROKEN", *CPU, *QUICK, "--out", "OUT"], 2, "config.json is not valid JSON"),
    ("sweep", ["sweep", "tiny-random", *CPU, "--batch-sizes", "1", "1", *QUICK], 2, "batch size 1 is given twice"),
    ("sweep", ["sweep", "tiny-random", *CPU, "--temperature", "nan", *QUICK], 2, "expected a finite number"),
    ("sweep", ["sweep", "tiny-random", *CPU, "--output-lengths", "4", "--prompt-lengths", "8", *QUICK, "--out", "UNWRITABLE"],
     2, "cannot write results to"),
    ("sweep", ["sweep", "tiny-random", *CPU, "--layout", "ring:3", *QUICK], 2, "unknown layout 'ring:3'"),
    ("sweep", ["sweep", "tiny-random", *CPU, "--max-runs", "-1", *QUICK], 2, "expected an integer >= 0, got -1"),
    ("sweep", ["sweep", "tiny-random", *CPU, "--top-up-s", "nan", *QUICK], 2, "expected a finite number, got 'nan'"),
    ("sweep", ["sweep", "tiny-random", *CPU, "--order", "sequential", "--max-runs", "5", *QUICK, "--out", "OUT"], 2,
     "max runs 5 above runs 1 tops up in interleaved rounds"),
    ("timing-demo", ["timing-demo", *CPU, "--size", "0"], 2, "expected a positive integer, got 0"),
    ("timing-demo", ["timing-demo", *CPU, "--size", "10000000"], 5, "needs at least"),
    ("gate", ["gate"], 2, "gate needs a base and a head run"),
    ("gate", ["gate", "MISSING", "HEAD"], 2, "no such file"),
    ("gate", ["gate", "BASE", "HEAD", "--base-runs", "BASE"], 2, "are the same base run given twice"),
    ("gate", ["gate", "ONE", "HEAD"], 2, "has 1 round(s); the gate needs at least 3"),
    ("gate", ["gate", "MACHINE", "HEAD"], 2, "machine_info.inferlab is a str"),
    ("gate", ["gate", "BASE", "HEAD", "--confidence", "nan"], 2, "expected a finite number"),
    ("gate", ["gate", "BASE", "HEAD", "--run-noise", "inf"], 2, "expected a finite number"),
    ("gate", ["gate", "FILE", "HEAD"], 2, "is not valid JSON"),
    ("gate", ["gate", "BASE", "HEAD", "--json", "/proc/self/g.json"], 4, "cannot write /proc/self/g.json"),
    ("gate", ["gate", "BASE", "HEAD", "--json", "BASE"], 2, "exists and is kept"),
    ("ab", ["ab"], 2, "ab needs two revisions"),
    ("ab", ["ab", "--base-cmd", "true"], 2, "not a mix"),
    ("calibrate", ["calibrate", "BASE"], 2, "at least 2 runs of the same code"),
    ("calibrate", ["calibrate", "BASE", "/nonexistent"], 2, "/nonexistent: no such file"),
    ("calibrate", ["calibrate", "BASE", "BASE"], 2, "given twice"),
    ("calibrate", ["calibrate", "BASE", "HEAD", "--noise-store", "UNWRITABLE"], 2, "cannot write results"),
    ("history", ["history", "/nonexistent"], 2, "no such file or folder"),
    ("history", ["history", "BASE", "--drift-budget", "abc"], 2, "give one percentage"),
]


def documented_codes() -> dict[str, set[int]]:
    """The README's per-command exit-code table: command -> codes."""
    section = README.read_text().split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)` \| ([0-9, ]+)", section, flags=re.M)
    return {command: {int(code) for code in codes.split(",")} for command, codes in rows}


def test_the_readme_documents_every_command():
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    assert set(documented_codes()) == commands


@pytest.mark.parametrize("command, argv, code, fragment", CASES, ids=[" ".join(c[1][:3]) for c in CASES])
def test_an_error_is_one_line_with_the_documented_exit_code(tmp_path, capsys, command, argv, code, fragment):
    paths = files(tmp_path)
    try:
        got = main([paths.get(arg, arg) for arg in argv])
    except SystemExit as exit_:  # argparse refusing an argument
        got = exit_.code
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if not line.startswith("loading ")]
    assert got == code and code in documented_codes()[command], err
    assert len(lines) == 1 and lines[0].startswith("inferlab: ") and fragment in lines[0], err
    assert "Traceback" not in out + err
    if command != "gate":
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.json"))
