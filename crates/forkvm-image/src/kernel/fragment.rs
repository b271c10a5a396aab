//! Kconfig fragments and `.config` files: parsing, and checking that every option the
//! fragment asks for survived `make olddefconfig`.
//!
//! Kconfig silently drops a request whose dependencies are not met (asking for
//! `VIRTIO_BLK=y` without `BLOCK` leaves it unset), so after the merge each fragment line
//! is compared with the final `.config`:
//! * `CONFIG_X=y` must be `CONFIG_X=y`;
//! * `# CONFIG_X is not set` must not be set to anything but `n`; an option missing from
//!   `.config` entirely (its menu is not visible) is off, so that passes;
//! * `CONFIG_X=value` (numbers, strings, `m`) must have exactly that value.

use std::collections::HashMap;
use std::fmt;

use super::KernelError;

/// What a fragment line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `CONFIG_X=y`
    Yes,
    /// `# CONFIG_X is not set`
    NotSet,
    /// `CONFIG_X=<anything else>`, verbatim (`m`, `100`, `"string"`).
    Other(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Yes => f.write_str("y"),
            Value::NotSet => f.write_str("is not set"),
            Value::Other(v) => f.write_str(v),
        }
    }
}

/// One line of a fragment: option name without the `CONFIG_` prefix, and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub name: String,
    pub value: Value,
    /// 1-based line in the fragment.
    pub line: usize,
}

/// A fragment option that did not survive: what was asked and what `.config` has
/// (`None`: the option is absent from `.config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub name: String,
    pub wanted: Value,
    pub got: Option<Value>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let got = match &self.got {
            None => "absent".to_string(),
            Some(Value::NotSet) => "not set".to_string(),
            Some(v) => format!("={v}"),
        };
        match self.wanted {
            Value::NotSet => write!(f, "CONFIG_{} (wanted not set, got {got})", self.name),
            ref w => write!(f, "CONFIG_{}={w} (got {got})", self.name),
        }
    }
}

/// One line of a fragment or `.config`: `Ok(None)` for blank lines and comments.
fn parse_line(line: &str) -> Result<Option<(String, Value)>, ()> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    if let Some(comment) = line.strip_prefix('#') {
        let comment = comment.trim();
        if let Some(name) = comment.strip_prefix("CONFIG_").and_then(|r| r.strip_suffix(" is not set")) {
            return if valid_name(name) { Ok(Some((name.to_string(), Value::NotSet))) } else { Err(()) };
        }
        return Ok(None);
    }
    let (name, value) = line.strip_prefix("CONFIG_").and_then(|r| r.split_once('=')).ok_or(())?;
    if !valid_name(name) || value.is_empty() {
        return Err(());
    }
    Ok(Some((name.to_string(), if value == "y" { Value::Yes } else { Value::Other(value.to_string()) })))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// Parse a fragment. Anything that is not blank, a comment, `CONFIG_X=v` or
/// `# CONFIG_X is not set` is an error naming the line; so is an option given twice.
pub fn parse_fragment(text: &str) -> Result<Vec<Setting>, KernelError> {
    let mut out: Vec<Setting> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let bad = || KernelError::FragmentSyntax { line: i + 1, text: raw.to_string() };
        let Some((name, value)) = parse_line(raw).map_err(|_| bad())? else { continue };
        if out.iter().any(|s| s.name == name) {
            return Err(bad());
        }
        out.push(Setting { name, value, line: i + 1 });
    }
    Ok(out)
}

/// Parse a `.config` into option name → value. Lines it does not understand are skipped
/// (kconfig writes only the two forms, plus comments).
pub fn parse_config(text: &str) -> HashMap<String, Value> {
    text.lines().filter_map(|l| parse_line(l).ok().flatten()).collect()
}

