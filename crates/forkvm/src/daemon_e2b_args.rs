//! `forkvm daemon`'s flags for the E2B face (docs/e2b.md): both listeners are off
//! unless asked for, and the control plane never runs without API keys.

use anyhow::{bail, Context, Result};
use forkvmd::e2b::E2bConfig;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(clap::Args, Debug, Default)]
pub struct E2bArgs {
    /// Serve E2B's control plane here (E2B_API_URL=http://ADDR for E2B's SDKs).
    #[arg(long, value_name = "ADDR", env = "FORKVMD_E2B_API", requires = "e2b_api_keys")]
    e2b_api: Option<SocketAddr>,
    /// Serve E2B's data plane here: envd and sandbox ports (E2B_SANDBOX_URL=http://ADDR).
    #[arg(long, value_name = "ADDR", env = "FORKVMD_E2B_SANDBOX")]
    e2b_sandbox: Option<SocketAddr>,
    /// The API keys E2B clients may send in X-API-KEY: one per line, 16 characters or more.
    #[arg(long, value_name = "FILE", env = "FORKVMD_E2B_API_KEYS")]
    e2b_api_keys: Option<PathBuf>,
    /// An E2B template name and the forkvm tag it creates sandboxes from (repeatable):
    /// --e2b-template base=py. A name not listed is taken as a tag.
    #[arg(long = "e2b-template", value_name = "NAME=TAG")]
    e2b_templates: Vec<String>,
    /// The guest user E2B commands run as when the client names none.
    #[arg(long, value_name = "NAME", default_value = "user", env = "FORKVMD_E2B_USER")]
    e2b_user: String,
    /// The domain sandbox hosts are named under (<port>-<id>.<DOMAIN>): told to clients
    /// and routed on by the data plane.
    #[arg(long, value_name = "DOMAIN", env = "FORKVMD_E2B_DOMAIN")]
    e2b_domain: Option<String>,
    /// PEM certificate chain: both E2B listeners speak TLS (https://), as E2B's SDKs
    /// expect under E2B_DOMAIN. Give a wildcard certificate for *.<DOMAIN> and api.<DOMAIN>.
    #[arg(long, value_name = "FILE", env = "FORKVMD_E2B_TLS_CERT", requires = "e2b_tls_key")]
    e2b_tls_cert: Option<PathBuf>,
    /// PEM private key for --e2b-tls-cert.
    #[arg(long, value_name = "FILE", env = "FORKVMD_E2B_TLS_KEY", requires = "e2b_tls_cert")]
    e2b_tls_key: Option<PathBuf>,
}

impl E2bArgs {
    pub fn config(self) -> Result<E2bConfig> {
        if self.e2b_api.is_none() && self.e2b_sandbox.is_none() {
            if self.e2b_api_keys.is_some()
                || !self.e2b_templates.is_empty()
                || self.e2b_domain.is_some()
                || self.e2b_tls_cert.is_some()
            {
                bail!("--e2b-api-keys, --e2b-template, --e2b-domain and --e2b-tls-cert apply to the E2B face: give --e2b-api or --e2b-sandbox too");
            }
            return Ok(E2bConfig::default());
        }
        if self.e2b_api.is_some() && self.e2b_sandbox.is_none() {
            bail!("--e2b-api needs --e2b-sandbox too: the SDKs' commands and files go to the data plane");
        }
        let api_keys = match &self.e2b_api_keys {
            Some(path) => E2bConfig::read_keys(path).context("--e2b-api-keys")?,
            None => Vec::new(),
        };
        let templates = self
            .e2b_templates
            .iter()
            .map(|t| E2bConfig::parse_template(t))
            .collect::<Result<_, _>>()
            .context("--e2b-template")?;
        if let Some(d) = &self.e2b_domain {
            if !forkvm_client::api::ports::is_ports_domain(d) {
                bail!("--e2b-domain {d:?} is not a domain name of lowercase DNS labels");
            }
        }
        Ok(E2bConfig {
            api: self.e2b_api,
            sandbox: self.e2b_sandbox,
            api_keys,
            templates,
            default_user: self.e2b_user,
            domain: self.e2b_domain,
            tls: self.e2b_tls_cert.zip(self.e2b_tls_key),
        })
    }
}
