"""Running ``mecheval`` commands as a user does, each in a process of its own, without paying
the interpreter's start and torch's import (about 3 s on the 2-core machine) once per command.

A plain ``mecheval ARGS`` is run in a process forked from a server that has imported mecheval
and what its commands use (``multiprocessing``'s forkserver, with :mod:`cli_preload`), with
the working folder, argument vector and output files of its own: the entry point
``mecheval.cli:main`` that the ``mecheval`` script calls, in a fresh process whose exit status
and output are the command's. The server has run no computation, so a forked process starts
as clean as a new one (no thread pool to inherit). Anything else (a pipe, a redirection,
another program) runs through ``bash`` as written. :class:`Program` starts such a command in
a session of its own and returns at once, for the tests that signal it while it runs.
"""

from __future__ import annotations

import multiprocessing
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Characters that make a command more than one program with its arguments (quotes are
#: read as bash reads them, by shlex).
_SHELL = set("|&;<>()$`*?[]{}~!\\")


def _as_argv(command: str) -> list[str] | None:
    """The arguments after ``mecheval`` where ``command`` is that program alone, else None."""
    if any(char in _SHELL for char in command):
        return None
    words = shlex.split(command)
    return words[1:] if words and words[0] == "mecheval" else None


def _child(argv: list[str], cwd: str, out: str, err: str) -> None:
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(handle, fd)
        os.close(handle)
    sys.argv = ["mecheval", *argv]
    from mecheval.cli import main

    main()


def _context() -> multiprocessing.context.BaseContext:
    # The server is a fresh ``python -c`` started in the current folder, and Python 3.11's
    # forkserver does not pass it this process's sys.path: without this folder on its
    # PYTHONPATH its preload fails silently (an ImportError it ignores), and every command
    # imports torch and mecheval again.
    here = str(Path(__file__).resolve().parent)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, *paths) if p)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["cli_preload"])
    return context


def run_command(command: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``command`` run in ``cwd`` as ``bash -c`` would run it: its exit status and output."""
    argv = _as_argv(command)
    if argv is None:
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    with tempfile.TemporaryDirectory() as outputs:
        out, err = Path(outputs, "stdout"), Path(outputs, "stderr")
        process = _context().Process(target=_child, args=(argv, str(cwd), str(out), str(err)))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(command, timeout)
        stdout, stderr = (path.read_text() if path.exists() else "" for path in (out, err))
        return subprocess.CompletedProcess(command, process.exitcode, stdout, stderr)


def _program(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    os.setsid()  # a session and process group of its own, as Popen's start_new_session
    os.environ.clear()
    os.environ.update(env)
    # As in a terminal's foreground job, SIGINT raises KeyboardInterrupt (the server ignores
    # it, and pytest may itself run as a background job, which starts with it ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _child(argv, cwd, out, err)


class Program:
    """``mecheval ARGS`` forked from the command server in a session of its own, with its
    environment, its output in files: the part of :class:`subprocess.Popen` that the tests
    which signal a command use (``pid``, ``poll``, ``wait``, ``communicate``,
    ``returncode``). It is not this process's child (the server's), so its exit status comes
    through the server; and as a pipe's end does, :meth:`communicate` waits until every
    process of its group has ended (its workers too), not only its main process."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self._outputs = tempfile.TemporaryDirectory()
        self._out = Path(self._outputs.name, "stdout")
        self._err = Path(self._outputs.name, "stderr")
        args = (argv, str(cwd), env, str(self._out), str(self._err))
        self._process = _context().Process(target=_program, args=args)
        self._process.start()
        self.pid: int = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"mecheval (pid {self.pid})", timeout or 0)
        return self._process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        deadline = None if timeout is None else time.monotonic() + timeout
        self.wait(timeout)
        while group_processes(self.pid):
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"mecheval (pid {self.pid})", timeout or 0)
            time.sleep(0.05)
        outputs = (p.read_text() if p.exists() else "" for p in (self._out, self._err))
        stdout, stderr = outputs
        self._outputs.cleanup()
        return stdout, stderr


def group_processes(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``, read from /proc (Linux)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # it ended meanwhile
            continue
        state, _ppid, group = text[text.rindex(")") + 2 :].split()[:3]
        if int(group) == pgid and state != "Z":
            found.append(int(stat.parent.name))
    return found


def _report_modules(names: list[str], queue) -> None:
    queue.put([name for name in names if name in sys.modules])


def preloaded(names: list[str]) -> list[str]:
    """Which of ``names`` a process forked from the command server has imported on arrival."""
    context = _context()
    queue = context.Queue()
    process = context.Process(target=_report_modules, args=(names, queue))
    process.start()
    found = queue.get(timeout=600)
    process.join()
    return found
