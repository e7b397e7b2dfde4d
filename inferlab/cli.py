"""The `inferlab` command: argparse lives here and nowhere else.

Every error ends as one line on stderr with its own exit code (`inferlab.errors` lists them):
2 for bad input, 4 for a result that cannot be written, 5 for out of memory; exit 1 is the
gate's FAIL and nothing else.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from pathlib import Path

from inferlab import errors
from inferlab.errors import UsageError, first_line
from inferlab.names import ENGINE_NAMES

SAMPLING_HELP = "greedy unless --temperature, --top-k or --top-p is given (applied in that order)"


def _int_at_least(minimum: int, wording: str):
    """An argparse type: an integer >= `minimum`, refused in one line otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wording}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {wording}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_non_negative_int = _int_at_least(0, "an integer >= 0")

MAX_SEED = 2**63 - 1  # torch generators and int64 fields take seeds up to here


def _seed(text: str) -> int:
    value = _non_negative_int(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to 2**63 - 1, got {text}")
    return value


def _finite_float(text: str) -> float:
    """An argparse type: a finite float; inf and nan are refused in one line."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _add_model_args(parser: argparse.ArgumentParser, optional_model: bool = False) -> None:
    help_text = "Hugging Face id, local folder, or smollm2-135m / tinyllama-1.1b-random / tiny-random"
    if optional_model:
        parser.add_argument("model", nargs="?", default=None, help=help_text + " (default: the device's default model)")
    else:
        parser.add_argument("model", help=help_text)
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--dtype", default=None, help="bf16, fp16 or fp32 (default: bf16 on CUDA, fp32 on CPU)")


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling", SAMPLING_HELP)
    group.add_argument("--temperature", type=_finite_float, default=None)
    group.add_argument("--top-k", type=int, default=None)
    group.add_argument("--top-p", type=_finite_float, default=None)
    group.add_argument("--seed", type=_seed, default=0, help="seeds the sampler's generator and random prompts")


def _add_bench_args(parser: argparse.ArgumentParser, warmup: int = 2) -> None:
    parser.add_argument("--layout", default="single",
                        help="single (default), tp:N (tensor parallel over N GPUs, launched with torchrun) "
                             "or pipeline:N (consecutive layers on N GPUs, accelerate device_map)")
    parser.add_argument("--warmup", type=_non_negative_int, default=warmup,
                        help=f"warm-up runs, not recorded (default {warmup})")
    parser.add_argument("--runs", type=_positive_int, default=5, help="measured runs (default 5)")
    parser.add_argument("--no-probe", action="store_true", help="use the datasheet bandwidth instead of measuring a device copy")
    parser.add_argument("--out", type=Path, default=Path("results"), help="results folder (default ./results)")
    parser.add_argument("--profile", action="store_true",
                        help="after the timed runs, record a torch.profiler trace of a few decode steps "
                             "(Chrome/Perfetto JSON beside the results) and list the top kernels per step")


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (no usage block), like every other inferlab error."""

    def error(self, message: str):
        self.exit(2, f"inferlab: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="inferlab", description="See how a causal LM generates text, and measure it.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser("env", help="CUDA, devices, memory and library versions")

    inspect = commands.add_parser("inspect", help="parameters, dtypes, devices, config and memory of a model")
    _add_model_args(inspect)
    inspect.add_argument("--json", action="store_true", help="print JSON instead of text")

    trace = commands.add_parser("trace", help="one prefill and one cached decode step, stage by stage, with shapes")
    _add_model_args(trace)
    trace.add_argument("--prompt", default=None, help="text prompt (default: random ids, see --prompt-length)")
    trace.add_argument("--prompt-length", type=_positive_int, default=None, help="random prompt length (default 8)")
    trace.add_argument("--batch-size", type=_positive_int, default=1)
    trace.add_argument("--all-layers", action="store_true", help="show every decoder layer, not only the first")
    trace.add_argument("--engine", choices=("eager", "fast"), default="eager",
                       help="eager: the transformers model, stage by stage (default); fast: the fast engine's "
                            "decode step, kernel by kernel, checked against transformers")

    generate = commands.add_parser("generate", help="generate text with the manual decode loop")
    _add_model_args(generate)
    generate.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    generate.add_argument("--max-new-tokens", type=_positive_int, default=64)
    generate.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    generate.add_argument("--no-chat", action="store_true", help="do not apply the tokenizer's chat template")
    generate.add_argument("--verbose", action="store_true", help="print every decode step")
    _add_sampling_args(generate)

    bench = commands.add_parser("bench", help="time one configuration: TTFT, TPOT, ITL, tokens/s with percentiles")
    _add_model_args(bench, optional_model=True)
    bench.add_argument("--engine", default="eager", help=f"one of {', '.join(ENGINE_NAMES)} (default eager)")
    bench.add_argument("--prompt", default=None, help="text prompt instead of random ids")
    bench.add_argument("--prompt-length", type=_positive_int, default=None, help="random prompt length in tokens (default 128)")
    bench.add_argument("--batch-size", type=int, default=1)
    bench.add_argument("--output-length", type=int, default=128, help="tokens generated, EOS ignored (default 128)")
    bench.add_argument("--events", choices=("per-token", "endpoints"), default="per-token",
                       help="CUDA events after every token (default) or after the first and last only")
    _add_bench_args(bench)
    _add_sampling_args(bench)

    sweep = commands.add_parser("sweep", help="the output-length experiment (and prompt length, batch size)")
    _add_model_args(sweep, optional_model=True)
    sweep.add_argument("--engines", nargs="+", default=None,
                       help=f"engines to compare, some of {', '.join(ENGINE_NAMES)} (default: eager hf fast on CUDA, eager on the CPU)")
    sweep.add_argument("--output-lengths", nargs="+", type=int, default=[10, 50, 100, 500])
    sweep.add_argument("--prompt-lengths", nargs="+", type=int, default=[128])
    sweep.add_argument("--batch-sizes", nargs="+", type=int, default=[1])
    sweep.add_argument("--order", choices=("interleaved", "sequential"), default="interleaved",
                       help="interleaved (default): warm-ups first, then rounds visiting every configuration once in "
                            "an order shuffled anew each round from --seed; sequential: one configuration after another")
    sweep.add_argument("--inject-delay-per-position-us", type=float, default=0.0, metavar="US",
                       help="test the verdicts: each decode step waits US microseconds x its cache position "
                            "(TPOT then grows with the context; off by default)")
    sweep.add_argument("--max-runs", type=_non_negative_int, default=0, metavar="N",
                       help="top-up: while a group's hypotheses are INCONCLUSIVE, measure its configurations in more "
                            "interleaved rounds, up to N runs each (the main job, tox -e sweep, asks for 10); "
                            "default 0: exactly --runs")
    sweep.add_argument("--top-up-s", type=_finite_float, default=None, metavar="S",
                       help="seconds for all top-up rounds together; a round that would end later is not started "
                            "(default 180)")
    _add_bench_args(sweep, warmup=1)  # per configuration; compiling engines compile in prepare, before it
    _add_sampling_args(sweep)

    demo = commands.add_parser("timing-demo", help="why GPU work must be timed with events or after a sync")
    demo.add_argument("--device", default=None)
    demo.add_argument("--size", type=_positive_int, default=8192, help="square matrix size (default 8192)")
    demo.add_argument("--repeats", type=_positive_int, default=20)

    gate = commands.add_parser("gate", help="PASS / FAIL / INCONCLUSIVE on head vs base pytest-benchmark runs")
    gate.add_argument("base", nargs="?", type=Path, help="base run saved with --benchmark-autosave --benchmark-save-data")
    gate.add_argument("head", nargs="?", type=Path, help="head run, same tests on the same machine")
    gate.add_argument("--base-runs", nargs="+", type=Path, default=[], help="more repeats of the base run")
    gate.add_argument("--head-runs", nargs="+", type=Path, default=[], help="more repeats of the head run")
    gate.add_argument("--threshold", default="5%", help="slowdown that counts, e.g. 5%% or tpot_ms=3%%,default=5%%")
    gate.add_argument("--confidence", type=_finite_float, default=0.95, help="family-wise confidence (default 0.95)")
    gate.add_argument("--run-noise", default="0.01",
                      help="process-to-process spread of a run's median, as a fraction (default 0.01), or "
                           "'calibrated': the newest record inferlab ab or inferlab calibrate saved for this machine")
    gate.add_argument("--noise-store", type=Path, default=None, help="where run-noise records live (default .inferlab/run-noise)")
    gate.add_argument("--tails", default="p99", help="tail percentiles judged on TPOT and ITL beside the median (default p99; none)")
    gate.add_argument("--budget", action="append", default=[], metavar="[PATTERN:]KEY=VALUE",
                      help="absolute budget on the head runs, e.g. tpot_ms=1.0, ttft_ms_p99=30, fast-*:tpot_floor_x=1.5 (repeatable)")
    gate.add_argument("--reference", nargs="+", type=Path, default=[], help="pinned reference run(s) for --drift-budget")
    gate.add_argument("--drift-budget", default=None, help="largest cumulative slowdown of head against --reference, e.g. 5%%")
    gate.add_argument("--json", type=Path, default=None,
                      help="also write the verdicts to this new JSON file, and the HTML report beside it (.html)")
    gate.add_argument("--profiles", nargs=2, type=Path, default=None, metavar=("BASE.json", "HEAD.json"),
                      help="bench.json files written by `inferlab bench --profile` for base and head: on FAIL, "
                           "print the kernels whose time per step grew most")

    calibrate = commands.add_parser("calibrate", help="save the run noise of repeated runs of unchanged code for --run-noise calibrated")
    calibrate.add_argument("runs", nargs="+", type=Path, help="8 or more runs of the same code on this machine, one pytest session each")
    calibrate.add_argument("--noise-store", type=Path, default=None, help="where the record is saved (default .inferlab/run-noise)")

    ab = commands.add_parser("ab", help="interleaved A/B of two git revisions (or two commands) until the gate decides")
    ab.add_argument("base", nargs="?", help="base git revision (branch, tag or commit)")
    ab.add_argument("head", nargs="?", help="head git revision")
    ab.add_argument("--repo", type=Path, default=Path("."), help="the git repository of the revisions (default .)")
    ab.add_argument("--suite", default=None,
                    help="command run in each side's worktree; {out} is the run's JSON path, else --benchmark-json={out} "
                         "--benchmark-save-data is appended (default: the CPU perf tests, not the slow ones)")
    ab.add_argument("--fork", action="store_true",
                    help="run each pytest run in a child forked from one process that imported torch and transformers "
                         "once (each run still loads, compiles and measures on its own); revisions only")
    ab.add_argument("--base-cmd", default=None, help="instead of revisions: the base side's command, writing a run to {out}")
    ab.add_argument("--head-cmd", default=None, help="the head side's command")
    ab.add_argument("--threshold", default="5%", help="slowdown that counts, e.g. 5%% or tpot_ms=3%%,default=5%%")
    ab.add_argument("--confidence", type=_finite_float, default=0.95, help="family-wise, over benchmarks and looks (default 0.95)")
    ab.add_argument("--min-pairs", type=_positive_int, default=3, help="pairs before the first look (default 3)")
    ab.add_argument("--max-pairs", type=_positive_int, default=20, help="stop after this many pairs (default 20)")
    ab.add_argument("--max-minutes", type=_finite_float, default=15.0, help="start no pair that would end later (default 15)")
    ab.add_argument("--out", type=Path, default=Path("results"), help="runs and ab.json go to a new folder here")
    ab.add_argument("--noise-store", type=Path, default=None, help="where the measured run noise is saved (default .inferlab/run-noise)")

    history = commands.add_parser("history", help="trend, change points and drift budget over saved runs, per machine")
    history.add_argument("paths", nargs="+", type=Path, help="a .benchmarks folder, or saved run files")
    history.add_argument("--order", choices=("time", "commit"), default="time", help="run time (default) or commit time")
    history.add_argument("--reference", type=Path, default=None, help="pinned reference run (default: each trail's first)")
    history.add_argument("--drift-budget", default="5%", help="largest cumulative slowdown against the reference (default 5%%)")
    history.add_argument("--window", type=_positive_int, default=3, help="latest runs averaged for the drift (default 3)")
    history.add_argument("--out", type=Path, default=None, help="write plots and history.json to a new folder here")
    return parser


def _sampling(args):
    from inferlab.decode.sampling import SamplingConfig

    sample = args.temperature is not None or args.top_k is not None or args.top_p is not None
    if not sample:
        return SamplingConfig()
    try:
        return SamplingConfig(
            greedy=False,
            temperature=1.0 if args.temperature is None else args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
        )
    except ValueError as error:
        raise UsageError(f"{error}: fix --temperature / --top-k / --top-p") from None


def _prompt_length(args, default: int) -> int:
    """--prompt-length, or its default; a usage error when --prompt is given too (one of them would be ignored)."""
    if args.prompt is not None and args.prompt_length is not None:
        raise UsageError("--prompt and --prompt-length both given: pass a text prompt or a random prompt length, not both")
    return default if args.prompt_length is None else args.prompt_length


def _load(args, default: bool = False):
    from inferlab.model import layouts
    from inferlab.model.devices import resolve_device, resolve_dtype
    from inferlab.model.registry import default_model, load_model

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the CLI prints its own one-line status
    layout = layouts.parse_layout(getattr(args, "layout", None))
    device = resolve_device(args.device)
    if layouts.is_launched_worker():
        device = layouts.worker_device(device)
    dtype = resolve_dtype(args.dtype, device)
    name = args.model if args.model is not None else default_model(device)
    where = f"{device}" if layout.kind == "single" else f"{device}, layout {layout}"
    print(f"loading {name} on {where} in {str(dtype).replace('torch.', '')} ...", file=sys.stderr)
    return load_model(name, device, dtype, layout=layout)


def cmd_env(args) -> int:
    from inferlab.look.inspection import environment_report, format_environment

    print(format_environment(environment_report()))
    return 0


def cmd_inspect(args) -> int:
    from inferlab.look.inspection import format_model_report, inspect_model, report_dict

    report = inspect_model(_load(args))
    print(json.dumps(report_dict(report), indent=2) if args.json else format_model_report(report))
    return 0


def cmd_trace(args) -> int:
    import torch

    from inferlab.decode.prompts import from_texts, random_prompt
    from inferlab.look.trace import format_trace, trace_forward
    from inferlab.model.fit import check_memory

    prompt_length = _prompt_length(args, 8)
    loaded = _load(args)
    if args.prompt is not None:
        prompt = from_texts(loaded.tokenizer, [args.prompt] * args.batch_size, loaded.device)
    else:
        check_memory(loaded, args.batch_size, prompt_length, 1)  # before the prompt is allocated
        generator = torch.Generator().manual_seed(0)
        prompt = random_prompt(loaded.model.config.vocab_size, prompt_length, args.batch_size, generator, loaded.device)
    if args.engine == "fast":
        from inferlab.look.fast_trace import format_fast_trace, trace_fast_decode

        print(format_fast_trace(trace_fast_decode(loaded.model, prompt, all_layers=args.all_layers)))
        return 0
    print(format_trace(trace_forward(loaded.model, prompt, all_layers=args.all_layers)))
    return 0


def cmd_generate(args) -> int:
    import torch

    from inferlab.measure.bench import check_fits
    from inferlab.model.fit import check_memory
    from inferlab.decode.loop import DecodeConfig, eos_token_ids, generate
    from inferlab.decode.prompts import from_texts

    sampling = _sampling(args)
    if any(not text.strip() for text in args.prompt):
        raise UsageError("empty prompt: pass some text with --prompt")
    loaded = _load(args)
    if loaded.tokenizer is None:
        raise UsageError(f"{loaded.name} has no tokenizer, and generate needs one to read --prompt: "
                         "use smollm2-135m, or a model folder that holds tokenizer files")
    prompt = from_texts(loaded.tokenizer, args.prompt, loaded.device, chat=not args.no_chat)
    check_fits(loaded, prompt.length, args.max_new_tokens)
    check_memory(loaded, prompt.batch_size, prompt.length, args.max_new_tokens)
    eos = eos_token_ids(loaded.model.generation_config)
    config = DecodeConfig(args.max_new_tokens, sampling, args.ignore_eos, eos, loaded.tokenizer.pad_token_id)
    generator = torch.Generator(device=loaded.device).manual_seed(args.seed)

    def show(step) -> None:
        pieces = [repr(loaded.tokenizer.decode([t])) for t in step.tokens.tolist()]
        print(
            f"step {step.index:>3} | seq_len {step.seq_len:>4} | logits {tuple(step.logits.shape)} | "
            f"token {step.tokens.tolist()} {' '.join(pieces)} | device {step.logits.device}"
        )

    out = generate(loaded.model, prompt, config, generator, on_step=show if args.verbose else None)
    for text, row in zip(args.prompt, out.tokens):
        if len(args.prompt) > 1 or args.verbose:
            print(f"--- {text}")
        print(loaded.tokenizer.decode(row, skip_special_tokens=True))
    return 0


def _bandwidth(loaded, no_probe: bool):
    from inferlab.measure import fingerprint
    from inferlab.measure import roofline

    return roofline.device_bandwidth(loaded.device, fingerprint.device_name(loaded.device), probe=not no_probe)


def cmd_bench(args) -> int:
    from inferlab.model import layouts
    from inferlab.measure.bench import BenchConfig, run_benchmark
    from inferlab.look.tables import format_result
    from inferlab.storage import new_run_folder, save_json_or_fallback

    config = BenchConfig(
        engine=args.engine, prompt_length=_prompt_length(args, 128), prompt_text=args.prompt, batch_size=args.batch_size,
        output_length=args.output_length, warmup_runs=args.warmup, runs=args.runs, seed=args.seed,
        sampling=_sampling(args), per_token_events=args.events == "per-token",
    )
    reporting = layouts.rank() == 0  # under tensor parallelism every rank runs, rank 0 reports
    folder = new_run_folder(args.out, "bench") if reporting else None
    loaded = _load(args)
    trace = folder / "bench.trace.json" if reporting and args.profile else None
    result = run_benchmark(loaded, config, _bandwidth(loaded, args.no_probe), profile_trace=trace)
    if not reporting:
        return 0
    print(format_result(result))
    path = save_json_or_fallback(folder / "bench.json", result.to_dict())
    print(f"saved {path}")
    return 0


def cmd_sweep(args) -> int:
    import tempfile

    from inferlab.model import layouts
    from inferlab.look import tables
    from inferlab.suite import progress, sweep
    from inferlab.look import sweep_files
    from inferlab.storage import new_run_folder

    config = sweep.SweepConfig(
        model=args.model or "", engines=tuple(args.engines), output_lengths=tuple(args.output_lengths),
        prompt_lengths=tuple(args.prompt_lengths), batch_sizes=tuple(args.batch_sizes),
        warmup_runs=args.warmup, runs=args.runs, seed=args.seed, sampling=_sampling(args), order=args.order,
        inject_delay_per_position_us=args.inject_delay_per_position_us, max_runs=args.max_runs,
        top_up_s=sweep.DEFAULT_TOP_UP_S if args.top_up_s is None else args.top_up_s,
    )
    loaded = _load(args)
    sweep.check_all_fit(loaded, config)  # before the folder exists: a refused sweep leaves nothing behind
    if layouts.rank() != 0:  # a tensor-parallel worker: runs every step with rank 0, reports nothing
        with tempfile.TemporaryDirectory() as scratch:
            sweep.run_sweep(loaded, config, Path(scratch), _bandwidth(loaded, args.no_probe))
        return 0
    folder = new_run_folder(args.out, "sweep")
    try:
        report = sweep.run_sweep(loaded, config, folder, _bandwidth(loaded, args.no_probe), progress.TqdmProgress(),
                                 profile=args.profile, write=sweep_files.write_outputs)
    except KeyboardInterrupt as stop:
        how = "stopped by SIGTERM" if isinstance(stop, errors.Terminated) else "interrupted"
        print(f"inferlab: {how}: finished configurations are saved in {folder}", file=sys.stderr)
        return errors.EXIT_TERMINATED if isinstance(stop, errors.Terminated) else errors.EXIT_INTERRUPTED
    print(tables.format_sweep_table(report))
    print(f"saved {folder}")
    return 0


def cmd_timing_demo(args) -> int:
    from inferlab.model.devices import resolve_device
    from inferlab.look.timing_demo import format_demo, run_demo
    from inferlab.model.fit import check_need

    device = resolve_device(args.device)
    check_need(4 * args.size**2 * 2, device, f"--size {args.size}", "for its bf16 matrices", "choose a smaller --size")
    print(format_demo(run_demo(device, args.size, args.repeats)))
    return 0


def cmd_gate(args) -> int:
    from inferlab.look import html_report, profile_diff
    from inferlab.storage import write_text_atomic
    from inferlab.suite import gate
    from inferlab.suite.gate.budgets import parse_budget_option
    from inferlab.suite.gate.judge import judge
    from inferlab.suite.gate.judge_report import format_judgement, write_judgement_json
    from inferlab.suite.gate.quantiles import parse_tails

    base = ([args.base] if args.base else []) + list(args.base_runs)
    head = ([args.head] if args.head else []) + list(args.head_runs)
    if not base or not head:
        raise UsageError("gate needs a base and a head run: inferlab gate BASE.json HEAD.json")
    base_runs = [gate.load_run(p) for p in base]
    head_runs = [gate.load_run(p) for p in head]
    gate.check_comparable(base_runs, head_runs)
    profiles = [profile_diff.load_profile(p) for p in args.profiles] if args.profiles else None
    page = _html_beside(args.json)
    run_noise = _run_noise(args.run_noise, args.noise_store, head_runs[0])
    judgement = judge(
        base_runs, head_runs, thresholds=gate.parse_thresholds(args.threshold), confidence=args.confidence,
        run_noise=run_noise, tails=parse_tails(args.tails), budgets=[parse_budget_option(b) for b in args.budget],
        reference_runs=[gate.load_run(p) for p in args.reference], drift_budget=_drift_budget(args.drift_budget),
    )
    print(format_judgement(judgement))
    changes = None
    if profiles and judgement.verdict == gate.FAIL:
        changes = profile_diff.kernel_diff(*profiles)
        print(profile_diff.format_kernel_diff(changes, *profiles))
    if args.json is not None:
        write_judgement_json(judgement, args.json)
        write_text_atomic(page, html_report.gate_html(judgement, base_runs[0].machine, changes))
    return judgement.exit_code


def _run_noise(text: str, store: Path | None, head_run):
    """--run-noise: a fraction >= 0, or 'calibrated' (per benchmark, from the store's newest record for this machine)."""
    from inferlab.suite.gate.calibration import DEFAULT_STORE, latest_run_noise

    if text == "calibrated":
        noise, path = latest_run_noise(store or DEFAULT_STORE, head_run)
        print(f"run noise: calibrated, from {path}")
        return noise
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--run-noise must be a fraction such as 0.01 or 'calibrated', got {text!r}") from None
    if not math.isfinite(value):
        raise UsageError(f"--run-noise: expected a finite number, got {text!r}")
    if value < 0:
        raise UsageError(f"--run-noise must be >= 0, got {text}")
    return value


def _drift_budget(text: str | None) -> float | None:
    from inferlab.suite.gate.thresholds import parse_thresholds

    if text is None:
        return None
    try:
        parsed = parse_thresholds(text)
    except UsageError:
        parsed = {}
    if set(parsed) != {"default"}:
        raise UsageError(f"--drift-budget {text!r}: give one percentage, e.g. 5%")
    return parsed["default"]


def cmd_ab(args) -> int:
    from inferlab.look.ab_report import format_look_line, format_outcome
    from inferlab.storage import new_run_folder, write_json_atomic
    from inferlab.suite import ab
    from inferlab.suite.gate.calibration import DEFAULT_STORE, save_run_noise
    from inferlab.suite.gate.stats import CALIBRATION_CONFIDENCE
    from inferlab.suite.gate.load import load_run
    from inferlab.suite.gate.thresholds import parse_thresholds
    from inferlab.suite.forked import ForkServer

    commands = bool(args.base_cmd or args.head_cmd)
    if commands and (args.base or args.head or not (args.base_cmd and args.head_cmd)):
        raise UsageError("ab takes two revisions (inferlab ab BASE HEAD) or both --base-cmd and --head-cmd, not a mix")
    if not commands and not (args.base and args.head):
        raise UsageError("ab needs two revisions: inferlab ab origin/main HEAD (or --base-cmd and --head-cmd)")
    if commands and args.fork:
        raise UsageError("--fork runs the --suite pytest command in each worktree: use it with two revisions, "
                         "not with --base-cmd and --head-cmd")
    arguments = ab.pytest_arguments(args.suite or ab.DEFAULT_SUITE) if args.fork else None
    plan = ab.Plan(parse_thresholds(args.threshold), args.confidence, args.min_pairs, args.max_pairs, args.max_minutes)
    if commands:
        sides = {"base": args.base_cmd, "head": args.head_cmd}
        revisions = None
    else:
        revisions = {side: ab.resolve_revision(args.repo, rev) for side, rev in (("base", args.base), ("head", args.head))}
        sides = {side: f"{rev} ({revisions[side][:12]})" for side, rev in (("base", args.base), ("head", args.head))}
    folder = new_run_folder(args.out, "ab")
    print(f"ab: runs go to {folder}")
    trees, server = {}, None
    try:
        if revisions is not None:
            trees = ab.add_worktrees(args.repo, revisions, folder)
            suite = args.suite or ab.DEFAULT_SUITE
            if args.fork:
                server = ForkServer(dict(os.environ))  # each child puts its worktree first on sys.path
                runner = ab.forked_runner(server, arguments, trees, folder)
            else:
                runner = ab.command_runner({side: suite for side in ab.SIDES}, trees, ab.worktree_env(trees), logs=folder)
        else:
            runner = ab.command_runner(sides, logs=folder)
        outcome = ab.run_ab(runner, plan, folder, on_look=lambda o: print(format_look_line(o), flush=True))
    finally:
        if server is not None:
            server.close()
        if trees:
            ab.remove_worktrees(args.repo, trees)
    print(format_outcome(outcome, plan))
    write_json_atomic(folder / "ab.json", ab.outcome_dict(outcome, plan, sides))
    noise = ab.calibrated_noise(outcome)  # the 95% upper bound: a low estimate would raise false alarms
    if noise:
        record = save_run_noise(args.noise_store or DEFAULT_STORE, load_run(outcome.base_paths[0]), noise,
                                {"source": "inferlab ab", "pairs": outcome.pairs, "ab": str(folder / "ab.json"),
                                 "run_noise_estimate": ab.measured_noise(outcome),
                                 "confidence": CALIBRATION_CONFIDENCE})
        print(f"run noise saved to {record} (inferlab gate --run-noise calibrated uses it on this machine)")
    if outcome.stopped_by == "interrupted":
        print("inferlab: interrupted; finished runs are kept", file=sys.stderr)
        return 130
    return outcome.last.exit_code if outcome.last else 3


def cmd_calibrate(args) -> int:
    """Per benchmark, the spread of the runs' log medians and its 95% upper bound, saved as this
    machine's record; each benchmark keeps its own (a graph-replayed TPOT may spread 0.04% where
    the TTFT beside it spreads 2.7%: one value for both would blind the gate to the TPOT)."""
    from inferlab.suite import gate
    from inferlab.suite.gate.calibration import DEFAULT_STORE, machine_key, machine_id, save_run_noise

    if len(args.runs) < 2:
        raise UsageError(f"calibrate needs at least 2 runs of the same code, got {len(args.runs)}: "
                         "save 8 or more, one pytest session each")
    runs = [gate.load_run(p) for p in args.runs]
    gate.check_comparable(runs, runs[:1])  # every run distinct, same benchmarks, machine, model, dtype, engine
    machines = {machine_id(machine_key(run)) for run in runs}
    if len(machines) > 1:
        raise UsageError("the runs come from different hosts: calibrate each machine from its own runs")
    estimate = gate.estimate_run_noise(runs)
    noise = gate.calibrated_run_noise(runs)
    width = max(len(name) for name in noise)
    print(f"{'benchmark':<{width}}  spread  95% bound (saved)")
    for name in runs[0].names:
        print(f"{name:<{width}}  {100 * estimate[name]:6.3f}%  {100 * noise[name]:6.3f}%")
    record = save_run_noise(args.noise_store or DEFAULT_STORE, runs[0], noise,
                            {"source": "inferlab calibrate", "runs": [str(p) for p in args.runs],
                             "run_noise_estimate": estimate, "confidence": gate.CALIBRATION_CONFIDENCE})
    print(f"run noise saved to {record} (inferlab gate --run-noise calibrated uses it on this machine)")
    if len(runs) < 8:
        print(f"{len(runs)} runs: the bound is {gate.noise_upper_bound(1.0, len(runs) - 1):.1f}x the spread; "
              "8 or more runs make it tighter (x1.8)")
    return 0


def cmd_history(args) -> int:
    from inferlab.look.history_report import format_history, history_dict, plot_name, plot_trail
    from inferlab.storage import new_run_folder, write_json_atomic
    from inferlab.suite import history

    runs, skipped = history.load_runs(history.run_files(args.paths))
    if args.reference is not None and not args.reference.is_file():
        raise UsageError(f"--reference {args.reference}: no such file: pass one of the saved runs")
    budget = _drift_budget(args.drift_budget)
    reports = [history.analyse(trail, budget, args.reference, args.window) for trail in history.trails(runs, args.order)]
    if args.reference is not None and not any(r.drift for r in reports):
        raise UsageError(f"--reference {args.reference} is not among the runs read: pass it with the others")
    print(format_history(reports))
    if skipped:
        print(f"skipped {len(skipped)} file(s) that are not saved runs (e.g. {skipped[0]})")
    if args.out is not None:
        folder = new_run_folder(args.out, "history")
        for index, report in enumerate(reports):
            plot_trail(report, folder / plot_name(report, index))
        write_json_atomic(folder / "history.json", history_dict(reports))
        print(f"saved {folder}")
    return 1 if any(r.drift and r.drift.over_budget for r in reports) else 0


def _html_beside(json_path: Path | None) -> Path | None:
    """The gate's HTML page beside its JSON; refused early if it exists (nothing is overwritten)."""
    if json_path is None:
        return None
    page = json_path.with_suffix(".html") if json_path.suffix != ".html" else json_path.with_name(json_path.name + ".html")
    if page.exists():
        raise UsageError(f"{page} exists and is kept: choose another --json path")
    return page


COMMANDS = {
    "env": cmd_env,
    "inspect": cmd_inspect,
    "trace": cmd_trace,
    "generate": cmd_generate,
    "bench": cmd_bench,
    "sweep": cmd_sweep,
    "timing-demo": cmd_timing_demo,
    "gate": cmd_gate,
    "history": cmd_history,
    "ab": cmd_ab,
    "calibrate": cmd_calibrate,
}


def _default_sweep_engines(args) -> tuple[str, ...]:
    from inferlab.model import layouts
    from inferlab.model.devices import resolve_device
    from inferlab.suite import sweep

    split = layouts.parse_layout(args.layout).kind != "single"
    return sweep.default_engines(resolve_device(args.device), split)


def _sweep_max_runs(args) -> int:
    """--max-runs (default 0: no top-up), refused above --runs across tensor-parallel ranks, which
    must run the same rounds while each rank times its own runs (their verdicts could differ); a
    sequential sweep refuses it in `SweepConfig`. Off by default: the default GPU sweep's eager and hf groups stay
    undecided at any affordable count on a bimodal host, and the budget would only lengthen it."""
    from inferlab.model import layouts

    if layouts.parse_layout(args.layout).kind == "tp" and args.max_runs > args.runs:
        raise UsageError(f"--max-runs {args.max_runs} tops up on verdicts that each tensor-parallel rank would judge "
                         f"on its own timings: use --max-runs 0 with --layout {args.layout}")
    return args.max_runs


def _launch_if_needed(args, argv: list[str]) -> int | None:
    """For a multi-process layout: check it, then run this same command under torchrun."""
    if not hasattr(args, "layout"):
        return None
    from inferlab.model import layouts
    from inferlab.measure.bench import check_engine_layout
    from inferlab.model.devices import resolve_device

    layout = layouts.parse_layout(args.layout)
    for engine in getattr(args, "engines", None) or [args.engine]:
        check_engine_layout(engine, layout)
    if not layouts.is_launched_worker():
        layouts.check_devices(layout, resolve_device(args.device))
    if layouts.needs_launch(layout):
        return layouts.launch(layout, argv)
    if layouts.rank() != 0:
        sys.stdout = open(os.devnull, "w")  # rank 0 alone prints the results
    return None


def _is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    if "torch" not in sys.modules:
        return False
    from inferlab.suite.sweep import is_out_of_memory

    return is_out_of_memory(error)


def _raise_terminated(signum, frame):
    raise errors.Terminated()


def _handle_sigterm():
    """SIGTERM (CI, `timeout`) raises Terminated, a KeyboardInterrupt, so it cleans up as Ctrl-C does."""
    try:
        return signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: signals cannot be handled here
        return None


def _fail(error: BaseException, code: int, prefix: str = "error") -> int:
    print(f"inferlab: {prefix}: {first_line(error)}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    previous = _handle_sigterm()
    try:
        if args.command == "sweep" and args.engines is None:
            args.engines = list(_default_sweep_engines(args))
        if args.command == "sweep":
            args.max_runs = _sweep_max_runs(args)
        launched = _launch_if_needed(args, argv)
        if launched is not None:
            return launched
        code = COMMANDS[args.command](args)
        _leave_world()  # after the work only: on a failure torchrun stops the other ranks
        return code
    except UsageError as error:
        return _fail(error, errors.EXIT_USAGE)
    except errors.WriteError as error:
        return _fail(error, errors.EXIT_WRITE)
    except errors.Terminated:
        print("inferlab: stopped by SIGTERM", file=sys.stderr)
        return errors.EXIT_TERMINATED
    except KeyboardInterrupt:
        print("inferlab: interrupted", file=sys.stderr)
        return errors.EXIT_INTERRUPTED
    except Exception as error:  # one line, not a traceback; never exit 1, which is the gate's FAIL
        if _is_out_of_memory(error):
            return _fail(error, errors.EXIT_MEMORY, "out of memory")
        if os.environ.get("INFERLAB_TRACEBACK"):
            raise
        print(f"inferlab: internal error: {type(error).__name__}: {first_line(error)[:300]} "
              "(a bug: set INFERLAB_TRACEBACK=1 for the traceback and report it)", file=sys.stderr)
        return errors.EXIT_INTERNAL
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _leave_world() -> None:
    """A torchrun worker closes its process group before exit; other processes have none."""
    if "torch" not in sys.modules:
        return
    from inferlab.model import layouts

    if layouts.is_launched_worker():
        layouts.leave_world()


if __name__ == "__main__":
    sys.exit(main())
