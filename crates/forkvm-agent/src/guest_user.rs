//! Guest users for `exec` requests that name one: looked up in the guest's own
//! `/etc/passwd` and `/etc/group`, then applied to the child (groups, gid, uid, in that
//! order, by the `as-user` trampoline of spawn.rs) with `HOME`, `USER` and `LOGNAME` set.
//!
//! The files are parsed here rather than through `getpwnam`: the agent is linked
//! statically against glibc, whose NSS lookups would try to load shared modules at run
//! time. Both formats are seven and four colon-separated fields per line; each file is
//! read up to [`MAX_FILE`] bytes.

use std::io::{self, Read};
use std::path::Path;

use forkvm_proto::{AgentError, ErrorKind};

use crate::spawn::{Program, UserIds};

/// The most of `/etc/passwd` or `/etc/group` read.
const MAX_FILE: u64 = 4 << 20;
/// The most supplementary groups applied.
const MAX_GROUPS: usize = 64;

/// One user of the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    /// Supplementary groups (the primary one included).
    pub groups: Vec<u32>,
}

impl GuestUser {
    /// Looks a user up in `<root>/etc/passwd` and `<root>/etc/group`, in the forms of a
    /// Dockerfile's USER: `name`, `uid` (a uid with no passwd line runs with gid 0 and
    /// home `/`), and either with `:group` (a group name or a gid), which replaces the
    /// user's groups.
    pub fn lookup(root: &Path, spec: &str) -> Result<GuestUser, AgentError> {
        let (name, group) = match spec.split_once(':') {
            Some((n, g)) => (n, Some(g)),
            None => (spec, None),
        };
        let passwd = read_bounded(&root.join("etc/passwd"));
        let by_name = passwd.as_ref().ok().and_then(|p| parse_passwd(p, name));
        let mut user = match (by_name, name.parse::<u32>()) {
            (Some(u), _) => u,
            (None, Ok(uid)) => passwd.as_ref().ok().and_then(|p| by_uid(p, uid)).unwrap_or(GuestUser {
                name: name.to_string(),
                uid,
                gid: 0,
                home: "/".into(),
                groups: Vec::new(),
            }),
            (None, Err(_)) => {
                return Err(match passwd {
                    Err(e) => AgentError::from_io("reading /etc/passwd to find the exec's user", &e),
                    Ok(_) => AgentError::new(ErrorKind::NotFound, format!("user {name:?} does not exist in the guest")),
                })
            }
        };
        // No /etc/group: the primary group alone.
        let groups = read_bounded(&root.join("etc/group")).unwrap_or_default();
        match group {
            None => user.groups = supplementary_groups(&groups, &user.name, user.gid),
            Some(g) => {
                user.gid = match g.parse::<u32>() {
                    Ok(gid) => gid,
                    Err(_) => group_id(&groups, g).ok_or_else(|| {
                        AgentError::new(ErrorKind::NotFound, format!("group {g:?} does not exist in the guest"))
                    })?,
                };
                user.groups = vec![user.gid];
            }
        }
        Ok(user)
    }

    /// Makes `program` run as this user, with its environment and (unless the request
    /// gave one) its home as the working directory.
    pub fn apply(&self, program: &mut Program) {
        program.env("HOME", &self.home).env("USER", &self.name).env("LOGNAME", &self.name);
        if !program.has_cwd() && Path::new(&self.home).is_dir() {
            program.current_dir(&self.home);
        }
        program.user(UserIds { uid: self.uid, gid: self.gid, groups: self.groups.clone() });
    }
}

/// The names of the guest's uids and gids, read once from `<root>/etc/passwd` and
/// `<root>/etc/group` (for file listings: a file's owner and group by name, as `ls -l`
/// shows them; an id with no line is shown as its number).
#[derive(Debug, Default)]
pub struct IdNames {
    users: std::collections::HashMap<u32, String>,
    groups: std::collections::HashMap<u32, String>,
}

impl IdNames {
    /// Reads both files; a missing or unreadable one names nothing.
    pub fn read(root: &Path) -> IdNames {
        let table = |file: &str| {
            let text = read_bounded(&root.join(file)).unwrap_or_default();
            let mut names = std::collections::HashMap::new();
            for line in text.lines() {
                let f: Vec<&str> = line.split(':').collect();
                if let (Some(name), Some(Ok(id))) = (f.first(), f.get(2).map(|i| i.parse::<u32>())) {
                    // The first line of an id wins, as getpwuid's.
                    names.entry(id).or_insert_with(|| name.to_string());
                }
            }
            names
        };
        IdNames { users: table("etc/passwd"), groups: table("etc/group") }
    }

    pub fn user(&self, uid: u32) -> String {
        self.users.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }

    pub fn group(&self, gid: u32) -> String {
        self.groups.get(&gid).cloned().unwrap_or_else(|| gid.to_string())
    }
}

fn read_bounded(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_FILE).read_to_string(&mut text)?;
    Ok(text)
}

/// `name`'s line of a passwd file (`name:pw:uid:gid:gecos:home:shell`).
fn parse_passwd(text: &str, name: &str) -> Option<GuestUser> {
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 || f[0] != name {
            return None;
        }
        Some(GuestUser {
            name: name.to_string(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: if f[5].is_empty() { "/".into() } else { f[5].to_string() },
            groups: Vec::new(),
        })
    })
}

/// The line of a passwd file with `uid`.
fn by_uid(text: &str, uid: u32) -> Option<GuestUser> {
    text.lines().find_map(|line| {
        let name = line.split(':').next()?;
        parse_passwd(line, name).filter(|u| u.uid == uid)
    })
}

/// The gid of group `name` in a group file.
fn group_id(text: &str, name: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.len() >= 3 && f[0] == name).then(|| f[2].parse().ok()).flatten()
    })
}

/// The groups of a group file (`name:pw:gid:member,member`) that list `name`, after
/// `primary`.
fn supplementary_groups(text: &str, name: &str, primary: u32) -> Vec<u32> {
    let mut groups = vec![primary];
    for line in text.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 || !f[3].split(',').any(|m| m.trim() == name) {
            continue;
        }
        if let Ok(gid) = f[2].parse::<u32>() {
            if !groups.contains(&gid) && groups.len() < MAX_GROUPS {
                groups.push(gid);
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/bash\nbroken:x:zz:1::/:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n";
    const GROUP: &str = "root:x:0:\nsudo:x:27:user\nadm:x:4:syslog,user\nuser:x:1000:\nother:x:9:users\n";

    #[test]
    fn a_user_is_found_with_its_groups_and_a_bad_line_is_skipped() {
        let mut u = parse_passwd(PASSWD, "user").unwrap();
        u.groups = supplementary_groups(GROUP, "user", u.gid);
        assert_eq!(
            u,
            GuestUser {
                name: "user".into(),
                uid: 1000,
                gid: 1000,
                home: "/home/user".into(),
                groups: vec![1000, 27, 4]
            }
        );
        assert_eq!(parse_passwd(PASSWD, "broken"), None);
        assert_eq!(parse_passwd(PASSWD, "nobody"), None);
        assert_eq!(parse_passwd(PASSWD, "use"), None, "a prefix is not a name");
    }

    #[test]
    fn users_are_found_in_the_forms_of_a_dockerfile_user() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/passwd"), PASSWD).unwrap();
        std::fs::write(dir.path().join("etc/group"), GROUP).unwrap();
        let ids = |spec: &str| GuestUser::lookup(dir.path(), spec).map(|u| (u.name, u.uid, u.gid, u.groups));
        assert_eq!(ids("1000").unwrap(), ("user".into(), 1000, 1000, vec![1000, 27, 4]));
        assert_eq!(ids("4242").unwrap(), ("4242".into(), 4242, 0, vec![0]));
        assert_eq!(ids("user:adm").unwrap(), ("user".into(), 1000, 4, vec![4]));
        assert_eq!(ids("1000:27").unwrap(), ("user".into(), 1000, 27, vec![27]));
        assert!(ids("user:nogroup").unwrap_err().message.contains("group \"nogroup\""));
        assert!(ids("nobody").unwrap_err().message.contains("does not exist"));
    }

    #[test]
    fn ids_are_named_by_their_first_line_or_shown_as_numbers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\nalias:x:1000:1000::/:/bin/sh\nbad\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("etc/group"), "root:x:0:\nuser:x:1000:\n").unwrap();
        let names = IdNames::read(dir.path());
        assert_eq!((names.user(0), names.user(1000), names.user(7)), ("root".into(), "user".into(), "7".into()));
        assert_eq!((names.group(1000), names.group(9)), ("user".into(), "9".into()));
        let none = IdNames::read(&dir.path().join("nowhere"));
        assert_eq!(none.user(0), "0");
    }

    #[test]
    fn a_missing_user_or_passwd_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = GuestUser::lookup(dir.path(), "user").unwrap_err();
        assert!(e.message.contains("/etc/passwd"), "{e}");
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/passwd"), PASSWD).unwrap();
        let e = GuestUser::lookup(dir.path(), "ghost").unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(e.message.contains("\"ghost\" does not exist"), "{e}");
        assert_eq!(GuestUser::lookup(dir.path(), "user").unwrap().groups, vec![1000], "no group file: the primary");
    }
}
