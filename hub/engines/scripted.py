"""The built-in `scripted` engine: deterministic and offline; in-process or as a real subprocess."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ..clock import within
from ..domain import scripted
from ..errors import AmuxError
from .base import EngineResult, Emit, Job
from .environment import child_env
from .process import before_exec, sandboxed


async def _interpret(prompt: str, workspace: Path, emit: Emit, job: Job | None = None) -> EngineResult:
    """Execute a script, emitting canonical events; the shared core of both modes.

    `job` (in-process mode) supplies the launch environment, the permission policy, permission replies
    and steering; the subprocess reads its environment and has no reply channels.
    """
    env = job.env if job is not None else dict(os.environ)
    policy = (job.snapshot.get("permission_policy") if job is not None else None) or "policy-allow"
    try:
        steps = scripted.parse(prompt)
    except AmuxError as e:
        return EngineResult("failed", error=e.message)
    said: list[str] = []
    tools = 0
    # In-process, the script's corrections arrive on a queue (its stdin, in effect): taken as soon as they come.
    steering: asyncio.Queue[str] | None = asyncio.Queue() if job is not None else None
    if job is not None and steering is not None:
        async def steer_into(text: str) -> str | None:
            steering.put_nowait(text)
            return None
        job.steer_into = steer_into
    for step in steps:
        if step.op == "say":
            said.append(step.text)
            await emit("text", {"text": step.text})
        elif step.op == "tool":
            tools += 1
            await emit("tool", {"tool": {"id": f"tool_{tools}", "name": step.args[0], "title": step.args[1],
                                         "status": "completed", "input": {"title": step.args[1]},
                                         "output": f"{step.args[0]} done"}})
        elif step.op == "usage":
            names = {"input": "input_tokens", "output": "output_tokens"}
            await emit("usage", {"usage": {names.get(k, k): v for k, v in step.numbers}})
        elif step.op == "write":
            target = (workspace / step.args[0]).resolve()
            if workspace.resolve() not in target.parents:
                return EngineResult("failed", text="\n".join(said),
                                    error=f"write {step.args[0]!r} leaves the workspace; use a relative path inside it")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(step.text + "\n")
        elif step.op == "sleep":
            await asyncio.sleep(step.seconds)
        elif step.op == "ask":
            await emit("question", {"text": step.text, "options": []})
            return EngineResult("failed", text="\n".join(said), error="question")
        elif step.op == "fail":
            return EngineResult("failed", text="\n".join(said), json={"lines": said},
                                error=step.text or "script failed")
        elif step.op == "env":  # `env *` lists every variable (NAME=value lines), for environment checks
            value = ("\n".join(f"{k}={v}" for k, v in sorted(env.items())) if step.args[0] == "*"
                     else env.get(step.args[0], ""))
            said.append(value)
            await emit("text", {"text": value})
        elif step.op == "permission":
            denied = await _permission(step, policy, job, emit, len(said))
            if denied:
                return EngineResult("failed", text="\n".join(said), error=denied)
        elif step.op == "wait-steer":
            if job is None or steering is None:
                return EngineResult("failed", text="\n".join(said), error="wait-steer needs the in-process engine")
            try:
                text = await within(steering.get(), step.seconds)
            except asyncio.TimeoutError:
                text = None
            if text is not None:
                said.append(text)
                await emit("text", {"text": text})
    return EngineResult("succeeded", text="\n".join(said), json={"lines": said})


async def interpret(prompt: str, workspace: Path, emit: Emit, job: Job | None = None) -> EngineResult:
    """Run a script; corrections stop reaching it when it ends."""
    try:
        return await _interpret(prompt, workspace, emit, job)
    finally:
        if job is not None:
            job.steer_into = None


async def _permission(step: scripted.Step, policy: str, job: Job | None, emit: Emit, n: int) -> str | None:
    """Ask for a permission the way real engines do; return the failure text when it is denied."""
    if policy == "policy-allow":
        return None
    if policy == "deny-all":
        return f"permission for {step.args[0]} denied by policy deny-all"
    if job is None:
        return "escalate-to-main needs the in-process scripted engine"
    request_id = f"perm_{n}_{step.args[0]}"
    await emit("permission", {"request_id": request_id, "tool": step.args[0], "title": step.args[1]})
    while True:
        reply = await job.permission_replies.get()
        if reply.request_id == request_id:
            return (None if reply.allow
                    else f"permission for {step.args[0]} denied: {reply.message or 'no reason given'}")


class ScriptedEngine:
    """Run scripts in-process, or in `python -m hub.engines.scripted` when the snapshot asks for a subprocess."""

    name = "scripted"

    def available(self) -> bool:
        """Always available: it needs nothing but Python."""
        return True

    def steering_refusal(self, snapshot: dict) -> str | None:
        """In-process scripts take corrections (`wait-steer`); the subprocess form reads its script once."""
        if snapshot.get("subprocess"):
            return "the scripted engine's subprocess form reads its script once and takes no input during a turn"
        return None

    async def run(self, job: Job, emit: Emit) -> EngineResult:
        """Run in-process or as a subprocess, per the snapshot."""
        if not job.snapshot.get("subprocess"):
            return await interpret(job.prompt, job.workspace, emit, job)
        return await run_subprocess(job, emit)


# `python -c RUN_OWN_MODULE ROOT MODULE ARGS…`: run the runner's own MODULE from ROOT, wherever the runner's package
# comes from (a virtualenv, a checkout on PYTHONPATH); a sandbox shows ROOT read-only (boundary.runner_roots) and the
# child's scrubbed environment names no PYTHONPATH.
RUN_OWN_MODULE = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
                  "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


async def run_subprocess(job: Job, emit: Emit) -> EngineResult:
    """Launch the scripted CLI as a child process and translate its JSON lines."""
    argv, env = sandboxed(job.boundary, [sys.executable, "-c", RUN_OWN_MODULE, str(Path(__file__).resolve().parents[2]),
                                         "hub.engines.scripted", str(job.workspace)], child_env(job.env))
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=job.workspace, env=env, start_new_session=True, preexec_fn=before_exec(job.confine),
    )
    try:
        assert proc.stdin and proc.stdout
        proc.stdin.write(job.prompt.encode())
        await proc.stdin.drain()
        proc.stdin.close()
        result: EngineResult | None = None
        async for line in proc.stdout:
            try:
                msg: dict[str, Any] = json.loads(line)
            except ValueError:
                continue  # garbage lines are not events
            if msg.get("type") == "result":
                result = EngineResult(msg.get("outcome", "failed"), msg.get("text", ""), msg.get("json"),
                                      msg.get("error"))
            elif isinstance(msg.get("type"), str):
                await emit(msg.pop("type"), msg)
        code = await proc.wait()
        if result is None:
            err = (await proc.stderr.read()).decode(errors="replace")[-500:] if proc.stderr else ""
            return EngineResult("failed", error=f"scripted engine exited with code {code} without a result: {err}")
        return result
    except asyncio.CancelledError:
        _kill_group(proc)
        raise
    finally:
        if proc.returncode is None:
            _kill_group(proc)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def _cli(workspace: str) -> None:
    async def emit(kind: str, payload: dict) -> None:
        sys.stdout.write(json.dumps({"type": kind, **payload}) + "\n")
        sys.stdout.flush()

    res = await interpret(sys.stdin.read(), Path(workspace), emit)
    sys.stdout.write(json.dumps({"type": "result", "outcome": res.outcome, "text": res.text, "json": res.json,
                                 "error": res.error}) + "\n")


if __name__ == "__main__":
    asyncio.run(_cli(sys.argv[1] if len(sys.argv) > 1 else "."))
