"""A fake agent for the loop tests, driven by a plan: one action per turn of each phase.

    scripted.py PHASE WORKSPACE RESULT_FILE PLAN_FILE

PLAN_FILE holds {"attempt": [...], "build": [...], "repair": [...]}; the n-th turn of a phase
runs the n-th action (the last one repeats). Turn counts live next to the plan file. Actions:
  improve      more rows per program (the Triton interpreter runs fewer programs faster)
  delete       delete kernel.py, flood stdout, exit 3 (no result.json)
  syntax       write a syntax error into kernel.py, exit 3
  hang         change the config (a command task: write 8 into solution.txt), start a sleeping
               child, record both pids, sleep; with "hang_once" in the plan only the first
               time (a resumed run goes on)
  good_server  generate a working task-specific server (a preset run_objective)
  bad_server   generate a server whose custom tool raises
  two_servers  good_server and bad_server in one turn
  noop         write a result.json and exit 0
  rendezvous   improve, then wait (up to 60 s) until plan["rendezvous"] agents of this plan
               have arrived; the result says whether they all did ("met") or not ("alone"):
               proof that trials ran at the same time
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

phase, workspace, result_file, plan_file = sys.argv[1:5]
workspace, plan_file = Path(workspace), Path(plan_file)
plan = json.loads(plan_file.read_text())
count_file = plan_file.with_name(f"{plan_file.stem}.{phase}.count")
n = int(count_file.read_text()) if count_file.exists() else 0
count_file.write_text(str(n + 1))
actions = plan.get(phase) or ["noop"]
action = actions[min(n, len(actions) - 1)]
claim = {"status": "no_change", "summary": action}
config_path = workspace / "kernel_config.json"


def set_rows(rows: int) -> None:
    cfg = json.loads(config_path.read_text())
    cfg["rows_per_program"] = rows
    config_path.write_text(json.dumps(cfg))


def generate(name: str, broken: bool) -> None:
    from harnesslab.tools.meta.genserver import generate as gen

    if broken:
        source = "async def diagnose():\n    raise RuntimeError('diagnose is broken')\n"
        tool = {"custom": {"function": "diagnose", "file": "diag.py"}, "probe_args": {}}
        gen(
            workspace,
            {"name": name, "description": "a broken diagnostic", "tools": [tool]},
            {"diag.py": source},
        )
    else:
        tool = {"builtin": "inspect_context", "name": "where_we_are", "probe_args": {}}
        gen(workspace, {"name": name, "description": "orientation for this task", "tools": [tool]})
    claim.update(status="built", server=name)


if action == "improve":
    set_rows(16)
    claim.update(status="improved", score_us=0.001)  # a claim the loop must not believe
elif action == "delete":
    (workspace / "kernel.py").unlink()
    sys.stdout.write("x" * 300_000 + "\n")
    sys.exit(3)
elif action == "syntax":
    kernel = workspace / "kernel.py"
    kernel.write_text(kernel.read_text() + "\ndef broken(:\n")
    sys.exit(3)
elif action == "hang":
    marker = plan_file.with_name("hung_once")
    if not (plan.get("hang_once") and marker.exists()):
        # a change made before hanging: the loop scores it after the timeout
        if config_path.exists():
            set_rows(8)
        else:  # a command task (tests/servers/support.py): its score is the number written
            (workspace / "solution.txt").write_text("8\n")
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        pids = {"agent": os.getpid(), "child": child.pid}
        plan_file.with_name("pids.json").write_text(json.dumps(pids))
        marker.write_text("hung")
        time.sleep(600)
elif action == "rendezvous":
    set_rows(16)
    arrived = plan_file.with_name(f"arrived.{os.getpid()}")
    arrived.write_text("here")
    deadline = time.monotonic() + 60
    while len(list(plan_file.parent.glob("arrived.*"))) < int(plan["rendezvous"]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    met = len(list(plan_file.parent.glob("arrived.*"))) >= int(plan["rendezvous"])
    claim.update(status="improved", summary="met" if met else "alone")
elif action in ("good_server", "two_servers"):
    generate("fake-good-server", broken=False)
if action in ("bad_server", "two_servers"):
    generate("fake-bad-server", broken=True)
Path(result_file).write_text(json.dumps(claim))
print(f"scripted agent: {phase} #{n + 1}: {action}")
