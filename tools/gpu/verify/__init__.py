"""The guarded verify: how a final score is judged (staged flat with the rest of tools/gpu).

Trusted side: guard.py (the parent: the judged candidate's cases, variants and timing),
guard_kid.py (a sandboxed child process and its socket), guard_cpu.py (the interpreter's path:
the shared arena the candidate's process computes into, a case's calls), guard_gpu.py (the GPU
path: record in the candidate's process, replay in a clean one, check, time), guard_schema.py
(a recording is hostile input: its check), replay.py (the replayer's process), phase_lock.py
(the GPU lock held phase by phase). Untrusted side: guard_child.py (the candidate's process,
with guard_observer.py watching what its code does and guard_record.py recording its launches). A step task's guarded verify: step_guard.py (the
parent, with step_timed.py, its timed pass), step_child.py (the candidate's process, with
step_record.py recording each step of its last checked pass), step_schema.py (a recorded step's
check), step_replay.py (the replay process the timed pass times) and step_arena.py (the
candidate's State, shared by them: host memory on the CPU, device memory on a GPU). devmem.py: device memory the parent allocates and a sandboxed process maps (the replay's
arenas and the step verify's).

The runner (../runner.py) hands a "verify" request to guard.verify and a "step_verify" one to
step_guard.verify; these modules import each other and the shared pieces one folder up by the
sibling import rule (runner.py's docstring).
"""
