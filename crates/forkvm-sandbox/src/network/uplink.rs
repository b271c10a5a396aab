//! Where sandbox traffic leaves for the rest of the world: the **uplink**, a network
//! namespace that holds the outer end of every sandbox's link and the static rules of
//! [`super::rules::uplink_rules`]. In production it is the host's own namespace; tests
//! give a namespace they made (a fake internet), so that no sandbox under test can reach
//! any other address; and `none` leaves sandboxes with their own namespace only.
//!
//! Chosen once per process: [`configure`] before the first sandbox, else
//! [`UPLINK_ENV`] (`host`, `none`, or the path of a network namespace such as
//! `/run/netns/NAME`), else the host.

use super::NetworkError;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

/// Chooses the uplink for this process: `host` (the default), `none`, or the path of a
/// network namespace (`/run/netns/NAME`, `/proc/PID/ns/net`).
pub const UPLINK_ENV: &str = "FORKVM_UPLINK";

/// Where sandbox links end.
#[derive(Debug)]
pub enum Uplink {
    /// No link: the sandbox's namespace is all it reaches.
    None,
    /// The namespace this process runs in (the host's).
    Host,
    /// A network namespace given by descriptor.
    Namespace(OwnedFd),
}

impl Uplink {
    /// The same uplink, with a descriptor of its own.
    pub fn try_clone(&self) -> std::io::Result<Uplink> {
        Ok(match self {
            Uplink::None => Uplink::None,
            Uplink::Host => Uplink::Host,
            Uplink::Namespace(fd) => Uplink::Namespace(fd.try_clone()?),
        })
    }

    /// Reads an [`UPLINK_ENV`] value.
    pub fn parse(value: &str) -> Result<Uplink, NetworkError> {
        match value {
            "" | "host" => Ok(Uplink::Host),
            "none" => Ok(Uplink::None),
            path if path.starts_with('/') => {
                let file =
                    std::fs::File::open(path).map_err(|e| NetworkError::Uplink(format!("opening {path}: {e}")))?;
                Uplink::namespace(OwnedFd::from(file))
                    .map_err(|_| NetworkError::Uplink(format!("{path} is not a network namespace")))
            }
            other => Err(NetworkError::Uplink(format!(
                "{UPLINK_ENV}={other:?}: expected host, none, or the absolute path of a network namespace"
            ))),
        }
    }

    /// A namespace given by descriptor, checked to be a network namespace.
    pub fn namespace(fd: OwnedFd) -> Result<Uplink, NetworkError> {
        if namespace_kind(&fd) != Some(libc::CLONE_NEWNET) {
            return Err(NetworkError::Uplink("the descriptor is not a network namespace".into()));
        }
        Ok(Uplink::Namespace(fd))
    }

    /// A short description, for logs and `doctor`.
    pub fn describe(&self) -> &'static str {
        match self {
            Uplink::None => "none (sandboxes reach only their own namespace)",
            Uplink::Host => "the host",
            Uplink::Namespace(_) => "a network namespace given by path",
        }
    }
}

/// `NS_GET_NSTYPE` (`<linux/nsfs.h>`): the kind of namespace a descriptor refers to.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

fn namespace_kind(fd: &OwnedFd) -> Option<i32> {
    // SAFETY: an ioctl without argument on a descriptor we own.
    let kind = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE) };
    (kind >= 0).then_some(kind)
}

static CHOSEN: OnceLock<Result<Uplink, String>> = OnceLock::new();

/// Sets this process's uplink; refused once a sandbox (or an earlier call) fixed it.
pub fn configure(uplink: Uplink) -> Result<(), NetworkError> {
    let mut given = Some(uplink);
    CHOSEN.get_or_init(|| Ok(given.take().expect("taken once")));
    match given {
        None => Ok(()),
        Some(_) => Err(NetworkError::Uplink("the uplink was already chosen for this process".into())),
    }
}

/// This process's uplink ([`configure`]d, else from [`UPLINK_ENV`]).
pub fn current() -> Result<&'static Uplink, NetworkError> {
    let chosen = CHOSEN.get_or_init(|| match std::env::var(UPLINK_ENV) {
        Ok(v) => Uplink::parse(&v).map_err(|e| match e {
            NetworkError::Uplink(why) => why,
            other => other.to_string(),
        }),
        Err(_) => Ok(Uplink::Host),
    });
    chosen.as_ref().map_err(|e| NetworkError::Uplink(e.clone()))
}

/// Uplink namespaces this process has set up (forwarding on, the static table
/// installed), by cookie: unlike an inode, a namespace's cookie is never reused.
static PREPARED: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// `SO_NETNS_COOKIE` (`<asm-generic/socket.h>`, Linux 5.14).
const SO_NETNS_COOKIE: libc::c_int = 71;

/// The cookie of the calling thread's network namespace.
fn namespace_cookie() -> std::io::Result<u64> {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").or_else(|_| std::net::UdpSocket::bind("0.0.0.0:0"))?;
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into a u64 we own.
    let rc = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cookie)
}

/// Sets up the namespace the calling thread is in as an uplink, once per process:
/// IPv4 forwarding on and [`super::rules::uplink_rules`] installed.
pub(super) fn prepare_here() -> Result<(), NetworkError> {
    let cookie =
        namespace_cookie().map_err(|e| NetworkError::Uplink(format!("identifying the uplink's namespace: {e}")))?;
    let mut prepared = PREPARED.lock().unwrap_or_else(|p| p.into_inner());
    if prepared.contains(&cookie) {
        return Ok(());
    }
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
        .map_err(|e| NetworkError::Uplink(format!("turning on IPv4 forwarding in the uplink: {e}")))?;
    super::rules::apply(&super::rules::uplink_rules(), "the uplink's table")?;
    prepared.push(cookie);
    Ok(())
}
