"""``Sandbox``: one running microVM as an object, shaped like E2B's SDK.

Agent code thinks in sandboxes, not routes: ``Sandbox.create("py")``, then
``sb.commands.run(...)``, ``sb.files.write(...)``, ``sb.eval(...)``, ``sb.fork(2)``.
This module is that view over :class:`~forkvm.controller.Controller`; it adds no
protocol of its own, only defaults (shell strings, parent directories, idempotent
kill) and turning a raised exception in ``eval`` into :class:`EvalError`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import httpx

from .checkpoints import CheckpointPolicy, Checkpoints
from .controller import Controller, NetworkPolicyLike, PathLike
from .errors import EvalError, NotFound
from .streaming import OutputCallback
from .watch import FileWatch
from .processes import Process
from .types import (
    ArchiveReport,
    ExposedPort,
    DiskSnapshotInfo,
    DiskSnapshotReport,
    ExecResult,
    FileChecksum,
    FileEntry,
    FileWritten,
    NetworkPolicy,
    Pong,
    SandboxInfo,
    SnapshotInfo,
)

__all__ = ["Sandbox", "Commands", "Files", "Pty"]


def _headline(error: str, exit_code: int) -> str:
    """The exception line of an eval error: first line, unless that is the
    "Traceback (most recent call last):" header, then the last."""
    lines = [ln for ln in error.strip().splitlines() if ln.strip()]
    if not lines:
        return f"exit code {exit_code}"
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]


class Commands:
    """``sandbox.commands``: processes in the sandbox."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        timeout: float = 30,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[str] = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        max_output_bytes: Optional[int] = None,
        background: bool = False,
    ) -> Union[ExecResult, Process]:
        """Runs ``cmd`` and waits: a string goes through ``/bin/sh -c``, a list is argv.

        With ``background=True`` it does not wait: it returns a :class:`Process` once
        the command runs (``timeout`` then kills it, ``0`` for none); its output is
        kept to read later (``process.output()``), with ``stdin`` sent to it first.

        With ``on_stdout``/``on_stderr`` the output is streamed to them as it comes
        (all of it). Without, each stream is kept up to ``max_output_bytes`` (the
        daemon's default 4 MiB); past it the result says ``truncated``.
        A non-zero exit is not an exception: check ``exit_code`` (``timed_out`` for
        a timeout, which is exit code 124).
        """
        argv: Optional[List[str]] = None
        shell: Optional[str] = None
        if isinstance(cmd, str):
            shell = cmd
        else:
            argv = list(cmd)
        c, sid = self._sb.controller, self._sb.id
        if background:
            if on_stdout is not None or on_stderr is not None or max_output_bytes is not None:
                raise ValueError("a background command's output is kept, not streamed: read process.output()")
            info = c.start_process(sid, argv, cmd=shell, env=env, cwd=cwd, timeout_secs=int(timeout) or None)
            process = Process(c, sid, info)
            if stdin is not None:
                process.send_stdin(stdin)
            return process
        if on_stdout is not None or on_stderr is not None:
            if max_output_bytes is not None:
                raise ValueError("max_output_bytes caps collected output; a streamed run is not collected")
            return c.exec_stream(
                sid, argv, timeout, cmd=shell, env=env, cwd=cwd, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr
            )
        return c.exec_command(
            sid, argv, timeout, cmd=shell, env=env, cwd=cwd, stdin=stdin, max_output_bytes=max_output_bytes
        )


    def list(self) -> List[Process]:
        """The sandbox's background processes, running and ended."""
        c, sid = self._sb.controller, self._sb.id
        return [Process(c, sid, p) for p in c.list_processes(sid)]

    def connect(self, pid: int) -> Process:
        """The background process ``pid`` (:class:`NotFound` if the sandbox keeps none)."""
        for p in self.list():
            if p.pid == pid:
                return p
        raise NotFound(f"sandbox {self._sb.id} keeps no process {pid}")


class Pty:
    """``sandbox.pty``: terminals in the sandbox."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def create(
        self,
        rows: int = 24,
        cols: int = 80,
        *,
        cmd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
    ) -> Process:
        """A command (a login shell by default) on a new terminal of ``rows`` x ``cols``:
        keys go in with ``send_stdin``, the screen's bytes come out of ``output()``."""
        shell = cmd or "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"
        full_env = {"TERM": "xterm-256color", **dict(env or {})}
        c, sid = self._sb.controller, self._sb.id
        info = c.start_process(sid, cmd=shell, env=full_env, cwd=cwd, user=user, pty=(rows, cols), tag="pty")
        return Process(c, sid, info)


