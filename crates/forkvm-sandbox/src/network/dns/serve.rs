//! A sandbox's DNS sockets, and the one runtime that serves them all.
//!
//! The sockets are bound at the gateway address inside the sandbox's namespace when its
//! slot is made ([`DnsSockets::bind_here`]); the sockets that ask upstream resolvers are
//! made in the uplink's namespace, so the questions leave from there.

use super::relay::{self, Query, Refused, MAX_MESSAGE};
use super::upstream;
use crate::network::firewall::Firewall;
use crate::network::policy::{NamePattern, NameVerdict};
use crate::network::uplink::Uplink;
use crate::network::{NetworkError, GATEWAY_IP, GUEST_IP};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::{oneshot, Semaphore};

/// Queries one sandbox may have in flight (UDP), and TCP connections it may hold.
const IN_FLIGHT: usize = 64;
const TCP_CONNECTIONS: usize = 8;
/// How long a guest's TCP connection may sit idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// The forwarder's sockets in one sandbox's namespace: UDP and TCP on the gateway's
/// port 53.
#[derive(Debug)]
pub struct DnsSockets {
    udp: std::net::UdpSocket,
    tcp: std::net::TcpListener,
    /// Where upstream resolvers are asked from: the uplink's namespace (`None`: this
    /// process's, the host's).
    uplink: Option<Arc<OwnedFd>>,
}

impl DnsSockets {
    /// Binds both in the calling thread's namespace (a sandbox's: the gateway address
    /// is there); upstreams are asked from `uplink`'s.
    pub fn bind_here(uplink: &Uplink) -> std::io::Result<DnsSockets> {
        let uplink = match uplink {
            Uplink::Namespace(fd) => Some(Arc::new(fd.try_clone()?)),
            Uplink::Host | Uplink::None => None,
        };
        let at = SocketAddr::from((GATEWAY_IP, 53));
        let udp = std::net::UdpSocket::bind(at)?;
        let tcp = std::net::TcpListener::bind(at)?;
        udp.set_nonblocking(true)?;
        tcp.set_nonblocking(true)?;
        Ok(DnsSockets { udp, tcp, uplink })
    }

    /// Where upstream resolvers are asked from (`None`: this process's namespace).
    pub fn uplink(&self) -> Option<Arc<OwnedFd>> {
        self.uplink.clone()
    }
}

/// How long a sandbox's sockets are served.
#[derive(Debug)]
pub enum Lifetime {
    /// Until the VMM with this pid ends.
    UntilExit(i32),
    /// Until the returned [`DnsGuard`] is dropped.
    WhileHeld,
}

/// Serving a sandbox's DNS until dropped ([`Lifetime::WhileHeld`]).
#[derive(Debug)]
pub struct DnsGuard {
    _stop: Option<oneshot::Sender<()>>,
}

/// Serves `sockets` for `lifetime`, deciding names by `firewall`'s policy. Errors only
/// when the forwarder cannot run at all.
pub fn serve(sockets: DnsSockets, lifetime: Lifetime, firewall: Arc<Firewall>) -> Result<DnsGuard, NetworkError> {
    let runtime = runtime()?;
    let (guard, ends) = match lifetime {
        Lifetime::WhileHeld => {
            let (tx, rx) = oneshot::channel::<()>();
            (DnsGuard { _stop: Some(tx) }, End::Dropped(rx))
        }
        Lifetime::UntilExit(pid) => (
            DnsGuard { _stop: None },
            End::Exit(
                crate::registry::pidfd_open(pid).map_err(|e| NetworkError::Dns(format!("watching VMM {pid}: {e}")))?,
            ),
        ),
    };
    runtime.spawn(async move {
        let upstreams = upstreams(sockets.uplink.is_none());
        let (Ok(udp), Ok(tcp)) =
            (tokio::net::UdpSocket::from_std(sockets.udp), tokio::net::TcpListener::from_std(sockets.tcp))
        else {
            return;
        };
        let asker = Asker { upstreams, uplink: sockets.uplink, firewall };
        tokio::select! {
            _ = ends.wait() => {}
            _ = serve_udp(Arc::new(udp), asker.clone()) => {}
            _ = serve_tcp(tcp, asker) => {}
        }
    });
    Ok(guard)
}

