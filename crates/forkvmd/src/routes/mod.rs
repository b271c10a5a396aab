//! The router, built from the route table in `forkvm_api::routes` (the same table the
//! OpenAPI document is checked against), plus JSON answers for unknown paths and
//! methods.

pub mod branch;
pub mod checked_body;
pub mod checkpoints;
pub mod console;
pub mod disk;
pub mod file_tar;
pub mod files;
pub mod lineage;
pub mod meta;
pub mod ports;
pub mod process_socket;
pub mod processes;
pub mod remote;
pub mod run;
pub mod sandboxes;
pub mod snapshots;
pub mod template_build;
pub mod template_prune;
pub mod templates;
pub mod upload;
pub mod usage;
pub mod volumes;
pub mod watch;
pub mod workspaces;

use crate::error::ApiError;
use crate::extract::ParamValue;
use crate::state::AppState;
use axum::http::{Method, Uri};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;
use forkvm_api::routes::{Route, RouteName, ROUTES};

fn handler(name: RouteName, filter: MethodFilter) -> MethodRouter<AppState> {
    match name {
        RouteName::Health => on(filter, meta::health),
        RouteName::Version => on(filter, meta::version),
        RouteName::Metrics => on(filter, meta::metrics),
        RouteName::ListSnapshots => on(filter, snapshots::list),
        RouteName::CreateSnapshot => on(filter, snapshots::create),
        RouteName::DeleteSnapshot => on(filter, snapshots::delete),
        RouteName::SnapshotInfo => on(filter, snapshots::info),
        RouteName::CompactSnapshot => on(filter, snapshots::compact),
        RouteName::PackSnapshot => on(filter, snapshots::pack),
        RouteName::UnpackSnapshot => on(filter, snapshots::unpack),
        RouteName::ListSandboxes => on(filter, sandboxes::list),
        RouteName::CreateSandboxes => on(filter, sandboxes::create),
        RouteName::GetSandbox => on(filter, sandboxes::get),
        RouteName::DeleteSandbox => on(filter, sandboxes::delete),
        RouteName::ReadConsole => on(filter, console::read),
        RouteName::Ping => on(filter, run::ping),
        RouteName::Exec => on(filter, run::exec),
        RouteName::ExecStream => on(filter, run::exec_stream),
        RouteName::Eval => on(filter, run::eval),
        RouteName::Branch => on(filter, branch::branch),
        RouteName::Fork => on(filter, sandboxes::fork),
        RouteName::ReadFile => on(filter, files::read),
        RouteName::WriteFile => on(filter, files::write),
        RouteName::RemoveFile => on(filter, files::remove),
        RouteName::ListFiles => on(filter, files::list),
        RouteName::WatchFiles => on(filter, watch::watch),
        RouteName::FileChecksum => on(filter, file_tar::checksum),
        RouteName::ReadTar => on(filter, file_tar::read),
        RouteName::WriteTar => on(filter, file_tar::write),
        RouteName::ListProcesses => on(filter, processes::list),
        RouteName::StartProcess => on(filter, processes::start),
        RouteName::ProcessOutput => on(filter, processes::output),
        RouteName::ProcessInput => on(filter, processes::input),
        RouteName::SignalProcess => on(filter, processes::signal),
        RouteName::ResizeProcess => on(filter, processes::resize),
        RouteName::AttachProcess => on(filter, process_socket::attach),
        RouteName::ImportOciTemplate => on(filter, templates::import_oci),
        RouteName::BuildTemplate => on(filter, template_build::build_template),
        RouteName::TakeDiskSnapshot => on(filter, disk::take),
        RouteName::ListDiskSnapshots => on(filter, disk::list),
        RouteName::ArchiveSandbox => on(filter, sandboxes::archive),
        RouteName::RestoreSandbox => on(filter, sandboxes::restore),
        RouteName::DiskFork => on(filter, sandboxes::disk_fork),
        RouteName::SetTtl => on(filter, sandboxes::set_ttl),
        RouteName::SetNetwork => on(filter, sandboxes::set_network),
        RouteName::ListPorts => on(filter, ports::list),
        RouteName::ExposePort => on(filter, ports::expose),
        RouteName::UnexposePort => on(filter, ports::unexpose),
        RouteName::ConnectTcp => on(filter, ports::connect_tcp),
        RouteName::ListWorkspaces => on(filter, workspaces::list),
        RouteName::CreateWorkspace => on(filter, workspaces::create),
        RouteName::GetWorkspace => on(filter, workspaces::get),
        RouteName::DeleteWorkspace => on(filter, workspaces::delete),
        RouteName::SuspendWorkspace => on(filter, workspaces::suspend),
        RouteName::ResumeWorkspace => on(filter, workspaces::resume),
        RouteName::ListVolumes => on(filter, volumes::list),
        RouteName::CreateVolume => on(filter, volumes::create),
        RouteName::GetVolume => on(filter, volumes::get),
        RouteName::DeleteVolume => on(filter, volumes::delete),
        RouteName::SnapshotVolume => on(filter, volumes::snapshot),
        RouteName::Lineage => on(filter, lineage::lineage),
        RouteName::SandboxUsage => on(filter, usage::usage),
        RouteName::PruneBuilds => on(filter, template_prune::prune),
        RouteName::ListCheckpoints => on(filter, checkpoints::list),
        RouteName::CreateCheckpoint => on(filter, checkpoints::create),
        RouteName::SetCheckpointPolicy => on(filter, checkpoints::set_policy),
        RouteName::RewindSandbox => on(filter, checkpoints::rewind),
        RouteName::RemoteInfo => on(filter, remote::info),
        RouteName::PushTag => on(filter, remote::push),
        RouteName::PullTag => on(filter, remote::pull),
        RouteName::RemoveRemoteTag => on(filter, remote::remove_tag),
        RouteName::CollectRemote => on(filter, remote::collect),
        RouteName::ListRemoteLocks => on(filter, remote::locks),
        RouteName::BreakRemoteLock => on(filter, remote::break_lock),
    }
}

