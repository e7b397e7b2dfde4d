"""inferlab.suite.forked: each pytest run in its own forked child of a server that imported torch once."""

import os
from pathlib import Path

import pytest

from inferlab.suite.forked import ForkServer

ROOT = Path(__file__).resolve().parents[1]


def test_the_fork_server_runs_each_pytest_in_its_own_child_and_reports_its_exit_and_cpu(tmp_path):
    (tmp_path / "test_probe.py").write_text(
        "import os, sys\n"
        "def test_passes():\n    print('child', os.getpid(), 'torch' in sys.modules)\n")
    server = ForkServer(dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        code, cpu = server.run(["-q", "-s", "-p", "no:cacheprovider", "test_probe.py"], tmp_path, tmp_path / "a.log", 120)
        assert code == 0 and cpu > 0
        log = (tmp_path / "a.log").read_text()
        assert "1 passed" in log and "True" in log  # torch came imported from the server
        child = int(log.split("child ")[1].split()[0])
        assert child != server.process.pid
        code, _ = server.run(["-q", "-p", "no:cacheprovider", "test_probe.py", "-k", "nothing_matches"], tmp_path,
                             tmp_path / "b.log", 120)
        assert code == 5  # pytest's "no tests collected": the child's own exit code comes back
    finally:
        server.close()
    assert server.process.returncode == 0


def test_a_fork_server_that_cannot_start_says_so(tmp_path):
    (tmp_path / "transformers.py").write_text("raise ImportError('a broken install')\n")  # shadows the real one
    with pytest.raises(RuntimeError, match="before it was ready"):
        ForkServer(dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}"))
