//! `--daemon ENDPOINT`: the verbs that can go through forkvmd instead of acting on this
//! host's registry and store directly. This file holds the global option, turning it
//! into a client, and the spinner. The sandbox verbs (`ps`, `kill`, `exec`, `eval`,
//! `branch`, `fork`, `archive`, `unarchive`, `archives`, `ttl`) run on a
//! [`crate::backend::Backend`], which answers with the API's types either way. The store
//! verbs (snapshots, chains, disk snapshots, disk forks) are in `remote_cmd/` (one file
//! per group), called from a one-line dispatch at the top of each local verb, which goes
//! on locally when no daemon was asked for (or `auto` found none); they print the API's
//! shapes either way.

mod chain;
mod disk;
mod disk_fork;
mod snapshot;

pub use chain::{compact, pack, rmi, snapshot_diff, snapshot_info, unpack};
pub use disk::{disk_snapshot, disk_snapshots};
pub use disk_fork::disk_fork;
pub use snapshot::snapshot;

use anyhow::{bail, Context, Result};
use clap::Args;
use forkvm_client::{token_from_env, Client, ClientOptions, Endpoint};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug, Clone, Default)]
pub struct RemoteArgs {
    /// Go through the forkvm daemon: unix:/path.sock, http://host:port, https://host:port,
    /// or `auto` (its default socket, if a daemon listens there). TCP needs FORKVM_TOKEN.
    #[arg(long, global = true, env = "FORKVM_DAEMON", value_name = "ENDPOINT")]
    pub daemon: Option<String>,
    /// PEM certificate to trust for an https:// daemon (e.g. its self-signed one).
    #[arg(long, global = true, env = "FORKVM_CA_CERT", value_name = "PEM")]
    pub ca_cert: Option<PathBuf>,
}

impl RemoteArgs {
    /// A client for the daemon, if one was asked for (and for `auto`, found).
    pub(crate) fn client(&self) -> Result<Option<Client>> {
        let Some(spec) = self.daemon.as_deref() else { return Ok(None) };
        let Some(endpoint) = Endpoint::resolve(spec)? else { return Ok(None) };
        let what = endpoint.to_string();
        let options =
            ClientOptions { token: token_from_env(), ca_cert: self.ca_cert.clone(), ..ClientOptions::default() };
        Client::with_options(endpoint, options).map(Some).with_context(|| format!("setting up the client for {what}"))
    }

    /// A client for the daemon, for a command that has no local path (`what`): the one
    /// named, else the default socket's; an error saying so when none listens.
    pub(crate) fn required_client(&self, what: &str) -> Result<Client> {
        if let Some(c) = self.client()? {
            return Ok(c);
        }
        if Endpoint::probe_default_socket().is_none() {
            bail!(
                "{what} needs the daemon and none listens at {} (start `forkvm daemon`, or name one with --daemon/FORKVM_DAEMON)",
                Endpoint::default_socket_path().display()
            );
        }
        let options =
            ClientOptions { token: token_from_env(), ca_cert: self.ca_cert.clone(), ..ClientOptions::default() };
        Client::with_options(Endpoint::default_socket(), options)
            .context("setting up the client for the default socket")
    }

    /// True when a daemon was named (not `auto`, which falls back to local work).
    fn explicit(&self) -> bool {
        self.daemon.as_deref().map(str::trim).is_some_and(|s| !s.is_empty() && s != "auto")
    }

    /// Refuses `what`, which has no daemon API, when a daemon was named explicitly.
    pub(crate) fn refuse_local(&self, what: &str, instead: &str) -> Result<()> {
        if self.explicit() {
            bail!("{what} has no daemon API (--daemon/FORKVM_DAEMON is set); {instead}");
        }
        Ok(())
    }
}

/// A spinner on stderr while a call runs, if stderr is a terminal; cleared when dropped.
pub(crate) struct Spinner(Option<ProgressBar>);

impl Spinner {
    pub(crate) fn start(message: String) -> Spinner {
        if !std::io::stderr().is_terminal() {
            return Spinner(None);
        }
        let bar = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(message);
        bar.enable_steady_tick(Duration::from_millis(100));
        Spinner(Some(bar))
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}