fn method_filter(method: &str) -> MethodFilter {
    match method {
        "GET" => MethodFilter::GET,
        "POST" => MethodFilter::POST,
        "PUT" => MethodFilter::PUT,
        "DELETE" => MethodFilter::DELETE,
        other => panic!("route table: unsupported method {other}"),
    }
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route {method} {}", uri.path()))
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::new(forkvm_api::ErrorCode::MethodNotAllowed, format!("{method} is not allowed on {}", uri.path()))
}

/// Counts requests and their latency per route template (not per concrete path, so
/// sandbox ids do not explode the label set).
async fn track(
    axum::extract::State(s): axum::extract::State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = req.extensions().get::<axum::extract::MatchedPath>().map(|p| p.as_str().to_string());
    let method = req.method().to_string();
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    let route = route.unwrap_or_else(|| "unmatched".into());
    let status = resp.status().as_u16().to_string();
    s.metrics.inc("forkvm_http_requests_total", &[("method", &method), ("route", &route), ("status", &status)]);
    s.metrics.observe(
        "forkvm_http_request_duration_seconds",
        &[("method", &method), ("route", &route)],
        started.elapsed().as_secs_f64(),
    );
    resp
}

/// The `{param}` routes a static path shadows, with the value the parameter has there.
///
/// axum prefers a static segment: `DELETE /v1/snapshots/unpack` would match the path of
/// `POST /v1/snapshots/unpack` and answer 405, so a snapshot tagged `unpack` could not be
/// deleted. Each (method, static path) pair that no route serves but a one-parameter
/// route matches is served by that route's handler instead.
pub fn shadowed() -> Vec<(&'static Route, &'static str, String)> {
    let mut out = Vec::new();
    for param_route in ROUTES.iter().filter(|r| r.path.contains('{')) {
        let template: Vec<&str> = param_route.path.split('/').collect();
        for fixed in ROUTES.iter().filter(|r| !r.path.contains('{')) {
            let segments: Vec<&str> = fixed.path.split('/').collect();
            if segments.len() != template.len()
                || ROUTES.iter().any(|r| r.path == fixed.path && r.method == param_route.method)
            {
                continue;
            }
            let mut value = None;
            let fits = template.iter().zip(&segments).all(|(t, s)| {
                if t.starts_with('{') {
                    value = Some(s.to_string());
                    true
                } else {
                    t == s
                }
            });
            if let (true, Some(v)) = (fits, value) {
                out.push((param_route, fixed.path, v));
            }
        }
    }
    out
}

/// Every route of the table, with state.
pub fn router(state: AppState) -> Router {
    let mut r: Router<AppState> = Router::new();
    for route in ROUTES {
        r = r.route(route.path, handler(route.name, method_filter(route.method)));
    }
    for (route, path, value) in shadowed() {
        let value = ParamValue(value);
        let h = handler(route.name, method_filter(route.method)).layer(axum::middleware::map_request(
            move |mut req: axum::extract::Request| {
                let value = value.clone();
                async move {
                    req.extensions_mut().insert(value);
                    req
                }
            },
        ));
        r = r.route(path, h);
    }
    // Exposed ports: any method, any path below the port's (`crate::port_proxy`).
    r = r
        .route("/v1/sandboxes/{id}/ports/{port}/", axum::routing::any(crate::port_proxy::proxy))
        .route("/v1/sandboxes/{id}/ports/{port}/{*path}", axum::routing::any(crate::port_proxy::proxy));
    r.route_layer(axum::middleware::from_fn_with_state(state.clone(), track))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_unpack_path_shadows_a_tag_route() {
        let found: Vec<(&str, &str, &str, String)> =
            shadowed().into_iter().map(|(r, path, value)| (r.method, r.path, path, value)).collect();
        assert_eq!(found, [("DELETE", "/v1/snapshots/{tag}", "/v1/snapshots/unpack", "unpack".to_string())]);
    }
}