class Files:
    """``sandbox.files``: the sandbox's filesystem."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def read(self, path: str) -> bytes:
        """The bytes of the file at ``path`` (absolute). Missing: :class:`NotFound`."""
        return self._sb.controller.read_file(self._sb.id, path)

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """The file at ``path`` decoded as text."""
        return self.read(path).decode(encoding)

    def write(self, path: str, data: Union[bytes, str], mode: Optional[int] = None) -> FileWritten:
        """Writes ``data`` to ``path``, creating parent directories."""
        return self._sb.controller.write_file(self._sb.id, path, data, mode=mode, create_parents=True)

    def upload(self, local_path: PathLike, path: str, mode: Optional[int] = None) -> FileWritten:
        """Streams the local file to ``path`` (parents made), checked by its SHA-256."""
        return self._sb.controller.upload_file(self._sb.id, local_path, path, mode=mode, create_parents=True)

    def download(self, path: str, local_path: PathLike) -> FileChecksum:
        """Streams ``path`` to the local file, checked against the guest's SHA-256."""
        return self._sb.controller.download_file(self._sb.id, path, local_path)

    def download_dir(self, path: str, local_tar: PathLike) -> int:
        """A tar archive of the directory ``path`` into the local file; its size."""
        return self._sb.controller.download_tar(self._sb.id, path, local_tar)

    def upload_dir(self, source: Union[PathLike, bytes], path: str) -> FileWritten:
        """A local directory (or tar file, or archive bytes) unpacked into ``path``."""
        return self._sb.controller.upload_tar(self._sb.id, path, source)

    def list(self, path: str) -> List[FileEntry]:
        """The entries of the directory ``path``."""
        return self._sb.controller.list_files(self._sb.id, path)

    def remove(self, path: str, recursive: bool = False) -> None:
        """Removes the file (or, with ``recursive``, the directory tree) at ``path``."""
        self._sb.controller.remove_file(self._sb.id, path, recursive=recursive)

    def watch(self, path: str, recursive: bool = False) -> "FileWatch":
        """The changes below the directory ``path`` from now on (see
        :meth:`Controller.watch_files`): ``for change in sandbox.files.watch("/work"):``."""
        return self._sb.controller.watch_files(self._sb.id, path, recursive=recursive)


