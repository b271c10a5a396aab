//! `GET /v1/lineage`: the graph of who came from what (see [`forkvm_api::lineage`]),
//! joined here from the registry's sandboxes and the store's snapshots so a console
//! draws it from one answer. Built from the same views as the two lists, so the graph
//! and the lists agree.

use crate::error::ApiError;
use crate::state::AppState;
use crate::views::{sandbox_info, snapshot_info};
use axum::extract::State;
use axum::Json;
use forkvm_api::{Lineage, LineageEdge, LineageNode, SandboxInfo, SnapshotInfo};
use std::collections::{HashMap, HashSet};

pub async fn lineage(State(s): State<AppState>) -> Result<Json<Lineage>, ApiError> {
    s.blocking(|s| {
        let sandboxes: Vec<SandboxInfo> =
            forkvm_sandbox::info::listed(&s.registry).iter().map(|r| sandbox_info(r, &s.disk)).collect();
        let rows = s.snapshot_rows();
        let snapshots: Vec<(SnapshotInfo, Option<String>)> = s
            .store
            .list()
            .iter()
            .map(|e| (snapshot_info(&s.store, e, rows.iter().find(|r| r.tag == e.tag)), e.meta.parent_tag.clone()))
            .collect();
        Ok(Json(graph(&sandboxes, &snapshots)))
    })
    .await
}

fn sandbox_node(id: &str) -> String {
    format!("sandbox:{id}")
}

fn snapshot_node(tag: &str) -> String {
    format!("snapshot:{tag}")
}

