"""The container launcher: each target is a container of its image named
`specfleet-<name>-<8 hex digits of the state dir's hash>`, run by podman or docker through
their CLIs (docs/containers.md).

The runtime's command line is the backend's, with the command as the container's entry
point; the files it names are mounted read-only at the same paths, the host's network is
used (the runtime binds the target's host and port as a process would) and the environment
goes through an env file (0600, in the state dir), never argv. Containers outlive the
daemon, as systemd units do: a daemon that starts again adopts a running container whose
spec label matches what it would start, replaces one that does not, and removes the
containers of targets no longer in the fleet file, and of targets that start unloaded. A
container that ended is removed once its exit status and OOM flag are read, so a name in
use never blocks a start.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shlex
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.atomicfile import write_text
from supervisor.config.schema import Fleet, Target
from supervisor.config.yamlsource import Problem
from supervisor.errors import SpecfleetError
from supervisor.launcher.container import command
from supervisor.launcher.container.engine import Engine, EngineError, find_engine, image_facts
from supervisor.launcher.container.engine import labels as labels_of
from supervisor.launcher.outputlog import OutputLog, pump
from supervisor.launcher.process import die_with_parent
from supervisor.launcher.running import TargetProcess
from supervisor.plugin.executor import Executor
from supervisor.plugin.hookspecs import hookimpl
from supervisor.plugin.launching import Launcher, LauncherContext, LauncherTraits

if TYPE_CHECKING:
    from supervisor.plugin.values import LaunchSpec


class ContainerProcess(TargetProcess):
    """A running target container, as a RunningProcess: its output followed by `logs -f`
    (which ends when the container does), its exit read from `wait` and `inspect`."""

    def __init__(self, engine: Engine, container: str, pid: int,
                 follower: asyncio.subprocess.Process, log: OutputLog,
                 on_line: Callable[[str], None] | None) -> None:
        super().__init__(pid, log)
        self.engine = engine
        self.container = container
        self._follower = follower
        self._output = log
        self._on_line = on_line
        self._oom = False
        self._exit = asyncio.create_task(self._reap(), name=f"reap:{container}")

    async def _pump(self) -> None:
        assert self._follower.stdout is not None
        await pump(self._follower.stdout, self._output, self._on_line)
        await self._follower.wait()

    async def _reap(self) -> int:
        # `logs -f` ends with the container; `wait` then answers at once (or waits, if the
        # follower ended first for another reason).
        await self._pump()
        try:
            await self.engine.run("wait", self.container, timeout=10 ** 6)
            info = await self.engine.container(self.container)
        except EngineError:
            info = None
        if info is None:  # removed behind our back: no status to read
            code, self._oom = -signal.SIGKILL, False
        else:
            ended = command.exit_from_state(info.get("State") or {})
            code, self._oom = (ended.returncode or 0), ended.oom_killed
        with contextlib.suppress(EngineError):
            await self.engine.remove(self.container)
        return self._ended(code, f"container {self.container} (pid {self.pid}) exited with "
                                 f"status {code}")

    async def stop(self, grace: float) -> int:
        if self._returncode is None:
            with contextlib.suppress(EngineError):
                # A stopped process cannot act on SIGTERM; then SIGTERM, grace, SIGKILL.
                await self.engine.run("kill", "--signal", "CONT", self.container)
            with contextlib.suppress(EngineError):
                await self.engine.run("stop", "-t", str(max(1, round(grace))), self.container,
                                      timeout=grace + 60)
        return await self.wait()

    def kill(self) -> None:
        # The server is the container's init, seen from here by its host pid: SIGKILL ends
        # it, and the container with it, at once (no engine round trip). Without a pid
        # (os.kill(0) would hit the daemon's own process group), the engine kills it.
        if self._pid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self._pid, signal.SIGKILL)
                return
        self._background(self._engine_kill(), f"kill:{self.container}")

    async def _engine_kill(self) -> None:
        with contextlib.suppress(EngineError):
            await self.engine.run("kill", self.container)

    def oom_killed(self) -> bool:
        return self._oom


class ContainerLauncher(Launcher):
    name = "container"
    # Containers keep running when the daemon exits and are adopted at its return; the
    # runtime's executable is the image's.
    traits = LauncherTraits(detaches=True, in_image=True, section="container")

    def __init__(self, log_dir: Path, state_dir: Path, target_named: Callable[[str], Target],
                 max_bytes: int = 10 * 1024 * 1024, backups: int = 3) -> None:
        self.log_dir = log_dir
        self.env_dir = state_dir / "containers-env"
        self.owner = str(state_dir)
        self.target_named = target_named
        self.max_bytes = max_bytes
        self.backups = backups
        self._engines: dict[str, Engine] = {}

    @classmethod
    def from_context(cls, context: LauncherContext) -> ContainerLauncher:
        settings = context.settings
        return cls(context.log_dir, context.state_dir, context.target_named,
                   settings.log_max_bytes, settings.log_backups)

    @classmethod
    def check(cls, target: Target) -> list[Problem]:
        if target.container.image is None:
            return [Problem(("container", "image"), "launcher: container needs the image "
                            "that holds the runtime, such as ghcr.io/ggml-org/llama.cpp:server")]
        return []

    def engine(self, wanted: str) -> Engine:
        name = find_engine(wanted)
        return self._engines.setdefault(name, Engine(name))

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    # Containers are not orphans to sweep: they are adopted, or removed by remove_leftovers.

    def container_run(self, name: str, spec: LaunchSpec | None = None,
                      ) -> tuple[Engine, command.ContainerRun, dict[str, str]]:
        """The engine, the container's settings and the environment inside it."""
        target = self.target_named(name)
        settings = target.container
        if settings.image is None:
            raise SpecfleetError(f"target '{name}' has launcher: container but no container.image")
        engine = self.engine(settings.engine)
        gpus, env = command.gpu_request(target.gpus, spec.env if spec else {})
        files = [str(Path(ref).expanduser()) for ref in (target.model, target.speculation.draft)
                 if ref and Path(ref).expanduser().exists()]
        run = command.ContainerRun(
            engine.name, settings.image,
            mounts=command.mounts_for(spec, files, settings.volumes) if spec else (),
            host=target.host, port=target.port, gpus=gpus, runtime=settings.runtime,
            ulimits=settings.ulimits, env_file=str(self.env_dir / f"{name}.env") if env else None,
            extra=settings.run_args, owner=self.owner)
        return engine, run, env

    def describe(self, name: str, spec: LaunchSpec) -> str:
        """The engine's command line for `specfleet check` (the environment is in the env
        file, not on it), or why there is none on this machine."""
        try:
            _, run, _ = self.container_run(name, spec)
        except SpecfleetError as exc:
            return f"(no container command: {exc})"
        return shlex.join(command.run_argv(name, spec, run))

    async def runtime_host(self, name: str) -> Executor:
        """Where the backend's preflight runs its commands: the target's image. A missing
        image is refused here with the engine's own message."""
        engine, run, _ = self.container_run(name)
        try:
            info = await engine.image(run.image)
        except EngineError as exc:
            raise SpecfleetError(f"{engine.name} has no image {run.image} (specfleet does not "
                                 f"pull images): {exc}") from None
        return Executor(wrap=lambda argv: command.once_argv(argv, run),
                        identity=str(info.get("Id") or run.image),
                        facts=image_facts(run.image, info))

    async def start(self, name: str, spec: LaunchSpec, *, stop_grace: float = 15.0,
                    on_line: Callable[[str], None] | None = None) -> ContainerProcess:
        spec.write_files()
        engine, run, env = self.container_run(name, spec)
        container = command.container_name(name, self.owner)
        await engine.remove(container)  # an old one of that name never blocks the start
        # The env dir is also the mark that containers ran from this state dir (the next
        # daemon looks for leftovers only then).
        self.env_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if env:
            write_text(self.env_dir / f"{name}.env", command.env_file_text(env), 0o600)
        log = OutputLog(self.log_path(name), self.max_bytes, self.backups)
        argv = command.run_argv(name, spec, run)
        log.write(f"--- specfleet: starting {spec.shell_line()} in {run.image} ---", keep=False)
        try:
            await engine.run(*argv[1:])
            info = await engine.container(container)
        except EngineError as exc:
            log.close()
            # `run` may have created the container before it failed (a CDI device it could
            # not resolve): left `Created`, it would outlive the daemon.
            with contextlib.suppress(EngineError):
                await engine.remove(container)
            raise SpecfleetError(f"{engine.name} could not start {container}: {exc}") from None
        return await self._attach(engine, container, info, log, on_line, tail="all")

    async def _attach(self, engine: Engine, container: str, info: dict[str, Any] | None,
                      log: OutputLog, on_line: Callable[[str], None] | None,
                      tail: str) -> ContainerProcess:
        """Follow the container's output until it ends: all it wrote, or (adopted) only
        what it writes from now."""
        pid = int(((info or {}).get("State") or {}).get("Pid") or 0)
        since = ["--tail", "0"] if tail == "0" else []  # podman takes no `--tail all`
        follower = await asyncio.create_subprocess_exec(
            engine.name, "logs", "-f", *since, container,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            # The follower dies with the daemon; the container itself must not.
            preexec_fn=functools.partial(die_with_parent, os.getpid()))
        return ContainerProcess(engine, container, pid, follower, log, on_line)

    async def adopt(self, name: str, spec: LaunchSpec, *,
                    stop_grace: float = 15.0) -> tuple[ContainerProcess | None, str]:
        """The target's container if it still runs what specfleet would start now."""
        engine, run, _ = self.container_run(name, spec)
        container = command.container_name(name, self.owner)
        info = await engine.container(container)
        if info is None:
            # One this state dir ran under another name (an older specfleet's, without the
            # state dir's mark) would hold the target's port.
            if old := await self._remove_ours(engine, name):
                return None, f"removed the container {', '.join(old)} (named by an earlier " \
                             "specfleet, without its state dir's mark): started anew"
            return None, ""
        running = command.exit_from_state(info.get("State") or {}).running
        if running and labels_of(info).get(command.LABEL_SPEC) == command.spec_hash(spec, run):
            log = OutputLog(self.log_path(name), self.max_bytes, self.backups)
            log.write(f"--- specfleet: adopted container {container} ---", keep=False)
            proc = await self._attach(engine, container, info, log, None, tail="0")
            return proc, f"adopted container {container}, still running (pid {proc.pid})"
        await engine.remove(container)
        if not running:
            return None, f"removed container {container}, which had ended while specfleet was down"
        return None, (f"container {container} was running another command or image (the "
                      "fleet file or a tuning decision changed while specfleet was down): "
                      "replaced")

    async def discard(self, name: str) -> str:
        """A container this state dir ran for `name` that still runs although the target
        starts unloaded (the daemon before was killed): removed, or it would hold its port
        and memory unseen. Only where containers ran from this state dir."""
        if not self.env_dir.exists():
            return ""
        try:
            engine, _, _ = self.container_run(name)
            removed = await self._remove_ours(engine, name)
        except SpecfleetError as exc:  # the engine's errors too
            return f"could not look for a container left running by an earlier daemon: {exc}"
        return (f"removed the container {', '.join(removed)}, left running by an earlier "
                "daemon that did not stop: the target swaps, so it starts unloaded"
                if removed else "")

    async def _ours(self, engine: Engine) -> list[tuple[str, str | None]]:
        """This state dir's containers, running or not, with their targets."""
        found = []
        for container in await engine.labelled(command.LABEL_DAEMON, self.owner):
            info = await engine.container(container)
            found.append((container, labels_of(info or {}).get(command.LABEL_TARGET)))
        return found

    async def _remove_ours(self, engine: Engine, name: str) -> list[str]:
        """Remove this state dir's containers of target `name`, whatever their names."""
        removed = []
        for container, target in await self._ours(engine):
            if target == name:
                await engine.remove(container)
                removed.append(container)
        return removed

    async def remove_leftovers(self, fleet: Fleet) -> list[str]:
        """Containers this daemon (this state dir) started for targets no longer in the
        file, with every engine the fleet names (`auto` when none: the one installed). Only
        where containers ran from this state dir: a daemon without any never asks an engine."""
        keep = self.own_targets(fleet)
        if not keep and not self.env_dir.exists():
            return []
        engines = {fleet.targets[n].container.engine for n in keep} or {"auto"}
        said = []
        for engine in sorted(engines):
            try:
                removed = await self._remove_containers(keep, engine)
            except SpecfleetError as exc:  # a broken engine must not stop the other targets
                said.append(f"could not look for leftover containers: {exc}")
                continue
            said += [f"removed the container {name}: its target is no longer in the fleet "
                     "file (or no longer uses launcher: container)" for name in removed]
        return said

    async def _remove_containers(self, keep: set[str], wanted: str) -> list[str]:
        """Remove this daemon's containers, by `wanted`'s engine, whose target is not kept."""
        try:
            engine = self.engine(wanted)
        except SpecfleetError:
            return []  # no engine installed: nothing can be left over
        removed = []
        for container, target in await self._ours(engine):
            if target is None or target in keep:
                continue
            await engine.remove(container)
            with contextlib.suppress(FileNotFoundError):
                (self.env_dir / f"{target}.env").unlink()
            removed.append(container)
        return removed


@hookimpl
def register_launchers(register: Callable[[type], None]) -> None:
    register(ContainerLauncher)
