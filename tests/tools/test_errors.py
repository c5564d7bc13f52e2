"""The error taxonomy (tools/errors.py): who is blamed for a fault, and what the agent reads."""

from __future__ import annotations

import signal

import pytest

from harnesslab.tools.errors import (
    CandidateError,
    DiskFull,
    ExecutorError,
    UsageError,
    agent_text,
    first_fault,
    killed_from_outside,
    signal_of,
)


def test_exit_statuses_name_their_signal_whether_python_or_a_shell_reported_it():
    assert signal_of(-9) == signal.SIGKILL  # Python's returncode
    assert signal_of(137) == signal.SIGKILL  # a shell's (the SSH/Slurm wrappers, the sandbox)
    assert signal_of(139) == signal.SIGSEGV
    assert [signal_of(c) for c in (None, 0, 1, 2, 126, 127, 128)] == [None] * 7


@pytest.mark.parametrize("code", [-9, 137, 143, 129])
def test_a_process_killed_from_outside_is_an_infrastructure_fault_naming_the_signal(code):
    fault = killed_from_outside(code, what="the runner", host="gpu-box")
    assert fault is not None and fault.blame == "infrastructure" and fault.retryable
    assert fault.kind == "killed"
    assert f"killed by {signal.Signals(signal_of(code) or 0).name}" in fault.message
    if signal_of(code) == signal.SIGKILL:  # what the out-of-memory killer sends
        assert "out-of-memory killer" in fault.message


@pytest.mark.parametrize("code", [0, 1, 139, 134, 135, 136, 152, 159])
def test_an_exit_or_a_signal_of_the_processs_own_making_is_not_infrastructure(code):
    # SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGXCPU, SIGSYS (seccomp): the candidate's crash
    assert killed_from_outside(code, what="the runner", host="gpu-box") is None


def test_the_agent_reads_an_infrastructure_fault_as_retryable_and_never_as_its_kernels():
    lost = ExecutorError("gpu-box: the SSH connection was lost.", kind="dropped")
    text = agent_text(lost)
    assert text.startswith("infrastructure fault (dropped), not the candidate's")
    assert "retry" in text.lower() and "kernel.py" not in text
    full = agent_text(DiskFull("/state/stage", needed_bytes=64 << 20, free_bytes=28 << 10))
    assert "/state/stage" in full and "28.0 KiB free" in full and "64.0 MiB" in full
    assert not DiskFull("/x").retryable  # space must be freed first


def test_blame_follows_the_error_class():
    assert UsageError("x").blame == "usage"
    assert CandidateError("x").blame == "candidate"
    assert ExecutorError("x", kind="auth").blame == "infrastructure"
    assert not ExecutorError("x", kind="auth", started=False).retryable  # fix the key first
    assert ExecutorError("x", kind="remote_env", started=False).retryable is False
    assert ExecutorError("x", kind="allocation_lost").retryable


def test_a_task_groups_exception_group_gives_up_its_named_fault():
    lost = ExecutorError("lost", kind="dropped")
    group = ExceptionGroup("tg", [ExceptionGroup("inner", [lost]), ValueError("other")])
    assert first_fault(group) is lost
    plain = ExceptionGroup("tg", [ValueError("x")])
    assert first_fault(plain) is plain
