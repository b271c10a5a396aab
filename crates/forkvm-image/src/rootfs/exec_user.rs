//! `[exec] user` as an image config writes it (`app`, `1000`, `1000:1000`, `app:staff`),
//! resolved to a name of the image's own `/etc/passwd`: the agent runs execs as named
//! users (their groups and home come from the same files).

use std::io::Read;

/// The most of `/etc/passwd` read.
const MAX_PASSWD: u64 = 4 << 20;

/// The passwd name `spec`'s user part stands for in `tree`.
pub(crate) fn resolve(tree: &cap_std::fs::Dir, spec: &str) -> Result<String, String> {
    let user = spec.split(':').next().unwrap_or_default();
    let mut text = String::new();
    tree.open("etc/passwd")
        .and_then(|f| f.into_std().take(MAX_PASSWD).read_to_string(&mut text))
        .map_err(|e| format!("reading the image's /etc/passwd: {e}"))?;
    find(&text, user).ok_or_else(|| {
        format!(
            "{user:?} is not a user of the image's /etc/passwd (execs run as named users): add it to the image, \
             or change [exec] user in the template"
        )
    })
}

fn find(passwd: &str, user: &str) -> Option<String> {
    let by_uid = user.parse::<u32>().ok();
    passwd.lines().find_map(|line| {
        let mut f = line.split(':');
        let (name, _, uid) = (f.next()?, f.next()?, f.next()?.parse::<u32>().ok()?);
        let hit = match by_uid {
            Some(id) => uid == id,
            None => name == user,
        };
        (hit && !name.is_empty()).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_resolve_to_passwd_names() {
        let passwd = "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\nbroken\n";
        assert_eq!(find(passwd, "app").as_deref(), Some("app"));
        assert_eq!(find(passwd, "1000").as_deref(), Some("app"));
        assert_eq!(find(passwd, "0").as_deref(), Some("root"));
        assert_eq!(find(passwd, "1001"), None);
        assert_eq!(find(passwd, "nobody"), None);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/passwd"), passwd).unwrap();
        let tree = cap_std::fs::Dir::open_ambient_dir(dir.path(), cap_std::ambient_authority()).unwrap();
        assert_eq!(resolve(&tree, "1000:1000").unwrap(), "app");
        assert!(resolve(&tree, "ghost").unwrap_err().contains("not a user"));
    }
}
