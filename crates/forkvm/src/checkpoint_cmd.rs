//! `checkpoint ID` (one now), `checkpoints ID` (the list, and the policy with `--every`,
//! `--after-exec`, `--keep`, `--max-stored-mib`, `--max-age`, `--thin`), and `rewind ID --to SEQ | --ago DURATION` (the sandbox
//! back at a checkpoint, in place). Daemon only: checkpoints are the daemon's records.
//! Forking from a checkpoint is `forkvm fork --tag ckpt-ID-SEQ`.

use crate::remote_cmd::RemoteArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_client::api::{CheckpointInfo, CheckpointList, CheckpointPolicy, RewindRequest};

#[derive(Args, Debug)]
pub struct CheckpointArgs {
    /// The running sandbox.
    pub id: String,
    /// What it is for (shown in the list).
    #[arg(long)]
    pub note: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CheckpointsArgs {
    /// The sandbox.
    pub id: String,
    /// Set its policy: a checkpoint every DURATION (`30s`, `5m`, `off`).
    #[arg(long, value_name = "DURATION")]
    pub every: Option<String>,
    /// Set its policy: a checkpoint after every exec and eval (`true`/`false`).
    #[arg(long, value_name = "BOOL")]
    pub after_exec: Option<bool>,
    /// Set its policy: keep this many checkpoints (1-256).
    #[arg(long)]
    pub keep: Option<u32>,
    /// Set its policy: the most MiB (memory and disk layers) its kept checkpoints may have
    /// added to the store (`off`: no such bound).
    #[arg(long, value_name = "MIB")]
    pub max_stored_mib: Option<String>,
    /// Set its policy: checkpoints older than DURATION go, the newest stays (`1h`, `off`).
    #[arg(long, value_name = "DURATION")]
    pub max_age: Option<String>,
    /// Set its policy: past AGE, one checkpoint per EVERY (`10m:1m`: older than ten
    /// minutes, one per minute; `off`).
    #[arg(long, value_name = "AGE:EVERY")]
    pub thin: Option<String>,
    #[arg(long)]
    pub json: bool,
}

/// `--thin AGE:EVERY` (or `off`): (thin_after_seconds, thin_every_seconds).
fn parse_thin(text: &str) -> Result<(Option<u64>, Option<u64>)> {
    if matches!(text, "off" | "none") {
        return Ok((None, None));
    }
    let Some((after, every)) = text.split_once(':') else {
        bail!("--thin {text:?}: give AGE:EVERY, e.g. 10m:1m, or off");
    };
    Ok((Some(parse_duration(after)?.round() as u64), Some(parse_duration(every)?.round() as u64)))
}

#[derive(Args, Debug)]
pub struct RewindArgs {
    /// The running sandbox.
    pub id: String,
    /// The checkpoint's number.
    #[arg(long, conflicts_with = "ago", required_unless_present = "ago")]
    pub to: Option<u64>,
    /// The newest checkpoint at least this old (`90s`, `2m`, `1h`, or seconds).
    #[arg(long, value_name = "DURATION")]
    pub ago: Option<String>,
    #[arg(long)]
    pub json: bool,
}

/// Seconds in `90`, `90s`, `2m`, `1h` or `1d`.
pub fn parse_duration(text: &str) -> Result<f64> {
    let t = text.trim();
    let (number, unit) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let scale = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        other => bail!("duration {text:?}: unknown unit {other:?} (use ms, s, m, h or d)"),
    };
    let n: f64 = number.trim().parse().with_context(|| format!("duration {text:?}: not a number"))?;
    if !n.is_finite() || n < 0.0 {
        bail!("duration {text:?}: must be 0 or more");
    }
    Ok(n * scale)
}

fn line(c: &CheckpointInfo) -> String {
    format!(
        "{}\t{}\t{}\tpause {:.1} ms\t{} KiB new ({} KiB disk)\t{}",
        c.seq,
        c.tag,
        c.trigger,
        c.pause_ms,
        c.bytes_stored / 1024,
        c.disk_bytes_stored / 1024,
        c.note.as_deref().unwrap_or("-")
    )
}

