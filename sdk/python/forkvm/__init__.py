"""forkvm: Python SDK for forkvmd, the forkvm microVM sandbox daemon.

``Sandbox`` is the object API (create, run commands, files, eval, fork, branch);
``Controller`` is one method per REST route. Both talk to the daemon found by
``FORKVM_DAEMON`` or its default Unix socket; see README.md.
"""

__version__ = "0.1.0"

from .controller import Controller
from .errors import (
    BadGateway,
    BadRequest,
    Busy,
    Conflict,
    ConnectionFailed,
    ControllerError,
    DiskFull,
    EvalError,
    Forbidden,
    ForkvmError,
    NotFound,
    ProtocolError,
    ServerError,
    Unauthorized,
)
from .sandbox import Commands, Files, Network, Pty, Sandbox
from .processes import OutputChunk, Process, ProcessOutput
from .attach import ProcessSocket
from .transport import Endpoint, default_socket_path, resolve_endpoint
from .templates import TemplateBuild, TemplateImport
from .watch import FileChange, FileWatch
from .types import (
    DiskSnapshotDisk,
    DiskSnapshotInfo,
    ArchiveReport,
    DiskSnapshotReport,
    EvalResult,
    ExecResult,
    ExposedPort,
    FileChecksum,
    FileChecksum,
    FileEntry,
    FileWritten,
    LastDiskSnapshot,
    NetworkPolicy,
    VmmJail,
    Pong,
    ProcessExit,
    ProcessInfo,
    SandboxInfo,
    SnapshotInfo,
    SnapshotInfoDetail,
    UnpackResult,
    VersionInfo,
    VolumeInfo,
    WorkspaceInfo,
)

__all__ = [
    "__version__",
    "Controller",
    "Sandbox",
    "Commands",
    "Files",
    "Network",
    "Pty",
    "Process",
    "ProcessOutput",
    "ProcessSocket",
    "OutputChunk",
    "ProcessInfo",
    "ProcessExit",
    "Endpoint",
    "default_socket_path",
    "resolve_endpoint",
    "ForkvmError",
    "BadRequest",
    "BadGateway",
    "Forbidden",
    "Unauthorized",
    "NotFound",
    "Conflict",
    "Busy",
    "DiskFull",
    "ServerError",
    "ConnectionFailed",
    "ProtocolError",
    "EvalError",
    "ControllerError",
    "SnapshotInfo",
    "SnapshotInfoDetail",
    "UnpackResult",
    "SandboxInfo",
    "ExecResult",
    "EvalResult",
    "ArchiveReport",
    "VolumeInfo",
    "WorkspaceInfo",
    "DiskSnapshotReport",
    "DiskSnapshotInfo",
    "DiskSnapshotDisk",
    "LastDiskSnapshot",
    "NetworkPolicy",
    "VmmJail",
    "ExposedPort",
    "FileChange",
    "FileEntry",
    "FileChecksum",
    "FileWatch",
    "FileWritten",
    "FileChecksum",
    "TemplateBuild",
    "TemplateImport",
    "Pong",
    "VersionInfo",
]
