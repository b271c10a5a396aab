//! One query, from a guest to an upstream resolver and back, checked both ways.

use crate::network::enter::{enter_thread, thread_namespace};
pub use forkvm_dns::{Query, Refused};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The largest DNS message taken from a guest or an upstream over UDP.
pub const MAX_MESSAGE: usize = 4096;
/// How long one upstream has to answer.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);

fn fresh_id() -> u16 {
    let mut b = [0u8; 2];
    // A failed read leaves zeroes: an id still checked on the way back.
    let _ = getrandom::getrandom(&mut b);
    u16::from_be_bytes(b)
}

fn any_port(upstream: SocketAddr) -> SocketAddr {
    match upstream {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    }
}

/// Runs `f` (which makes sockets) with the calling thread in `uplink`'s namespace
/// (`None`: where it is), and moves the thread back: a socket belongs to the namespace
/// it was made in. `f` must not await.
fn made_in<T>(uplink: Option<&OwnedFd>, f: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
    let Some(uplink) = uplink else { return f() };
    thread_local! {
        /// Where this thread returns to, opened once.
        static HOME: Option<OwnedFd> = thread_namespace().ok();
    }
    HOME.with(|home| {
        let home = home.as_ref().ok_or_else(|| std::io::Error::other("this thread's namespace could not be opened"))?;
        enter_thread(uplink)?;
        let made = f();
        // Failing here would leave the thread in the uplink, which only changes where
        // its later sockets are made.
        if let Err(e) = enter_thread(home) {
            tracing::warn!(error = %e, "the DNS thread could not leave the uplink");
        }
        made
    })
}

/// Asks `upstreams` (from `uplink`'s namespace) in turn over UDP, each from a fresh
/// socket (a fresh port); the answer, or SERVFAIL.
pub async fn over_udp(query: &Query, upstreams: &[SocketAddr], uplink: Option<&OwnedFd>) -> Vec<u8> {
    for &upstream in upstreams {
        let id = fresh_id();
        let Ok(sock) = made_in(uplink, || {
            let s = std::net::UdpSocket::bind(any_port(upstream))?;
            s.set_nonblocking(true)?;
            Ok(s)
        }) else {
            continue;
        };
        let asked = async {
            let sock = tokio::net::UdpSocket::from_std(sock).ok()?;
            sock.connect(upstream).await.ok()?;
            sock.send(&query.with_id(id)).await.ok()?;
            let mut buf = vec![0u8; MAX_MESSAGE];
            loop {
                let n = sock.recv(&mut buf).await.ok()?;
                if let Some(answer) = query.check_answer(id, buf[..n].to_vec()) {
                    return Some(answer);
                }
            }
        };
        if let Ok(Some(answer)) = tokio::time::timeout(UPSTREAM_TIMEOUT, asked).await {
            return answer;
        }
    }
    query.failure()
}

/// Asks `upstreams` (from `uplink`'s namespace) in turn over TCP; the answer, or
/// SERVFAIL.
pub async fn over_tcp(query: &Query, upstreams: &[SocketAddr], uplink: Option<&OwnedFd>) -> Vec<u8> {
    for &upstream in upstreams {
        let id = fresh_id();
        let made = made_in(uplink, || match upstream {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        });
        let Ok(sock) = made else { continue };
        let asked = async {
            let mut conn = sock.connect(upstream).await.ok()?;
            let bytes = query.with_id(id);
            let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(&bytes);
            conn.write_all(&framed).await.ok()?;
            let answer = read_framed(&mut conn).await.ok()?;
            query.check_answer(id, answer)
        };
        if let Ok(Some(answer)) = tokio::time::timeout(UPSTREAM_TIMEOUT, asked).await {
            return answer;
        }
    }
    query.failure()
}

/// One length-prefixed message from a DNS TCP stream.
pub async fn read_framed<R: AsyncReadExt + Unpin>(r: &mut R) -> std::io::Result<Vec<u8>> {
    let len = r.read_u16().await? as usize;
    let mut message = vec![0u8; len];
    r.read_exact(&mut message).await?;
    Ok(message)
}