pub fn checkpoint(a: CheckpointArgs, remote: &RemoteArgs) -> Result<i32> {
    let c = remote.required_client("checkpoint")?.checkpoint(&a.id, a.note.as_deref())?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        println!("{}", line(&c));
    }
    Ok(0)
}

pub fn checkpoints(a: CheckpointsArgs, remote: &RemoteArgs) -> Result<i32> {
    let client = remote.required_client("checkpoints")?;
    let changes = a.every.is_some()
        || a.after_exec.is_some()
        || a.keep.is_some()
        || a.max_stored_mib.is_some()
        || a.max_age.is_some()
        || a.thin.is_some();
    let list: CheckpointList = if changes {
        let mut policy = client.checkpoints(&a.id)?.policy;
        if let Some(every) = &a.every {
            policy.every_seconds = match every.as_str() {
                "off" | "none" => None,
                d => Some(parse_duration(d)?.round() as u64),
            };
        }
        if let Some(x) = a.after_exec {
            policy.after_exec = x;
        }
        if let Some(k) = a.keep {
            policy.keep = k;
        }
        if let Some(m) = &a.max_stored_mib {
            policy.max_stored_mib = match m.as_str() {
                "off" | "none" => None,
                n => Some(n.parse().with_context(|| format!("--max-stored-mib {n:?}: not a number"))?),
            };
        }
        if let Some(d) = &a.max_age {
            policy.max_age_seconds = match d.as_str() {
                "off" | "none" => None,
                d => Some(parse_duration(d)?.round() as u64),
            };
        }
        if let Some(t) = &a.thin {
            (policy.thin_after_seconds, policy.thin_every_seconds) = parse_thin(t)?;
        }
        client.set_checkpoint_policy(&a.id, &policy)?
    } else {
        client.checkpoints(&a.id)?
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    let p: &CheckpointPolicy = &list.policy;
    let every = p.every_seconds.map_or("off".to_string(), |s| format!("{s}s"));
    let quota = p.max_stored_mib.map_or(String::new(), |m| format!(", at most {m} MiB"));
    let window = p.max_age_seconds.map_or(String::new(), |a| format!(", at most {a}s old"));
    let thin = match (p.thin_after_seconds, p.thin_every_seconds) {
        (Some(after), Some(every)) => format!(", past {after}s one per {every}s"),
        _ => String::new(),
    };
    println!("# every {every}, after exec {}, keep {}{quota}{window}{thin}", p.after_exec, p.keep);
    for c in &list.checkpoints {
        println!("{}", line(c));
    }
    Ok(0)
}

pub fn rewind(a: RewindArgs, remote: &RemoteArgs) -> Result<i32> {
    let ago_seconds = a.ago.as_deref().map(parse_duration).transpose()?;
    let req = RewindRequest { seq: a.to, ago_seconds };
    let r = remote.required_client("rewind")?.rewind(&a.id, &req)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "{}: back at checkpoint {} ({}) in {:.0} ms",
            r.sandbox_id, r.checkpoint.seq, r.checkpoint.tag, r.total_ms
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::{parse_duration, parse_thin};

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap(), 90.0);
        assert_eq!(parse_duration("90s").unwrap(), 90.0);
        assert_eq!(parse_duration("2m").unwrap(), 120.0);
        assert_eq!(parse_duration("1d").unwrap(), 86400.0);
        assert_eq!(parse_duration("1.5h").unwrap(), 5400.0);
        assert_eq!(parse_duration("250ms").unwrap(), 0.25);
        for bad in ["", "s", "-1s", "5w", "x5", "NaN"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn thinning() {
        assert_eq!(parse_thin("10m:1m").unwrap(), (Some(600), Some(60)));
        assert_eq!(parse_thin("off").unwrap(), (None, None));
        for bad in ["10m", "10m:", ":1m", "x:1m"] {
            assert!(parse_thin(bad).is_err(), "{bad:?}");
        }
    }
}
