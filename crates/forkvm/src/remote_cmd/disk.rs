//! The disk snapshot verbs through the daemon: `disk-snapshot ID` (waits for a scheduled
//! snapshot of the same sandbox in progress, then takes one) and `disk-snapshots ID`.
//! Retention flags left out take the daemon's. `--json` prints the API's objects, which
//! have the shape the local verbs print.

use super::RemoteArgs;
use crate::disk_cmd::{print_list, report_line, DiskSnapshotArgs, DiskSnapshotsArgs};
use anyhow::Result;
use forkvm_client::api::DiskSnapshotRequest;

pub fn disk_snapshot(a: &DiskSnapshotArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    let req = DiskSnapshotRequest { keep_last: a.keep_last, keep_hourly: a.keep_hourly, keep_daily: a.keep_daily };
    let r = client.disk_snapshot(&a.id, &req)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{}",
            report_line(&r.sandbox_id, r.seq, r.unchanged, r.written_chunks, r.written_bytes, r.seal_ms, r.write_ms)
        );
    }
    Ok(Some(0))
}

pub fn disk_snapshots(a: &DiskSnapshotsArgs, remote: &RemoteArgs) -> Result<Option<i32>> {
    let Some(client) = remote.client()? else { return Ok(None) };
    print_list(&client.disk_snapshots(&a.id)?, a.json).map(Some)
}