class Network:
    """``sandbox.network``: where the sandbox's guest may connect to."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    @property
    def policy(self) -> NetworkPolicy:
        """The policy in force as last seen (:meth:`Sandbox.refresh` to ask again)."""
        return self._sb.info.network or NetworkPolicy()

    def update(
        self,
        *,
        allow_internet: bool = True,
        allow: Sequence[str] = (),
        deny: Sequence[str] = (),
    ) -> NetworkPolicy:
        """Replaces the policy, from now on (connections already open included):
        what ``allow`` names (IPv4 addresses, CIDRs, names, ``*.`` wildcards) is
        reachable whatever ``deny`` says; the rest follows ``allow_internet``."""
        policy = NetworkPolicy(allow_internet=allow_internet, allow=list(allow), deny=list(deny))
        self._sb._info = self._sb.controller.set_network(self._sb.id, policy)
        return self.policy


class Sandbox:
    """A running sandbox. Make one with :meth:`create`, :meth:`connect` or :meth:`fork`.

    Used as a context manager it is killed on exit. A Sandbox that made its own
    Controller closes it when killed or closed.
    """

    def __init__(self, info: SandboxInfo, controller: Controller, *, owns_controller: bool = False) -> None:
        self._info = info
        self._controller = controller
        self._owns_controller = owns_controller
        self._killed = False
        self.commands = Commands(self)
        self.files = Files(self)
        self.pty = Pty(self)
        self.network = Network(self)
        self.checkpoints = Checkpoints(self)

    # --- making ----------------------------------------------------------

    @classmethod
    def create(
        cls,
        template_or_tag: str,
        *,
        controller: Optional[Controller] = None,
        memory_limit_mib: Optional[int] = None,
        cpu_limit_millis: Optional[int] = None,
        pids_limit: Optional[int] = None,
        io_limits: Optional[Dict[str, int]] = None,
        network: Optional[NetworkPolicyLike] = None,
        checkpoints: Optional[CheckpointPolicy] = None,
        **controller_kwargs: Any,
    ) -> "Sandbox":
        """Spawns one sandbox from the snapshot tagged ``template_or_tag``, with the
        daemon's default CPU and tasks limits unless given (``cpu_limit_millis``:
        thousandths of a CPU), and with I/O caps when ``io_limits`` gives them.
        ``checkpoints`` is its checkpoint policy from the start (:class:`CheckpointPolicy`).

        Without ``controller``, a Controller is made from ``controller_kwargs``
        (``base_url``, ``token``, ``timeout``) and owned by the sandbox.
        """
        own = controller is None
        c = Controller(**controller_kwargs) if controller is None else controller
        try:
            infos = c.spawn_sandboxes(
                template_or_tag,
                n=1,
                memory_limit_mib=memory_limit_mib,
                cpu_limit_millis=cpu_limit_millis,
                pids_limit=pids_limit,
                io_limits=io_limits,
                network=network,
                checkpoints=checkpoints,
            )
        except BaseException:
            if own:
                c.close()
            raise
        return cls(infos[0], c, owns_controller=own)

    @classmethod
    def connect(cls, sandbox_id: str, *, controller: Optional[Controller] = None, **controller_kwargs: Any) -> "Sandbox":
        """Attaches to the existing sandbox ``sandbox_id`` (:class:`NotFound` if none)."""
        own = controller is None
        c = Controller(**controller_kwargs) if controller is None else controller
        try:
            info = c.get_sandbox(sandbox_id)
        except BaseException:
            if own:
                c.close()
            raise
        return cls(info, c, owns_controller=own)

    # --- reading ---------------------------------------------------------

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def info(self) -> SandboxInfo:
        """What the daemon said about this sandbox when it was last fetched."""
        return self._info

    @property
    def controller(self) -> Controller:
        return self._controller

    def refresh(self) -> SandboxInfo:
        """Fetches the sandbox's current info from the daemon."""
        self._info = self._controller.get_sandbox(self.id)
        return self._info

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r})"

    # --- doing -----------------------------------------------------------

    def ping(self) -> Pong:
        """A round trip to the guest agent."""
        return self._controller.ping_sandbox(self.id)

    def eval(self, code: str) -> Optional[str]:
        """Runs ``code`` in the sandbox's warm Python interpreter (state persists
        between calls) and returns ``repr()`` of its last expression, or ``None``.

        Raises :class:`EvalError` (``.traceback``) if the code raised.
        """
        r = self._controller.eval_code(self.id, code)
        if r.error is not None or r.exit_code != 0:
            tb = r.error or ""
            raise EvalError(f"eval raised: {_headline(tb, r.exit_code)}\n{tb}".rstrip(), traceback=tb, stdout=r.stdout, stderr=r.stderr)
        return r.result

    def branch(
        self,
        tag: Optional[str] = None,
        mode: Optional[str] = "live",
        wait: bool = True,
        *,
        parent_tag: Optional[str] = None,
    ) -> SnapshotInfo:
        """Snapshots this sandbox while it keeps running; spawn from the tag later.
        ``mode="diff"`` stores only what changed since the snapshot it was spawned from."""
        return self._controller.branch_sandbox(self.id, tag=tag, mode=mode, wait=wait, parent_tag=parent_tag)

    def disk_snapshot(
        self,
        *,
        keep_last: Optional[int] = None,
        keep_hourly: Optional[int] = None,
        keep_daily: Optional[int] = None,
    ) -> DiskSnapshotReport:
        """Takes an encrypted, incremental snapshot of this sandbox's disks now (the
        daemon also takes one every ``--disk-snapshot-interval``)."""
        return self._controller.disk_snapshot(self.id, keep_last=keep_last, keep_hourly=keep_hourly, keep_daily=keep_daily)

    def disk_snapshots(self) -> List[DiskSnapshotInfo]:
        """This sandbox's disk snapshots, oldest first."""
        return self._controller.list_disk_snapshots(self.id)

    def expose(self, port: int, *, dpop_jkt: Optional[str] = None) -> ExposedPort:
        """Makes guest ``port`` reachable through the daemon: its path and token (the
        same ones if it was exposed already), bound to a key if ``dpop_jkt`` names one
        (see :meth:`Controller.expose_port`). Its forks serve it too, each under a
        token of its own; this one's never routes to them."""
        return self._controller.expose_port(self.id, port, dpop_jkt=dpop_jkt)

    def ports(self) -> List[ExposedPort]:
        """The ports this sandbox exposes, with their tokens."""
        return self._controller.list_ports(self.id)

    def unexpose(self, port: int) -> None:
        """Stops exposing ``port``: its token stops working."""
        self._controller.unexpose_port(self.id, port)

    def port_url(self, port: int) -> Optional[str]:
        """Where a browser opens guest ``port`` (exposed first if it is not), token
        included; ``None`` when the daemon is on a Unix socket (use :meth:`fetch`)."""
        return self._controller.port_url(self.expose(port))

    def fetch(self, port: int, path: str = "/", method: str = "GET", **kwargs: Any) -> "httpx.Response":
        """An HTTP request to guest ``port`` (exposed first if it is not) through the
        daemon: the guest's answer, whatever its status. ``kwargs`` go to httpx."""
        return self._controller.port_request(self.expose(port), method, path, **kwargs)

    def fork(
        self,
        n: int = 1,
        memory_limit_mib: Optional[int] = None,
        *,
        cpu_limit_millis: Optional[int] = None,
        pids_limit: Optional[int] = None,
        io_limits: Optional[Dict[str, int]] = None,
        network: Optional[NetworkPolicyLike] = None,
    ) -> List["Sandbox"]:
        """``n`` running copies of this sandbox (memory, interpreter state and all),
        with its limits and network policy but for those given.

        The copies share this sandbox's Controller if it was given by the caller;
        otherwise each gets its own, so killing one never closes another's.
        """
        infos = self._controller.fork_sandbox(
            self.id,
            n=n,
            memory_limit_mib=memory_limit_mib,
            cpu_limit_millis=cpu_limit_millis,
            pids_limit=pids_limit,
            io_limits=io_limits,
            network=network,
        )
        out: List[Sandbox] = []
        for info in infos:
            if self._owns_controller:
                out.append(Sandbox(info, self._controller.clone(), owns_controller=True))
            else:
                out.append(Sandbox(info, self._controller))
        return out

    def archive(self) -> ArchiveReport:
        """Moves this sandbox to the store and stops its VMM (reversible: :meth:`restore`)."""
        report = self._controller.archive_sandbox(self.id)
        self.refresh()
        return report

    def restore(self, *, ttl_seconds: Optional[int] = None) -> SandboxInfo:
        """Runs this archived sandbox again (same id, processes and files)."""
        self._info = self._controller.restore(self.id, ttl_seconds=ttl_seconds)
        return self._info

    def set_ttl(self, ttl_seconds: int) -> SandboxInfo:
        """The daemon archives (never deletes) this sandbox ``ttl_seconds`` from now; 0: no TTL."""
        self._info = self._controller.set_ttl(self.id, ttl_seconds)
        return self._info

    def disk_fork(
        self, seq: Optional[int] = None, *, memory_limit_mib: Optional[int] = None, restore: Optional[str] = None
    ) -> "Sandbox":
        """A new sandbox cold-booted on one of this sandbox's disk snapshots (its files,
        none of its processes). Long: the guest boots. ``restore`` as in
        :meth:`Controller.disk_fork`."""
        info = self._controller.disk_fork(self.id, seq, memory_limit_mib=memory_limit_mib, restore=restore)
        if self._owns_controller:
            return Sandbox(info, self._controller.clone(), owns_controller=True)
        return Sandbox(info, self._controller)

    def kill(self, purge: bool = False) -> None:
        """Stops the sandbox. Calling it again, or on one already gone, is fine.

        ``purge`` also destroys its disk snapshots (nothing of it is left).
        """
        if not self._killed or purge:
            try:
                self._controller.kill_sandbox(self.id, purge=purge)
            except NotFound:
                pass
            self._killed = True
        self.close()

    def close(self) -> None:
        """Releases the Controller if this sandbox made it (the sandbox keeps running)."""
        if self._owns_controller:
            self._controller.close()
            self._owns_controller = False

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