/// The graph of `sandboxes` and `snapshots` (each with the tag of the link it is a diff
/// over, if it is one); edges only between nodes both listed.
pub fn graph(sandboxes: &[SandboxInfo], snapshots: &[(SnapshotInfo, Option<String>)]) -> Lineage {
    let parents: HashMap<&str, &str> =
        snapshots.iter().filter_map(|(i, p)| Some((i.tag.as_str(), p.as_deref()?))).collect();
    let guest_memory: HashMap<&str, u64> =
        snapshots.iter().map(|(i, _)| (i.tag.as_str(), i.memory_logical_bytes)).collect();
    let mut nodes = Vec::with_capacity(sandboxes.len() + snapshots.len());
    for (i, _) in snapshots {
        nodes.push(LineageNode {
            id: snapshot_node(&i.tag),
            kind: "snapshot".into(),
            name: i.tag.clone(),
            state: i.status.clone(),
            memory_bytes: i.memory_logical_bytes,
            stored_bytes: Some(i.memory_physical_bytes),
            created_at_unix: i.created_at_unix,
            mode: i.mode.clone(),
            chain_depth: u32::try_from(forkvm_snapshot::chain::depth_in(&parents, &i.tag)).unwrap_or(u32::MAX),
        });
    }
    for sb in sandboxes {
        nodes.push(LineageNode {
            id: sandbox_node(&sb.id),
            kind: "sandbox".into(),
            name: sb.id.clone(),
            state: sb.state.clone(),
            memory_bytes: sb
                .snapshot_tag
                .as_deref()
                .and_then(|t| guest_memory.get(t).copied())
                .unwrap_or(sb.memory_limit_mib.unwrap_or(0) << 20),
            stored_bytes: None,
            created_at_unix: sb.created_at_unix,
            mode: None,
            chain_depth: 0,
        });
    }
    let known: HashSet<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
    let mut edges = Vec::new();
    let mut edge = |from: String, to: String, kind: &str| {
        if known.contains(from.as_str()) && known.contains(to.as_str()) {
            edges.push(LineageEdge { from, to, kind: kind.into() });
        }
    };
    for (i, parent) in snapshots {
        if let Some(p) = parent {
            edge(snapshot_node(p), snapshot_node(&i.tag), "chain");
        }
        if let Some(from) = i.branched_from.as_deref() {
            match from.strip_prefix("compact:") {
                Some(head) => edge(snapshot_node(head), snapshot_node(&i.tag), "compact"),
                None => edge(sandbox_node(from), snapshot_node(&i.tag), "branch"),
            }
        }
    }
    for sb in sandboxes {
        match (&sb.forked_from, &sb.snapshot_tag) {
            (Some(source), _) => edge(sandbox_node(source), sandbox_node(&sb.id), "fork"),
            (None, Some(tag)) => edge(snapshot_node(tag), sandbox_node(&sb.id), "spawn"),
            (None, None) => {}
        }
    }
    Lineage { nodes, edges }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(tag: &str, branched_from: Option<&str>) -> SnapshotInfo {
        serde_json::from_value(serde_json::json!({
            "tag": tag, "dir": "/s", "created_at_unix": 1, "branched_from": branched_from,
            "status": "ready", "bootable": true, "memory_logical_bytes": 512u64 << 20,
            "memory_physical_bytes": 7u64 << 20,
        }))
        .unwrap()
    }

    fn sandbox(id: &str, tag: Option<&str>, forked_from: Option<&str>) -> SandboxInfo {
        serde_json::from_value(serde_json::json!({
            "id": id, "snapshot_tag": tag, "netns": null, "guest_addr": "", "created_at_unix": 2,
            "pid": 1, "memory_limit_mib": 256, "has_branched": false, "last_branch_memory_path": null,
            "branch_count": 0, "state": "running", "template": null, "forked_from": forked_from,
            "last_active_unix": 2,
        }))
        .unwrap()
    }

    fn edges(l: &Lineage) -> Vec<(String, String, String)> {
        let mut e: Vec<_> = l.edges.iter().map(|e| (e.from.clone(), e.to.clone(), e.kind.clone())).collect();
        e.sort();
        e
    }

    #[test]
    fn spawns_forks_branches_chains_and_compactions_are_edges() {
        let snapshots = vec![
            (snap("base", None), None),
            (snap("d1", Some("a")), Some("base".to_string())),
            (snap("d2", Some("b")), Some("d1".to_string())),
            (snap("flat", Some("compact:d2")), None),
        ];
        let sandboxes = vec![
            sandbox("a", Some("base"), None),
            sandbox("b", Some("d1"), None),
            sandbox("c", Some("base"), Some("a")),
        ];
        let l = graph(&sandboxes, &snapshots);
        assert_eq!(l.nodes.len(), 7);
        let t = |a: &str, b: &str, k: &str| (a.to_string(), b.to_string(), k.to_string());
        assert_eq!(
            edges(&l),
            vec![
                t("sandbox:a", "sandbox:c", "fork"),
                t("sandbox:a", "snapshot:d1", "branch"),
                t("sandbox:b", "snapshot:d2", "branch"),
                t("snapshot:base", "sandbox:a", "spawn"),
                t("snapshot:base", "snapshot:d1", "chain"),
                t("snapshot:d1", "sandbox:b", "spawn"),
                t("snapshot:d1", "snapshot:d2", "chain"),
                t("snapshot:d2", "snapshot:flat", "compact"),
            ]
        );
        let depth = |id: &str| l.nodes.iter().find(|n| n.id == id).unwrap().chain_depth;
        assert_eq!(
            (depth("snapshot:base"), depth("snapshot:d1"), depth("snapshot:d2"), depth("snapshot:flat")),
            (0, 1, 2, 0)
        );
        let a = l.nodes.iter().find(|n| n.id == "sandbox:a").unwrap();
        assert_eq!((a.memory_bytes, a.stored_bytes, a.state.as_str()), (512 << 20, None, "running"), "its snapshot's");
        let l = graph(&[sandbox("x", Some("gone"), None)], &[]);
        assert_eq!(l.nodes[0].memory_bytes, 256 << 20, "its limit when its snapshot is gone");
    }

    #[test]
    fn edges_to_what_is_gone_are_left_out() {
        // d1's sandbox was killed and its parent deleted (a pack imported without it).
        let snapshots = vec![(snap("d1", Some("gone")), Some("missing".to_string()))];
        let sandboxes = vec![sandbox("x", Some("deleted-tag"), Some("dead"))];
        let l = graph(&sandboxes, &snapshots);
        assert_eq!(l.nodes.len(), 2);
        assert!(l.edges.is_empty(), "{:?}", l.edges);
        assert_eq!(l.nodes[0].chain_depth, 1, "its own link still counts");
    }

    #[test]
    fn a_parent_cycle_ends() {
        let snapshots = vec![(snap("p", None), Some("q".to_string())), (snap("q", None), Some("p".to_string()))];
        let l = graph(&[], &snapshots);
        assert!(l.nodes.iter().all(|n| n.chain_depth <= 3));
    }
}
