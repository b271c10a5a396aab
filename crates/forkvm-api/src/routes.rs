//! Every route of REST v1, once. The daemon builds its router from [`ROUTES`] and a test
//! checks `docs/openapi.json` against it, so the document cannot drift from the server.
//! Paths use axum's `{param}` syntax, which is also OpenAPI's.

/// One route: method, path and the handler it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub name: RouteName,
}

/// Names the handler of each route (the daemon matches on it exhaustively).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteName {
    Health,
    Version,
    Metrics,
    ListSnapshots,
    CreateSnapshot,
    DeleteSnapshot,
    SnapshotInfo,
    CompactSnapshot,
    PackSnapshot,
    UnpackSnapshot,
    ListSandboxes,
    CreateSandboxes,
    GetSandbox,
    DeleteSandbox,
    ReadConsole,
    Ping,
    Exec,
    ExecStream,
    Eval,
    Branch,
    Fork,
    ReadFile,
    WriteFile,
    RemoveFile,
    ListFiles,
    WatchFiles,
    TakeDiskSnapshot,
    ListDiskSnapshots,
    ArchiveSandbox,
    RestoreSandbox,
    DiskFork,
    SetTtl,
    SetNetwork,
    ListPorts,
    ExposePort,
    UnexposePort,
    ConnectTcp,
    ListWorkspaces,
    CreateWorkspace,
    GetWorkspace,
    DeleteWorkspace,
    SuspendWorkspace,
    ResumeWorkspace,
    ImportOciTemplate,
    ListVolumes,
    CreateVolume,
    GetVolume,
    DeleteVolume,
    SnapshotVolume,
}

const fn r(method: &'static str, path: &'static str, name: RouteName) -> Route {
    Route { method, path, name }
}

/// The routes, in the order the OpenAPI document lists them.
pub const ROUTES: &[Route] = &[
    r("GET", "/healthz", RouteName::Health),
    r("GET", "/version", RouteName::Version),
    r("GET", "/metrics", RouteName::Metrics),
    r("GET", "/v1/snapshots", RouteName::ListSnapshots),
    r("POST", "/v1/snapshots", RouteName::CreateSnapshot),
    r("DELETE", "/v1/snapshots/{tag}", RouteName::DeleteSnapshot),
    r("GET", "/v1/snapshots/{tag}/info", RouteName::SnapshotInfo),
    r("POST", "/v1/snapshots/{tag}/compact", RouteName::CompactSnapshot),
    r("GET", "/v1/snapshots/{tag}/pack", RouteName::PackSnapshot),
    r("POST", "/v1/snapshots/unpack", RouteName::UnpackSnapshot),
    r("GET", "/v1/sandboxes", RouteName::ListSandboxes),
    r("POST", "/v1/sandboxes", RouteName::CreateSandboxes),
    r("GET", "/v1/sandboxes/{id}", RouteName::GetSandbox),
    r("DELETE", "/v1/sandboxes/{id}", RouteName::DeleteSandbox),
    r("GET", "/v1/sandboxes/{id}/console", RouteName::ReadConsole),
    r("POST", "/v1/sandboxes/{id}/ping", RouteName::Ping),
    r("POST", "/v1/sandboxes/{id}/exec", RouteName::Exec),
    r("POST", "/v1/sandboxes/{id}/exec/stream", RouteName::ExecStream),
    r("POST", "/v1/sandboxes/{id}/eval", RouteName::Eval),
    r("POST", "/v1/sandboxes/{id}/branch", RouteName::Branch),
    r("POST", "/v1/sandboxes/{id}/fork", RouteName::Fork),
    r("GET", "/v1/sandboxes/{id}/files", RouteName::ReadFile),
    r("PUT", "/v1/sandboxes/{id}/files", RouteName::WriteFile),
    r("DELETE", "/v1/sandboxes/{id}/files", RouteName::RemoveFile),
    r("GET", "/v1/sandboxes/{id}/files/list", RouteName::ListFiles),
    r("GET", "/v1/sandboxes/{id}/files/watch", RouteName::WatchFiles),
    r("POST", "/v1/sandboxes/{id}/disk-snapshots", RouteName::TakeDiskSnapshot),
    r("GET", "/v1/sandboxes/{id}/disk-snapshots", RouteName::ListDiskSnapshots),
    r("POST", "/v1/sandboxes/{id}/archive", RouteName::ArchiveSandbox),
    r("POST", "/v1/sandboxes/{id}/restore", RouteName::RestoreSandbox),
    r("POST", "/v1/sandboxes/{id}/disk-fork", RouteName::DiskFork),
    r("POST", "/v1/sandboxes/{id}/ttl", RouteName::SetTtl),
    r("PUT", "/v1/sandboxes/{id}/network", RouteName::SetNetwork),
    r("GET", "/v1/sandboxes/{id}/ports", RouteName::ListPorts),
    r("POST", "/v1/sandboxes/{id}/ports", RouteName::ExposePort),
    r("DELETE", "/v1/sandboxes/{id}/ports/{port}", RouteName::UnexposePort),
    r("GET", "/v1/sandboxes/{id}/tcp/{port}", RouteName::ConnectTcp),
    r("GET", "/v1/workspaces", RouteName::ListWorkspaces),
    r("POST", "/v1/workspaces", RouteName::CreateWorkspace),
    r("GET", "/v1/workspaces/{name}", RouteName::GetWorkspace),
    r("DELETE", "/v1/workspaces/{name}", RouteName::DeleteWorkspace),
    r("POST", "/v1/workspaces/{name}/suspend", RouteName::SuspendWorkspace),
    r("POST", "/v1/workspaces/{name}/resume", RouteName::ResumeWorkspace),
    r("POST", "/v1/templates/oci", RouteName::ImportOciTemplate),
    r("GET", "/v1/volumes", RouteName::ListVolumes),
    r("POST", "/v1/volumes", RouteName::CreateVolume),
    r("GET", "/v1/volumes/{name}", RouteName::GetVolume),
    r("DELETE", "/v1/volumes/{name}", RouteName::DeleteVolume),
    r("POST", "/v1/volumes/{name}/snapshot", RouteName::SnapshotVolume),
];

/// Routes anyone may call without a token (liveness probes).
pub fn is_public(path: &str) -> bool {
    path == "/healthz" || path == "/healthz/"
}
