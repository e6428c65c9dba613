"""app/lifetime.py: a command's exit while model code runs on a thread."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, WAIT_S


def test_a_command_ending_while_a_pool_thread_is_inside_torch_exits_with_its_code() -> None:
    """A command's end (``ended``) while a load or decode computes with torch on a
    pool's thread: the process exits with the command's code and its last lines, not by
    SIGABRT from the thread's return into a finalizing interpreter."""
    script = ("import sys, time, torch\n"
              "from app.lifetime import ended\n"
              "from app.tasks import DaemonPool, calls_under_way\n"
              "def compute():\n"
              "    a = torch.ones(128, 128)\n"
              "    while True:\n"
              "        a = torch.mm(a, a).clamp_(-1, 1)\n"
              "assert not calls_under_way()\n"
              "DaemonPool('load-cpu').submit(compute)\n"
              "while not calls_under_way():\n"
              "    time.sleep(0.01)\n"
              "print('the last line')\n"
              "sys.exit(ended(3))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=WAIT_S, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (3, "the last line\n", "")
