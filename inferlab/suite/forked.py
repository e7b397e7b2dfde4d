"""pytest runs forked from one server process that has imported the heavy libraries once.

A perf-suite process spends seconds importing torch and transformers before it measures anything
(~14 s on an H100 host). `ForkServer` starts one process that imports them (and numpy, pytest),
then forks a child per run: the child chdirs to the run's code, puts it first on sys.path and
calls `pytest.main`; it initializes CUDA, loads the model, compiles (from the on-disk caches)
and captures its graphs on its own, as a fresh process does. Only the imports are shared. The
server never initializes CUDA (torch refuses CUDA in a child forked after that), nor imports
Triton or inferlab (conftest chooses Triton's interpreter before its first import on a CPU;
each run imports inferlab from its own code).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

FORK_SERVER = r"""
import json, os, sys
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # is_available() without initializing the driver
import numpy, pytest, pytest_benchmark.plugin, torch, transformers  # noqa: F401
assert not torch.cuda.is_initialized()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.chdir(job["cwd"])
            sys.path.insert(0, job["cwd"])
            code = int(pytest.main(job["args"]))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    print(json.dumps({"pid": pid}), flush=True)
    _, status, usage = os.wait4(pid, 0)
    print(json.dumps({"exit": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime}), flush=True)
"""


class ForkServer:
    """One server process (FORK_SERVER) that forks a pytest run per request."""

    def __init__(self, env: dict, cwd: Path | None = None):
        self.process = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)
        try:
            ready = self._reply(600)
        except subprocess.TimeoutExpired:
            ready = {}
        if "ready" not in ready:
            self.process.kill()
            raise RuntimeError("the fork server exited or hung before it was ready (its error is above)")

    def _reply(self, timeout_s: float) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            raise subprocess.TimeoutExpired("fork server", timeout_s)
        return json.loads(line)

    def run(self, args: list[str], cwd: Path, log: Path, timeout_s: float) -> tuple[int, float]:
        """pytest `args` in a forked child at `cwd`, its output to `log`: (exit code, the child's CPU seconds)."""
        self.process.stdin.write(json.dumps({"args": args, "cwd": str(cwd), "log": str(log)}) + "\n")
        self.process.stdin.flush()
        pid = self._reply(60)["pid"]
        try:
            done = self._reply(timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(pid, 9)
            self._reply(60)
            raise
        return done["exit"], done["cpu_s"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
