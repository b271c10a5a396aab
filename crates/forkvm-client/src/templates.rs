//! Templates: `POST /v1/templates/oci`, an image archive uploaded as a template
//! (`docs/templates.md`); `POST /v1/templates/build`, a Dockerfile built from a context
//! archive (`docs/dockerfile.md`).

use crate::client::Client;
use crate::encode::Target;
use crate::error::ClientError;
use forkvm_api::{BuildTemplateQuery, ImportOciQuery, TemplateBuildEvent, TemplateBuildReport, TemplateImportEvent};
use hyper::Method;
use std::io::Read;
use std::path::Path;

/// The most progress the import's reply may hold.
const IMPORT_REPLY_LIMIT: usize = 1 << 20;

impl Client {
    /// Makes the template `q.name` from the image archive `src` (an OCI archive or a
    /// `docker save`, gzip-compressed or not); returns its progress lines, `done` last.
    /// A build that fails is [`ClientError::Stream`] with its `error` line.
    pub fn import_oci_template(
        &self,
        src: &mut dyn Read,
        q: &ImportOciQuery,
    ) -> Result<Vec<TemplateImportEvent>, ClientError> {
        // Refused before the upload, which the daemon would read whole before saying so.
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if q.name.is_empty() || q.name.len() > 64 || !q.name.chars().all(plain) {
            return Err(ClientError::InvalidArgument {
                what: "template name",
                value: q.name.chars().take(80).collect(),
                reason: "must be 1-64 letters, digits, '-' or '_'",
            });
        }
        let target = import_target(q).build();
        let reply = self.upload(Method::POST, &target, "application/x-tar", src, IMPORT_REPLY_LIMIT)?;
        let mut events = Vec::new();
        for line in reply.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            match crate::client::decode::<TemplateImportEvent>(line, "template import line")? {
                TemplateImportEvent::Error { error } => return Err(ClientError::Stream { message: error }),
                event => events.push(event),
            }
        }
        match events.last() {
            Some(TemplateImportEvent::Done { .. }) => Ok(events),
            _ => Err(ClientError::Truncated),
        }
    }

    /// [`Client::import_oci_template`] from the archive at `path`.
    pub fn import_oci_template_file(
        &self,
        path: &Path,
        q: &ImportOciQuery,
    ) -> Result<Vec<TemplateImportEvent>, ClientError> {
        let mut file =
            std::fs::File::open(path).map_err(|source| ClientError::OpenFile { path: path.to_path_buf(), source })?;
        self.import_oci_template(&mut file, q)
    }
}

impl Client {
    /// `POST /v1/templates/prune`: removes the build cache's step snapshots nothing
    /// needs (or lists them, `dry_run`); a conflict while a build runs.
    pub fn prune_builds(
        &self,
        req: &forkvm_api::PruneBuildsRequest,
    ) -> Result<forkvm_api::PruneBuildsReport, ClientError> {
        self.call_json(hyper::Method::POST, "/v1/templates/prune", Some(req), "prune report")
    }

    /// Builds a Dockerfile on the daemon from the build context `src`, a tar archive
    /// (gzip-compressed or not) with the Dockerfile in it. `on_event` gets the progress
    /// as it happens; the report comes back once the tag is published. A build that
    /// fails is [`ClientError::Stream`] with its `error` line.
    pub fn build_template(
        &self,
        src: &mut dyn Read,
        q: &BuildTemplateQuery,
        on_event: &mut dyn FnMut(&TemplateBuildEvent),
    ) -> Result<TemplateBuildReport, ClientError> {
        let target = build_target(q).build();
        let mut done = None;
        let mut failed = None;
        self.upload_lines(Method::POST, &target, "application/x-tar", src, &mut |line| {
            let event = crate::client::decode::<TemplateBuildEvent>(line, "template build line")?;
            on_event(&event);
            match event {
                TemplateBuildEvent::Done { report } => done = Some(report),
                TemplateBuildEvent::Error { error } => failed = Some(error),
                _ => {}
            }
            Ok(())
        })?;
        match (done, failed) {
            (_, Some(message)) => Err(ClientError::Stream { message }),
            (Some(report), None) => Ok(*report),
            (None, None) => Err(ClientError::Truncated),
        }
    }
}

fn build_target(q: &BuildTemplateQuery) -> Target {
    let mut t = Target::new("/v1/templates/build").query("tag", &q.tag);
    if let Some(d) = &q.dockerfile {
        t = t.query("dockerfile", d);
    }
    if let Some(a) = &q.build_args {
        t = t.query("build_args", a);
    }
    for (on, key) in [(q.no_cache, "no_cache"), (q.replace, "replace"), (q.start, "start")] {
        if on {
            t = t.query(key, "true");
        }
    }
    t
}

fn import_target(q: &ImportOciQuery) -> Target {
    let mut t = Target::new("/v1/templates/oci").query("name", &q.name);
    if let Some(s) = &q.start {
        t = t.query("start", s);
    }
    if q.start_image_command {
        t = t.query("start_image_command", "true");
    }
    if let Some(r) = &q.ready {
        t = t.query("ready", r);
    }
    if let Some(v) = q.vcpus {
        t = t.query("vcpus", &v.to_string());
    }
    if let Some(m) = q.memory_mib {
        t = t.query("memory_mib", &m.to_string());
    }
    for (on, key) in [(q.force, "force"), (q.snapshot, "snapshot")] {
        if on {
            t = t.query(key, "true");
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_carries_only_what_is_set_encoded() {
        let q = ImportOciQuery {
            name: "app".into(),
            start: Some("python3 -m http.server 80 && x".into()),
            force: true,
            ..Default::default()
        };
        assert_eq!(
            import_target(&q).build(),
            "/v1/templates/oci?name=app&start=python3%20-m%20http.server%2080%20%26%26%20x&force=true"
        );
    }
}
