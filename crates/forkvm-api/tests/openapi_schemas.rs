//! `docs/openapi.json` against the Rust wire types: each component's schema is
//! generated from its type (schemars, following the serde attributes) and must have the
//! same fields, and the same required ones: a request as the daemon reads it (a field
//! with a default is optional), a response as the daemon writes it (a field it always
//! writes is required). The Python SDK's types are checked against the same document
//! (`sdk/python/tests/test_contract.py`), so no hand-kept copy of a shape can drift.

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::Value;
use std::collections::BTreeSet;

fn openapi() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Type `T`'s schema as the daemon reads it (requests) or writes it (responses).
fn generated<T: JsonSchema>(request: bool) -> Value {
    let settings = if request {
        SchemaSettings::draft2020_12().for_deserialize()
    } else {
        SchemaSettings::draft2020_12().for_serialize()
    };
    serde_json::to_value(settings.into_generator().into_root_schema_for::<T>()).unwrap()
}

fn names(v: &Value, key: &str) -> BTreeSet<String> {
    match &v[key] {
        Value::Object(m) => m.keys().cloned().collect(),
        Value::Array(a) => a.iter().filter_map(|x| x.as_str().map(String::from)).collect(),
        _ => BTreeSet::new(),
    }
}

/// The differences between documented component `name` and generated schema `rust`.
fn compare(name: &str, documented: &Value, rust: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let (doc_props, rust_props) = (names(documented, "properties"), names(rust, "properties"));
    if doc_props != rust_props {
        out.push(format!(
            "{name}: fields only documented {:?}, only in Rust {:?}",
            doc_props.difference(&rust_props).collect::<Vec<_>>(),
            rust_props.difference(&doc_props).collect::<Vec<_>>()
        ));
    }
    let (doc_req, rust_req) = (names(documented, "required"), names(rust, "required"));
    if doc_req != rust_req {
        out.push(format!(
            "{name}: required only in the document {:?}, only in Rust {:?}",
            doc_req.difference(&rust_req).collect::<Vec<_>>(),
            rust_req.difference(&doc_req).collect::<Vec<_>>()
        ));
    }
    out
}

macro_rules! components {
    ($($t:ident),* $(,)?) => {
        vec![$((stringify!($t), generated::<forkvm_api::$t>(stringify!($t).ends_with("Request")))),*]
    };
}

#[test]
fn every_component_has_the_fields_of_its_rust_type() {
    let doc = openapi();
    let schemas = doc["components"]["schemas"].as_object().expect("components.schemas");
    let mut rust = components![
        ErrorBody,
        Health,
        VersionInfo,
        CreateSnapshotRequest,
        DefaultLimits,
        IoLimits,
        SnapshotInfo,
        SnapshotInfoDetail,
        CompactSnapshotRequest,
        UnpackResponse,
        CreateSandboxRequest,
        ForkSandboxRequest,
        SandboxInfo,
        BranchSandboxRequest,
        ExecRequest,
        ExecResponse,
        EvalRequest,
        EvalResponse,
        FileEntry,
        FileWritten,
        FileChecksum,
        DiskSnapshotRequest,
        DiskSnapshotReport,
        DiskSnapshotDisk,
        DiskSnapshotInfo,
        LastDiskSnapshot,
        VmmJail,
        ArchiveReport,
        RestoreRequest,
        DiskForkRequest,
        SetTtlRequest,
        ExposeRequest,
        ExposedPort,
        CreateWorkspaceRequest,
        SuspendWorkspaceRequest,
        WorkspaceInfo,
        CreateVolumeRequest,
        SnapshotVolumeRequest,
        VolumeInfo,
        VolumeMode,
        StartProcessRequest,
        TerminalSize,
        ProcessInfo,
        ProcessExit,
        ProcessInputWritten,
        SignalProcessRequest,
        Lineage,
        LineageNode,
        LineageEdge,
        SandboxUsage,
        PruneBuildsRequest,
        PruneBuildsReport,
        CreateCheckpointRequest,
        CheckpointInfo,
        CheckpointList,
        RewindRequest,
        RewindReport,
        PushRequest,
        PullRequest,
        CollectRequest,
        RemoteInfo,
        PushReport,
        PullReport,
        GcReport,
        LockInfo,
        LockKind,
    ];
    // A request body (`PUT .../network`) before it is part of a response: checked as
    // the daemon reads it (every field optional).
    rust.push(("NetworkPolicy", generated::<forkvm_api::NetworkPolicy>(true)));
    // The body of `PUT .../checkpoints`, and part of `CheckpointList`.
    rust.push(("CheckpointPolicy", generated::<forkvm_api::CheckpointPolicy>(true)));
    // A build's report and its steps (in the `done` line of `POST /v1/templates/build`).
    rust.push(("TemplateBuildReport", generated::<forkvm_api::TemplateBuildReport>(false)));
    rust.push(("TemplateBuildStep", generated::<forkvm_api::TemplateBuildStep>(false)));
    // Part of a request body only (`CreateSandboxRequest.volumes`).
    rust.push(("VolumeMount", generated::<forkvm_api::VolumeMount>(true)));
    let mut problems = Vec::new();
    let mut checked: BTreeSet<&str> = BTreeSet::new();
    for (name, schema) in &rust {
        match schemas.get(*name) {
            Some(documented) => problems.extend(compare(name, documented, schema)),
            None => problems.push(format!("{name}: no component in docs/openapi.json")),
        }
        checked.insert(name);
    }
    // The exec, watch, template import and build streams' lines: one component per variant of the tagged enum.
    let streams = [
        ("ExecEvent", generated::<forkvm_api::ExecEvent>(false)),
        ("WatchEvent", generated::<forkvm_api::WatchEvent>(false)),
        ("TemplateImportEvent", generated::<forkvm_api::TemplateImportEvent>(false)),
        ("TemplateBuildEvent", generated::<forkvm_api::TemplateBuildEvent>(false)),
        ("ProcessOutputEvent", generated::<forkvm_api::ProcessOutputEvent>(false)),
        // Not lines but a WebSocket's text messages in (`.../processes/{pid}/attach`).
        ("ProcessControl", generated::<forkvm_api::ProcessControl>(true)),
    ];
    for (stream, events) in &streams {
        for variant in events["oneOf"].as_array().unwrap_or_else(|| panic!("{stream} is a oneOf")) {
            let tag = variant["properties"]["type"]["const"].as_str().expect("a type tag").to_string();
            // `step_done` is `StepDone`.
            let camel: String = tag.split('_').map(|w| format!("{}{}", w[..1].to_uppercase(), &w[1..])).collect();
            let name = format!("{stream}{camel}");
            match schemas.get(&name) {
                Some(documented) => problems.extend(compare(&name, documented, variant)),
                None => problems.push(format!("{name}: no component in docs/openapi.json")),
            }
            checked.insert(Box::leak(name.into_boxed_str()));
        }
    }
    // The streams' unions (their variants are checked above), and a shape that is not
    // forkvm-api's: the agent's own reply, passed through.
    let elsewhere = [
        "ExecEvent",
        "WatchEvent",
        "TemplateImportEvent",
        "TemplateBuildEvent",
        "ProcessOutputEvent",
        "ProcessControl",
        "Pong",
    ];
    let unchecked: Vec<&String> =
        schemas.keys().filter(|k| !checked.contains(k.as_str()) && !elsewhere.contains(&k.as_str())).collect();
    assert!(unchecked.is_empty(), "components with no Rust type checked against them: {unchecked:?}");
    assert!(problems.is_empty(), "docs/openapi.json and the Rust wire types differ:\n{}", problems.join("\n"));
}
