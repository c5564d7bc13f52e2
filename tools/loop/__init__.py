"""`harnesslab run`: the iteration loop (driver), its persistent run state, the prompts, the
servers each turn gets, and the agent runners (exec, claude, codex, autopilot).

Side of the trust boundary: trusted; an attempt's own claims never count (scores come from the
guarded verify), and run state lives in the trusted store.
"""

from .driver import Loop, RunConfig, resume_run, start_run
from .runners import AgentRunner, build_runner

__all__ = ["AgentRunner", "Loop", "RunConfig", "build_runner", "resume_run", "start_run"]