/// The upstream resolvers, or none (every query then fails, said once in the log).
fn upstreams(from_this_namespace: bool) -> Arc<Vec<SocketAddr>> {
    match upstream::current(from_this_namespace) {
        Ok(servers) => Arc::new(servers.to_vec()),
        Err(why) => {
            warn_once(&why);
            Arc::new(Vec::new())
        }
    }
}

/// How one sandbox's queries are answered: upstream, from the uplink's namespace,
/// under its policy.
#[derive(Clone)]
struct Asker {
    upstreams: Arc<Vec<SocketAddr>>,
    uplink: Option<Arc<OwnedFd>>,
    firewall: Arc<Firewall>,
}

#[derive(Clone, Copy)]
enum Transport {
    Udp,
    Tcp,
}

impl Asker {
    async fn upstream(&self, query: &Query, over: Transport) -> Vec<u8> {
        match over {
            Transport::Udp => relay::over_udp(query, &self.upstreams, self.uplink.as_deref()).await,
            Transport::Tcp => relay::over_tcp(query, &self.upstreams, self.uplink.as_deref()).await,
        }
    }

    /// The guest's answer to `query` under the policy: a name it may not learn is
    /// NXDOMAIN; the addresses of an allowed or denied name go to the packet filter
    /// before the guest sees the answer.
    async fn answer(&self, query: &Query, over: Transport) -> Vec<u8> {
        let name = query.name();
        match self.firewall.policy().verdict(&name) {
            NameVerdict::Refuse => query.nonexistent(),
            NameVerdict::Forward => self.upstream(query, over).await,
            NameVerdict::Allow | NameVerdict::Deny => {
                let answer = self.upstream(query, over).await;
                let addrs = forkvm_dns::answer_addresses(&answer);
                let firewall = self.firewall.clone();
                match tokio::task::spawn_blocking(move || firewall.learn(&name, &addrs)).await {
                    Ok(Ok(NameVerdict::Allow | NameVerdict::Forward)) => answer,
                    Ok(Ok(NameVerdict::Deny | NameVerdict::Refuse)) => query.nonexistent(),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "a sandbox's DNS answer could not be let through its filter");
                        query.failure()
                    }
                    Err(_) => query.failure(),
                }
            }
        }
    }
}

/// Looks up the exact names `firewall`'s policy denies (and does not allow) and blocks
/// their addresses, so that a guest that never asks cannot connect to them by address
/// either. Waits for the lookups (in parallel, each bounded by the upstreams' timeout),
/// at most four upstream timeouts in all.
pub fn block_denied_names(firewall: &Arc<Firewall>) -> Result<(), NetworkError> {
    let policy = firewall.policy();
    let names: Vec<String> = policy
        .deny
        .names
        .iter()
        .filter_map(|p| match p {
            NamePattern::Exact(n) if policy.verdict(n) == NameVerdict::Deny => Some(n.clone()),
            _ => None,
        })
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    let uplink = firewall.uplink().cloned();
    let (tx, rx) = std::sync::mpsc::channel();
    runtime()?.spawn(async move {
        let upstreams = upstreams(uplink.is_none());
        let mut lookups = tokio::task::JoinSet::new();
        for name in names {
            let (upstreams, uplink) = (upstreams.clone(), uplink.clone());
            lookups.spawn(async move {
                let query = Query::for_addresses_of(&name)?;
                let answer = relay::over_udp(&query, &upstreams, uplink.as_deref()).await;
                Some((name, forkvm_dns::answer_addresses(&answer)))
            });
        }
        let found: Vec<_> = lookups.join_all().await.into_iter().flatten().collect();
        let _ = tx.send(found);
    });
    // Bounded: past it the names are still refused at the resolver, and only their
    // addresses wait for a guest's question (or the next policy) to be blocked.
    let waited = relay::UPSTREAM_TIMEOUT * 4;
    let Ok(found) = rx.recv_timeout(waited) else {
        tracing::warn!("looking up a policy's denied names took over {waited:?}: their addresses are not blocked yet");
        return Ok(());
    };
    for (name, addrs) in found {
        firewall.learn(&name, &addrs)?;
    }
    Ok(())
}

