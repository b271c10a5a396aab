//! Sandbox egress policies from the command line: the flags a verb that starts
//! sandboxes takes (`fork --no-internet --allow pypi.org`), and `forkvm network ID`,
//! which sets a running sandbox's policy. Both need the daemon: a sandbox's DNS, which
//! enforces the names, is served by the process that answers for it, and a CLI run
//! without a daemon ends when the command does.

use crate::backend;
use crate::remote_cmd::RemoteArgs;
use anyhow::Result;
use clap::Args;
use forkvm_client::api::NetworkPolicy;

/// Where new sandboxes may connect to; no flag: anywhere (a fork of a running sandbox:
/// its source's policy).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NetworkArgs {
    /// Reach only what --allow names (and nothing at all without it).
    #[arg(long)]
    pub no_internet: bool,
    /// An IPv4 address, CIDR, name or `*.` wildcard reachable whatever --deny says
    /// (repeatable).
    #[arg(long, value_name = "ENTRY")]
    pub allow: Vec<String>,
    /// An IPv4 address, CIDR, name or `*.` wildcard not reachable (repeatable).
    #[arg(long, value_name = "ENTRY")]
    pub deny: Vec<String>,
}

impl NetworkArgs {
    /// The policy these flags ask for; none when no flag is given.
    pub fn policy(&self) -> Option<NetworkPolicy> {
        let asked = self.no_internet || !self.allow.is_empty() || !self.deny.is_empty();
        asked.then(|| NetworkPolicy {
            allow_internet: !self.no_internet,
            allow: self.allow.clone(),
            deny: self.deny.clone(),
        })
    }
}

#[derive(Args, Debug)]
pub struct NetworkCmdArgs {
    /// The sandbox.
    pub id: String,
    #[command(flatten)]
    pub network: NetworkArgs,
    /// Print the sandbox as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `forkvm network ID [--no-internet] [--allow E]... [--deny E]...`: replaces the
/// sandbox's policy (no flag: anywhere again).
pub fn run(a: NetworkCmdArgs, remote: &RemoteArgs) -> Result<i32> {
    let policy = a.network.policy().unwrap_or_default();
    let s = backend::open(remote)?.set_network(&a.id, &policy)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        let p = s.network.unwrap_or_default();
        let list = |l: &[String]| if l.is_empty() { "-".to_string() } else { l.join(",") };
        println!(
            "{}: internet {}, allow {}, deny {}",
            s.id,
            if p.allow_internet { "allowed" } else { "not allowed" },
            list(&p.allow),
            list(&p.deny)
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_flag_asks_nothing_and_flags_make_a_policy() {
        assert_eq!(NetworkArgs::default().policy(), None);
        let a = NetworkArgs { no_internet: true, allow: vec!["pypi.org".into()], deny: Vec::new() };
        assert_eq!(
            a.policy(),
            Some(NetworkPolicy { allow_internet: false, allow: vec!["pypi.org".into()], deny: Vec::new() })
        );
        let d = NetworkArgs { deny: vec!["10.0.0.0/8".into()], ..NetworkArgs::default() };
        assert!(d.policy().unwrap().allow_internet);
    }
}
