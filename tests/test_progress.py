"""Progress a person can read on a terminal and in a log: the ETA arithmetic, the text of
the plain lines, when they come, and what sweep workers send. Time is a fake clock here:
no assertion depends on how fast anything runs."""

from __future__ import annotations

import sys

import pytest
import yaml
from small_runs import SWEEP_BASE, run_cli

from mecheval.cli.progress import (
    PlainSweepLog,
    QuietSweep,
    SweepDisplay,
    SweepTracker,
    eta_seconds,
    format_duration,
    outcome_line,
    sweep_display,
    sweep_line,
)
from mecheval.cli.run_progress import PlainReporter, run_reporter
from mecheval.experiments.execution.jobs import Outcome, QueueReporter, RunProgress
from mecheval.training.reporter import NullReporter


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def done(name: str, accuracy: float | None = 0.5, label: str = "", **kw) -> Outcome:
    metrics = {} if accuracy is None else {"dev": {"accuracy": accuracy, "likelihood": 0.1}}
    return Outcome(name, "done", metrics=metrics, label=label, **kw)


# ---------------------------------------------------------------------------- arithmetic


def test_eta_is_the_steps_left_at_the_measured_pace() -> None:
    assert eta_seconds(done=10, remaining=30, elapsed=5.0) == pytest.approx(15.0)
    assert eta_seconds(done=0, remaining=30, elapsed=5.0) is None  # nothing measured yet
    assert eta_seconds(done=10, remaining=0, elapsed=5.0) == 0.0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "?"), (float("nan"), "?"), (0.4, "0s"), (42.4, "42s"), (185, "3m05s"), (7620, "2h07m")],
)
def test_durations_read_as_a_person_writes_them(seconds, text) -> None:
    assert format_duration(seconds) == text


def test_sweep_eta_prices_running_and_unstarted_runs_at_the_sweep_s_pace() -> None:
    clock = FakeClock()
    tracker = SweepTracker(total_runs=4, clock=clock)
    assert tracker.sweep_eta() is None
    tracker.progress(RunProgress("a", 0, 40))
    tracker.progress(RunProgress("b", 10, 40))  # resumed at step 10: its pace counts from there
    clock.now += 10
    tracker.progress(RunProgress("a", 20, 40))
    tracker.progress(RunProgress("b", 20, 40))
    assert tracker.run_eta("a") == pytest.approx(10.0)  # 20 steps in 10 s, 20 left
    assert tracker.run_eta("b") == pytest.approx(20.0)  # 10 steps in 10 s, 20 left
    # 30 steps in 10 s; left: 20 + 20, and two runs not started at 40 steps each.
    assert tracker.sweep_eta() == pytest.approx((40 + 80) / 3.0)
    clock.now += 5
    assert tracker.finish(done("a")) == pytest.approx(15.0)  # seconds since its first event
    assert tracker.over == 1 and list(tracker.running) == ["b"]
    assert tracker.finish(done("never-seen", skipped=True)) is None
    assert tracker.over == 2


def test_sweep_eta_prices_unstarted_runs_by_the_share_the_runs_over_trained() -> None:
    """Runs that stop early (training.stop_at_accuracy) make the unstarted ones' estimate
    the share of their steps the finished runs needed, not their last step."""
    clock = FakeClock()
    tracker = SweepTracker(total_runs=3, clock=clock)
    tracker.progress(RunProgress("a", 0, 100))
    clock.now += 10
    tracker.progress(RunProgress("a", 25, 100))  # stops early here: 25 of its 100 steps
    tracker.finish(done("a"))
    tracker.progress(RunProgress("b", 0, 100))
    # 25 steps in 10 s; left: b's 100 (a running run counts to its end) and one run not
    # started at 100 steps x 25 / 100.
    assert tracker.sweep_eta() == pytest.approx((100 + 25) / 2.5)


def test_a_run_s_pace_is_from_when_its_events_were_sent_not_read() -> None:
    tracker = SweepTracker(total_runs=1, clock=FakeClock())
    # The parent reads a worker's queue in batches: these two arrive at the same moment.
    tracker.progress(RunProgress("a", 0, 40, at=50.0))
    tracker.progress(RunProgress("a", 10, 40, at=55.0))
    assert tracker.run_eta("a") == pytest.approx(15.0)  # 10 steps in 5 s, 30 left


def test_a_stack_s_progress_ends_with_its_first_run_s_outcome() -> None:
    tracker = SweepTracker(total_runs=3, clock=FakeClock())
    tracker.progress(RunProgress("a +2", 5, 40, runs=3))
    tracker.finish(done("a"))
    assert tracker.running == {}


# ---------------------------------------------------------------------------- line texts


def test_a_finished_run_s_line_says_name_time_accuracy_label_in_that_order() -> None:
    line = outcome_line(65.0, done("mamba", 0.188, "induction"), 4.2, over=3, total_runs=7)
    assert line == (
        "[1m05s] done mamba in 4s: dev accuracy 18.8%, mechanism induction (3/7 runs over)"
    )
    failed = Outcome("h3", "failed", "crashed: ValueError: boom")
    assert outcome_line(5, failed, 1.0, 4, 7) == (
        "[5s] FAILED h3 in 1s: crashed: ValueError: boom (4/7 runs over)"
    )
    already = outcome_line(0, done("a", None, skipped=True), None, 1, 7)
    assert already == "[0s] done (already) a (1/7 runs over)"