fn warn_once(why: &str) {
    static WARNED: OnceLock<()> = OnceLock::new();
    WARNED.get_or_init(|| tracing::warn!("sandboxes' DNS queries fail: {why}"));
}

/// What ends a sandbox's service.
enum End {
    Dropped(oneshot::Receiver<()>),
    Exit(OwnedFd),
}

impl End {
    async fn wait(self) {
        match self {
            End::Dropped(rx) => {
                let _ = rx.await;
            }
            End::Exit(fd) => {
                // A pidfd turns readable when its process ends.
                // SAFETY: an OwnedFd is open and keeps its descriptor until the AsyncFd,
                // which owns it, is dropped.
                let registered =
                    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
                if let Ok(fd) = registered {
                    let _ = fd.readable().await;
                }
            }
        }
    }
}

async fn serve_udp(sock: Arc<tokio::net::UdpSocket>, asker: Asker) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf).await else { continue };
        if from.ip() != IpAddr::V4(GUEST_IP) {
            continue;
        }
        let query = match Query::parse(&buf[..n]) {
            Ok(q) => q,
            Err(Refused::Answer(bytes)) => {
                let _ = sock.send_to(&bytes, from).await;
                continue;
            }
            Err(Refused::Garbage) => continue,
        };
        // Over the bound, the query is dropped: the guest's resolver asks again.
        let Ok(permit) = in_flight.clone().try_acquire_owned() else { continue };
        let (sock, asker) = (sock.clone(), asker.clone());
        tokio::spawn(async move {
            let answer = asker.answer(&query, Transport::Udp).await;
            let _ = sock.send_to(&answer, from).await;
            drop(permit);
        });
    }
}

async fn serve_tcp(listener: tokio::net::TcpListener, asker: Asker) {
    let connections = Arc::new(Semaphore::new(TCP_CONNECTIONS));
    loop {
        let Ok((mut conn, from)) = listener.accept().await else { continue };
        if from.ip() != IpAddr::V4(GUEST_IP) {
            continue;
        }
        let Ok(permit) = connections.clone().try_acquire_owned() else { continue };
        let asker = asker.clone();
        tokio::spawn(async move {
            while let Ok(Ok(bytes)) = tokio::time::timeout(TCP_IDLE, relay::read_framed(&mut conn)).await {
                let answer = match Query::parse(&bytes) {
                    Ok(query) => asker.answer(&query, Transport::Tcp).await,
                    Err(Refused::Answer(bytes)) => bytes,
                    Err(Refused::Garbage) => break,
                };
                let mut framed = (answer.len() as u16).to_be_bytes().to_vec();
                framed.extend_from_slice(&answer);
                if conn.write_all(&framed).await.is_err() {
                    break;
                }
            }
            drop(permit);
        });
    }
}

/// The forwarder's runtime: one thread, started once, in this process's namespace (it
/// steps into an uplink only to make a socket there: `relay::made_in`).
fn runtime() -> Result<&'static tokio::runtime::Handle, NetworkError> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Handle, String>> = OnceLock::new();
    let made = RUNTIME.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new().name("dns".into()).spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(format!("its runtime: {e}")));
                    return;
                }
            };
            let _ = tx.send(Ok(rt.handle().clone()));
            rt.block_on(std::future::pending::<()>());
        });
        if let Err(e) = spawned {
            return Err(format!("its thread: {e}"));
        }
        rx.recv().unwrap_or_else(|_| Err("its thread ended".into()))
    });
    made.as_ref().map_err(|e| NetworkError::Dns(format!("the forwarder: {e}")))
}
