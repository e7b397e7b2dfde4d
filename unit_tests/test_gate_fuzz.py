"""Property-based: whatever pytest-benchmark JSON the gate is given, it answers in one of two ways.

Either a verdict (exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE, the table on stdout and the --json
report written), or a one-line usage error with exit 2. Never a traceback or an internal error,
and never a file written anywhere but --json. Runs are valid pytest-benchmark runs, then
spoiled at random: a field replaced by any JSON value or removed, a round time made non-finite
or huge, the file replaced by random bytes, a run given twice.
"""

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from inferlab.cli import main

MACHINE = {"device_type": "cpu", "device_name": "Fuzz CPU", "device_count": 1, "model": "tiny-random",
           "dtype": "fp32", "layout": "single"}
NAMES = ("eager-p4-n8-ttft_ms", "eager-p4-n8-tpot_ms", "hf-p4-n8-e2e_ms")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
round_times = st.lists(st.floats(1e-6, 10.0), min_size=3, max_size=25)


@st.composite
def valid_runs(draw, names) -> dict:
    scale = draw(st.sampled_from([1.0, 1.0, 3.0]))  # a run three times slower: a FAIL now and then
    benchmarks = [
        {"name": f"test[{name}]", "fullname": f"perf/test_x.py::test[{name}]",
         "extra_info": {"metric": name.rsplit("-", 1)[1], "fingerprint": {"model": "tiny-random", "engine": "eager"}},
         "stats": {"data": [scale * r for r in draw(round_times)]}}
        for name in names
    ]
    return {"machine_info": {"inferlab": dict(MACHINE)}, "benchmarks": benchmarks, "datetime": draw(st.text(max_size=8))}


def paths_in(value, prefix=()):
    """Every key path into nested dicts and lists."""
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield from paths_in(child, prefix + (key,))


# Where a real file goes wrong most often; "replace" also picks any other place.
KEY_PATHS = [("machine_info",), ("machine_info", "inferlab"), ("benchmarks",), ("benchmarks", 0),
             ("benchmarks", 0, "stats"), ("benchmarks", 0, "stats", "data"), ("benchmarks", 0, "fullname"),
             ("benchmarks", 0, "extra_info"), ("benchmarks", 0, "extra_info", "metric"),
             ("benchmarks", 0, "extra_info", "fingerprint")]


def spoil(data, run: dict) -> bytes:
    """The run's file content, possibly spoiled one way."""
    how = data.draw(st.sampled_from(["none"] * 14 + ["replace", "replace key", "delete", "round", "few rounds", "bytes"]))
    if how == "bytes":
        return data.draw(st.binary(max_size=40))
    paths = [p for p in paths_in(run) if p]
    if how == "replace key":
        how, paths = "replace", KEY_PATHS
    if how in ("replace", "delete"):
        path = data.draw(st.sampled_from(paths))
        parent = run
        for key in path[:-1]:
            parent = parent[key]
        if how == "replace":
            parent[path[-1]] = data.draw(json_values)
        else:
            del parent[path[-1]]
    if how == "round":
        rounds = run["benchmarks"][0]["stats"]["data"]
        spoilt = data.draw(st.sampled_from([math.nan, math.inf, -1.0, 0.0, 1e308, 10**400, True, "1"]))
        rounds[:] = [spoilt] * len(rounds) if data.draw(st.booleans()) else [spoilt] + rounds[1:]
    if how == "few rounds":  # too few to show a run's noise
        rounds = run["benchmarks"][-1]["stats"]["data"]
        del rounds[data.draw(st.integers(0, 2)):]
    return json.dumps(run).encode()


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_the_gate_gives_a_verdict_or_a_one_line_usage_error(data):
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        files = []
        names = data.draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True))
        for index in range(data.draw(st.integers(2, 4), label="runs")):
            path = folder / f"run{index}.json"
            path.write_bytes(spoil(data, data.draw(valid_runs(names))))
            files.append(str(path))
        base, head, extra = files[0], files[1], files[2:]
        repeat = data.draw(st.sampled_from(["none", "twice", "split", "split"] if extra else ["none", "none", "twice"]))
        argv = ["gate", base, head]
        if repeat == "twice":
            argv += ["--base-runs", base]
        elif repeat == "split":
            argv += ["--base-runs", *extra[:1], "--head-runs", *(extra[1:] or [head])]
        argv += [f"--threshold={data.draw(st.sampled_from(['5%', '1%', 'tpot_ms=3%', '5%', '']) | st.text(max_size=6))}",
                 "--json", str(folder / "report.json")]
        before = sorted(folder.iterdir())
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse refusing an argument
                code = exit_.code
        out, err = out.getvalue(), err.getvalue()
        event(f"exit {code}: {err.replace(str(folder), '')[16:80]}")
        assert "Traceback" not in out + err
        if code in (0, 1, 3):
            assert err == "" and "gate: " in out
            # the verdicts as JSON and, beside them, the HTML page: nothing else
            assert sorted(folder.iterdir()) == sorted(before + [folder / "report.json", folder / "report.html"])
            report = json.loads((folder / "report.json").read_text())
            assert report["exit_code"] == code
            assert all(math.isfinite(row[key]) for row in report["rows"] for key in ("ratio", "ci_low", "ci_high"))
            for side in ("base_runs", "head_runs"):  # no run counted twice as independent evidence
                contents = [Path(p).read_bytes() for p in report[side]]
                assert len(set(contents)) == len(contents)
        else:
            assert code == 2, (code, err)
            assert len(err.splitlines()) == 1 and err.startswith("inferlab: error: "), err
            assert sorted(folder.iterdir()) == before