def test_a_sweep_line_gives_the_sweep_then_each_running_run() -> None:
    line = sweep_line(12, 3, 7, 40.0, [("mamba", 25, 40, 3.0), ("h3", 10, 40, None)])
    assert line == "[12s] 3/7 runs over, ETA 40s | mamba 25/40 ETA 3s, h3 10/40 ETA ?"
    assert sweep_line(0, 0, 7, None, []) == "[0s] 0/7 runs over, ETA ?"


# ---------------------------------------------------------------------------- plain logs


def test_a_sweep_log_writes_at_the_start_every_interval_and_at_each_run_s_end() -> None:
    clock, lines = FakeClock(), []
    with PlainSweepLog(2, write=lines.append, clock=clock, every=10.0) as log:
        log.update(RunProgress("a", 0, 40))
        clock.now += 4
        log.update(RunProgress("a", 10, 40))  # 4 s after the last line: none
        clock.now += 6
        log.update(RunProgress("a", 20, 40))  # 10 s: the periodic line
        clock.now += 2
        log.update(done("a", 0.5, "induction"))
        log.update(Outcome("b", "failed", "crashed: RuntimeError: x"))
    assert lines == [
        "[0s] 0/2 runs over, ETA ?",
        # 2 steps a second; left: 20 of a, 40 of b (not started, at a's 40 steps).
        "[10s] 0/2 runs over, ETA 30s | a 20/40 ETA 10s",
        "[12s] done a in 12s: dev accuracy 50.0%, mechanism induction (1/2 runs over)",
        "[12s] FAILED b: crashed: RuntimeError: x (2/2 runs over)",
    ]


def test_a_run_log_writes_at_start_every_interval_and_at_the_end() -> None:
    clock, lines = FakeClock(), []
    reporter = PlainReporter("mamba", write=lines.append, clock=clock, every=10.0)
    reporter.start(40, 0)
    for step in range(1, 41):
        clock.now += 0.5
        reporter.step(step, 2.0)
    reporter.evaluated(40, {"dev": {"accuracy": 0.25, "likelihood": 0.125}})
    reporter.stop()
    assert lines == [
        "[0s] mamba 0/40 ETA ?",
        "[10s] mamba 20/40 loss 2.000 ETA 10s",
        "[20s] mamba 40/40 loss 2.000 ETA 0s acc 0.250 p(y) 0.125",
    ]


def test_where_stderr_is_not_a_terminal_progress_is_plain_lines(monkeypatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert isinstance(run_reporter("x", quiet=False), PlainReporter)
    assert isinstance(run_reporter("x", quiet=True), NullReporter)
    assert isinstance(sweep_display(3, quiet=False), PlainSweepLog)
    assert isinstance(sweep_display(3, quiet=True), QuietSweep)


# ---------------------------------------------------------------------------- workers


def test_a_worker_sends_progress_every_few_steps_or_half_second() -> None:
    clock, sent = FakeClock(), []

    class Sink:
        def put(self, item: RunProgress) -> None:
            sent.append(item.step)

    reporter = QueueReporter("m", Sink(), every=25, interval=0.5, clock=clock)
    reporter.start(40, 0)
    for step in range(1, 41):
        clock.now += 0.2  # a slow model: 5 steps a second
        reporter.step(step, 1.0)
    # Every 3rd step (0.6 s >= 0.5 s), and step 25 and the last on their own account.
    assert sent == [0, 3, 6, 9, 12, 15, 18, 21, 24, 25, 28, 31, 34, 37, 40]


def test_a_sweep_in_a_log_says_when_each_run_ends(tmp_path, monkeypatch, capsys) -> None:
    spec = {"name": "log", "base": SWEEP_BASE, "grid": {"training.lr": [1e-3, 3e-3]}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    args = ["sweep", str(tmp_path / "spec.yaml"), "--out", str(tmp_path), "--no-interventions"]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0] == "[0s] 0/2 runs over, ETA ?"
    ended = [line.split("] ", 1)[1] for line in lines if " runs over)" in line]
    assert [e.split(":")[0].rsplit(" in ", 1)[0] for e in ended] == ["done lr1e-3", "done lr3e-3"]
    assert ended[-1].endswith("(2/2 runs over)") and "dev accuracy" in ended[-1]
    # -q: nothing on stderr.
    code, out, err = run_cli(monkeypatch, capsys, *args, "-q")
    assert code == 0 and err == ""


def test_the_terminal_display_prints_a_line_when_a_run_ends(capsys) -> None:
    clock = FakeClock()
    with SweepDisplay(2, clock=clock) as display:
        display.update(RunProgress("a", 0, 40, at=clock.now))
        clock.now += 4
        display.update(RunProgress("a", 20, 40, at=clock.now))
        assert display.tracker.run_eta("a") == pytest.approx(4.0)
        display.update(done("a", 0.5, "induction"))
        assert display.jobs == {}  # its bar is gone
    err = capsys.readouterr().err
    assert "[4s] done a in 4s: dev accuracy 50.0%, mechanism induction (1/2 runs over)" in err