/// The fragment settings that `.config` does not honour (empty: all survived).
pub fn verify_config(fragment: &[Setting], config: &HashMap<String, Value>) -> Vec<Mismatch> {
    fragment
        .iter()
        .filter_map(|s| {
            let got = config.get(&s.name);
            let ok = match &s.value {
                Value::NotSet => matches!(got, None | Some(Value::NotSet)) || got == Some(&Value::Other("n".into())),
                wanted => got == Some(wanted),
            };
            (!ok).then(|| Mismatch { name: s.name.clone(), wanted: s.value.clone(), got: got.cloned() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAGMENT: &str = "\
# a comment
## section
CONFIG_VIRTIO_BLK=y
CONFIG_HZ=100
CONFIG_CMDLINE=\"console=ttyS0\"

# CONFIG_SMP is not set
# CONFIG_IBT is not set
";

    const CONFIG: &str = "\
#
# Automatically generated file; DO NOT EDIT.
#
CONFIG_64BIT=y
CONFIG_VIRTIO_BLK=y
CONFIG_HZ=100
CONFIG_CMDLINE=\"console=ttyS0\"
# CONFIG_SMP is not set
";

    #[test]
    fn parses_all_line_forms() {
        let s = parse_fragment(FRAGMENT).unwrap();
        let pairs: Vec<(&str, Value, usize)> = s.iter().map(|s| (s.name.as_str(), s.value.clone(), s.line)).collect();
        assert_eq!(
            pairs,
            vec![
                ("VIRTIO_BLK", Value::Yes, 3),
                ("HZ", Value::Other("100".into()), 4),
                ("CMDLINE", Value::Other("\"console=ttyS0\"".into()), 5),
                ("SMP", Value::NotSet, 7),
                ("IBT", Value::NotSet, 8),
            ]
        );
    }

    #[test]
    fn rejects_malformed_and_duplicate_lines() {
        for bad in ["VIRTIO_BLK=y", "CONFIG_virtio=y", "CONFIG_X=", "CONFIG_X y", "# CONFIG_x is not set"] {
            match parse_fragment(&format!("# ok\n{bad}\n")) {
                Err(KernelError::FragmentSyntax { line: 2, text }) => assert_eq!(text, bad),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert!(matches!(
            parse_fragment("CONFIG_A=y\n# CONFIG_A is not set\n"),
            Err(KernelError::FragmentSyntax { line: 2, .. })
        ));
    }

    #[test]
    fn a_config_that_honours_the_fragment_passes() {
        // IBT is absent from .config (invisible menu): counts as not set.
        let m = verify_config(&parse_fragment(FRAGMENT).unwrap(), &parse_config(CONFIG));
        assert_eq!(m, vec![]);
    }

    #[test]
    fn dropped_and_flipped_options_are_named() {
        let config = CONFIG
            .replace("CONFIG_VIRTIO_BLK=y\n", "# CONFIG_VIRTIO_BLK is not set\n")
            .replace("# CONFIG_SMP is not set", "CONFIG_SMP=y")
            .replace("CONFIG_HZ=100\n", "");
        let m = verify_config(&parse_fragment(FRAGMENT).unwrap(), &parse_config(&config));
        assert_eq!(
            m,
            vec![
                Mismatch { name: "VIRTIO_BLK".into(), wanted: Value::Yes, got: Some(Value::NotSet) },
                Mismatch { name: "HZ".into(), wanted: Value::Other("100".into()), got: None },
                Mismatch { name: "SMP".into(), wanted: Value::NotSet, got: Some(Value::Yes) },
            ]
        );
        let text: Vec<String> = m.iter().map(|m| m.to_string()).collect();
        assert_eq!(
            text,
            ["CONFIG_VIRTIO_BLK=y (got not set)", "CONFIG_HZ=100 (got absent)", "CONFIG_SMP (wanted not set, got =y)"]
        );
        let err = KernelError::ConfigDropped { mismatches: m, config: "/b/.config".into() };
        assert!(err.to_string().contains("dropped 3 fragment option(s): CONFIG_VIRTIO_BLK=y (got not set)"));
    }

    #[test]
    fn module_builds_do_not_satisfy_yes() {
        let m = verify_config(&parse_fragment("CONFIG_EXT4_FS=y\n").unwrap(), &parse_config("CONFIG_EXT4_FS=m\n"));
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].got, Some(Value::Other("m".into())));
    }
}
