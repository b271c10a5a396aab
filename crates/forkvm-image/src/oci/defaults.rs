//! What an image's config says a container starts with, as template fields: Env,
//! WorkingDir and User become `[exec]` (every exec's defaults), Entrypoint + Cmd the
//! command a template may run as its `start` service, ExposedPorts are reported.

use crate::rootfs::template::{ExecDefaults, MAX_ENV};
use oci_spec::image::ImageConfiguration;

/// An image config's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageDefaults {
    pub exec: ExecDefaults,
    /// Entrypoint followed by Cmd (empty when the image has neither).
    pub command: Vec<String>,
    pub exposed_ports: Vec<String>,
}

impl ImageDefaults {
    /// Reads `config`. Variables without `=` (which a runtime would drop) are dropped;
    /// the last of a repeated name wins, as in a container runtime.
    pub fn from_config(config: &ImageConfiguration) -> ImageDefaults {
        let Some(c) = config.config() else { return ImageDefaults::default() };
        let mut exec = ExecDefaults::default();
        for var in c.env().iter().flatten().take(MAX_ENV) {
            if let Some((k, v)) = var.split_once('=').filter(|(k, _)| !k.is_empty()) {
                exec.env.insert(k.to_string(), v.to_string());
            }
        }
        exec.cwd = c.working_dir().clone().filter(|w| w.starts_with('/') && w != "/");
        exec.user = c.user().clone().filter(|u| !u.is_empty() && u != "root" && u != "0" && u != "0:0");
        let command = c.entrypoint().iter().flatten().chain(c.cmd().iter().flatten()).cloned().collect();
        let mut exposed_ports = c.exposed_ports().clone().unwrap_or_default();
        exposed_ports.sort();
        ImageDefaults { exec, command, exposed_ports }
    }

    /// The template's `start` service: the image's own command when `image_command`,
    /// else `start`. `Err` when the image has no command to run.
    pub fn start_service(&self, start: Option<String>, image_command: bool) -> Result<Option<String>, &'static str> {
        match image_command {
            true => self.command_line().map(Some).ok_or("the image has no Entrypoint or Cmd"),
            false => Ok(start),
        }
    }

    /// The command as one shell line (each word single-quoted), for a `start` service.
    pub fn command_line(&self) -> Option<String> {
        (!self.command.is_empty()).then(|| self.command.iter().map(|w| shell_quote(w)).collect::<Vec<_>>().join(" "))
    }
}

fn shell_quote(word: &str) -> String {
    if !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_config_becomes_exec_defaults_and_a_command() {
        let config: ImageConfiguration = serde_json::from_str(
            r#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},
                "config":{"Env":["PATH=/usr/bin:/bin","A=1=2","BROKEN","A=3"],"WorkingDir":"/app",
                "User":"app:staff","Entrypoint":["python3","-c"],"Cmd":["print('hi there')"],
                "ExposedPorts":{"8080/tcp":{}}}}"#,
        )
        .unwrap();
        let d = ImageDefaults::from_config(&config);
        assert_eq!(d.exec.env.get("A").map(String::as_str), Some("3"));
        assert_eq!(d.exec.env.get("PATH").map(String::as_str), Some("/usr/bin:/bin"));
        assert!(!d.exec.env.contains_key("BROKEN"));
        assert_eq!((d.exec.cwd.as_deref(), d.exec.user.as_deref()), (Some("/app"), Some("app:staff")));
        assert_eq!(d.command_line().unwrap(), "python3 -c 'print('\\''hi there'\\'')'");
        assert_eq!(d.exposed_ports, ["8080/tcp"]);
        let bare: ImageConfiguration = serde_json::from_str(
            r#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"config":{"User":"0"}}"#,
        )
        .unwrap();
        assert_eq!(ImageDefaults::from_config(&bare), ImageDefaults::default());
    }
}
