"""The sandbox every process that imports or runs agent-written code runs in (staged flat with
the rest of tools/gpu; the host also runs sandbox.py from here, by path).

sandbox.py is the process (trusted up to the exec of its target; the target is hostile);
sandbox_policy.py the typed policy and the one way to start it (`command`), which the host,
the runner and the guarded verify (../verify/guard_kid.py) use; sandbox_confine.py Landlock,
seccomp and capabilities; sandbox_limits.py the rlimits, the cgroup and the scratch folder;
sandbox_mounts.py the mount namespace's views. They import only each other (by the sibling
import rule of ../runner.py's docstring).
"""
