//! DPoP proofs (RFC 9449) for exposed ports whose token is bound to a key: the token
//! alone opens nothing; each request must also carry a proof, a JWT signed by the key
//! the port was bound to (its RFC 7638 thumbprint, `jkt`), naming this request's method
//! and URL, the hash of the token, a fresh time and an id never seen before. A leaked
//! token (a log, a browser history, a guest that read it) is useless without the key.
//!
//! Checked here (§4.3): one `DPoP` header; `typ` `dpop+jwt`; an asymmetric `alg`; the
//! public `jwk` in the header, whose signature verifies and whose thumbprint is the
//! port's `jkt`; `htm` the request's method; `htu` its scheme-less authority and path
//! (query and fragment ignored); `iat` within [`MAX_SKEW`] of now; `ath` the token's
//! SHA-256; and `jti` not seen within the window ([`ReplayCache`], bounded).

use base64::Engine;
use jsonwebtoken::jwk::ThumbprintHash;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use sha2::Digest;
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How far a proof's `iat` may be from the daemon's clock.
pub const MAX_SKEW: Duration = Duration::from_secs(60);
/// Proof ids remembered at most (a flood of proofs pushes the oldest out; a replay of
/// an id pushed out is still refused by its `iat` once older than [`MAX_SKEW`]).
const REPLAY_CAPACITY: usize = 100_000;
/// Longest proof read.
const MAX_PROOF_BYTES: usize = 8 << 10;

/// The signature algorithms a proof may use (no `none`, no shared-secret HMAC).
const ALLOWED: &[Algorithm] = &[
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

/// Why a proof is refused (each a 401 with `WWW-Authenticate: DPoP`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DpopError {
    #[error("this port's token is bound to a key: send it as `Authorization: DPoP <token>` with a `DPoP` proof")]
    Missing,
    #[error("the DPoP proof is malformed: {0}")]
    Malformed(String),
    #[error("the DPoP proof's {0}")]
    Mismatch(&'static str),
    #[error("the DPoP proof was used before (its jti)")]
    Replayed,
}

#[derive(Debug, serde::Deserialize)]
struct Claims {
    jti: String,
    htm: String,
    htu: String,
    iat: i64,
    #[serde(default)]
    ath: Option<String>,
}

/// What a request's proof must match.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    pub method: &'a str,
    /// The request's `Host` header.
    pub authority: &'a str,
    pub path: &'a str,
    /// The access token presented with it.
    pub token: &'a str,
    /// The thumbprint the port's token is bound to.
    pub jkt: &'a str,
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// `ath`: the base64url SHA-256 of an access token.
pub fn token_hash(token: &str) -> String {
    b64url(&sha2::Sha256::digest(token.as_bytes()))
}

/// The RFC 7638 SHA-256 thumbprint of a public JWK (JSON), as a port is bound to it.
pub fn thumbprint(jwk_json: &str) -> Result<String, DpopError> {
    let jwk: jsonwebtoken::jwk::Jwk =
        serde_json::from_str(jwk_json).map_err(|e| DpopError::Malformed(format!("the JWK: {e}")))?;
    jwk.thumbprint(ThumbprintHash::SHA256).map_err(|e| DpopError::Malformed(format!("the JWK's thumbprint: {e}")))
}

/// Whether `jkt` looks like a SHA-256 thumbprint (43 base64url characters).
pub fn is_thumbprint(jkt: &str) -> bool {
    jkt.len() == 43 && jkt.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Checks `proof` against what the request must be; on success its id is remembered.
pub fn verify(proof: &str, want: Expected<'_>) -> Result<(), DpopError> {
    verify_at(proof, want, SystemTime::now(), replay_cache())
}

fn verify_at(proof: &str, want: Expected<'_>, now: SystemTime, seen: &Mutex<ReplayCache>) -> Result<(), DpopError> {
    if proof.len() > MAX_PROOF_BYTES {
        return Err(DpopError::Malformed(format!("longer than {MAX_PROOF_BYTES} bytes")));
    }
    let header = jsonwebtoken::decode_header(proof).map_err(|e| DpopError::Malformed(e.to_string()))?;
    if header.typ.as_deref() != Some("dpop+jwt") {
        return Err(DpopError::Mismatch("typ is not dpop+jwt"));
    }
    if !ALLOWED.contains(&header.alg) {
        return Err(DpopError::Mismatch("alg is not an asymmetric signature algorithm"));
    }
    let jwk = header.jwk.ok_or(DpopError::Mismatch("header has no jwk"))?;
    let jkt = jwk.thumbprint(ThumbprintHash::SHA256).map_err(|e| DpopError::Malformed(format!("jwk: {e}")))?;
    if jkt != want.jkt {
        return Err(DpopError::Mismatch("key is not the one this port is bound to"));
    }
    let key = DecodingKey::from_jwk(&jwk).map_err(|e| DpopError::Malformed(format!("jwk: {e}")))?;
    let mut validation = Validation::new(header.alg);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_aud = false;
    let claims = jsonwebtoken::decode::<Claims>(proof, &key, &validation)
        .map_err(|e| DpopError::Malformed(format!("signature or claims: {e}")))?
        .claims;
    if !claims.htm.eq_ignore_ascii_case(want.method) {
        return Err(DpopError::Mismatch("htm is not this request's method"));
    }
    if !htu_matches(&claims.htu, want.authority, want.path) {
        return Err(DpopError::Mismatch("htu is not this request's URL"));
    }
    if claims.ath.as_deref() != Some(token_hash(want.token).as_str()) {
        return Err(DpopError::Mismatch("ath is not the hash of the token presented"));
    }
    let now_s = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    if (claims.iat - now_s).unsigned_abs() > MAX_SKEW.as_secs() {
        return Err(DpopError::Mismatch("iat is too far from now"));
    }
    if claims.jti.is_empty() || claims.jti.len() > 256 {
        return Err(DpopError::Mismatch("jti is empty or longer than 256 bytes"));
    }
    let fresh = seen.lock().unwrap_or_else(|p| p.into_inner()).insert(format!("{jkt}:{}", claims.jti), now_s);
    if fresh {
        Ok(())
    } else {
        Err(DpopError::Replayed)
    }
}

/// Whether a proof's `htu` names the request at `authority` and `path` (scheme, query
/// and fragment aside: a TLS terminator in front may change the scheme).
fn htu_matches(htu: &str, authority: &str, path: &str) -> bool {
    let Some((_, rest)) = htu.split_once("://") else { return false };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (host, htu_path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    host.eq_ignore_ascii_case(authority) && htu_path == path
}

/// Proof ids seen within the window, oldest first, at most [`REPLAY_CAPACITY`].
#[derive(Debug, Default)]
pub struct ReplayCache {
    seen: HashMap<String, i64>,
    order: VecDeque<(String, i64)>,
}

impl ReplayCache {
    /// Remembers `id` seen at `now_s`; false when it was already there.
    fn insert(&mut self, id: String, now_s: i64) -> bool {
        let horizon = now_s - 2 * MAX_SKEW.as_secs() as i64;
        while let Some((old, at)) = self.order.front() {
            if *at >= horizon && self.order.len() < REPLAY_CAPACITY {
                break;
            }
            if self.seen.get(old) == Some(at) {
                self.seen.remove(old);
            }
            self.order.pop_front();
        }
        if self.seen.contains_key(&id) {
            return false;
        }
        self.seen.insert(id.clone(), now_s);
        self.order.push_back((id, now_s));
        true
    }
}

fn replay_cache() -> &'static Mutex<ReplayCache> {
    static CACHE: OnceLock<Mutex<ReplayCache>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};

    /// A P-256 key: its signing key and public JWK (JSON).
    pub(crate) fn key() -> (EncodingKey, String) {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let point = pair.public_key_raw();
        assert_eq!((point.len(), point[0]), (65, 4), "an uncompressed P-256 point");
        let jwk = serde_json::json!({
            "kty": "EC", "crv": "P-256", "x": b64url(&point[1..33]), "y": b64url(&point[33..]),
        });
        (EncodingKey::from_ec_der(&pair.serialize_der()), jwk.to_string())
    }

    /// A proof with these claims, signed by `key` carrying `jwk`.
    pub(crate) fn proof(key: &EncodingKey, jwk: &str, claims: serde_json::Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.typ = Some("dpop+jwt".into());
        header.jwk = Some(serde_json::from_str(jwk).unwrap());
        jsonwebtoken::encode(&header, &claims, key).unwrap()
    }

    fn now_s() -> i64 {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
    }

    #[test]
    fn a_proof_holds_for_its_request_once() {
        let (key, jwk) = key();
        let jkt = thumbprint(&jwk).unwrap();
        assert!(is_thumbprint(&jkt), "{jkt}");
        let want = Expected {
            method: "GET",
            authority: "127.0.0.1:8889",
            path: "/v1/sandboxes/a/ports/80/x",
            token: "fvp_t",
            jkt: &jkt,
        };
        let claims = |over: serde_json::Value| {
            let mut c = serde_json::json!({
                "jti": format!("id-{}", rand_id()), "htm": "GET", "htu": "http://127.0.0.1:8889/v1/sandboxes/a/ports/80/x?q=1",
                "iat": now_s(), "ath": token_hash("fvp_t"),
            });
            c.as_object_mut().unwrap().extend(over.as_object().unwrap().clone());
            c
        };
        let cache = Mutex::new(ReplayCache::default());
        let check = |p: &str| verify_at(p, want, SystemTime::now(), &cache);
        let good = proof(&key, &jwk, claims(serde_json::json!({})));
        assert_eq!(check(&good), Ok(()));
        assert_eq!(check(&good), Err(DpopError::Replayed));
        let refused = [
            (serde_json::json!({"htm": "POST"}), "htm"),
            (serde_json::json!({"htu": "http://127.0.0.1:8889/v1/sandboxes/a/ports/80/y"}), "htu"),
            (serde_json::json!({"htu": "http://evil.example/v1/sandboxes/a/ports/80/x"}), "htu"),
            (serde_json::json!({"ath": token_hash("fvp_other")}), "ath"),
            (serde_json::json!({"iat": now_s() - 3600}), "iat"),
        ];
        for (over, what) in refused {
            let err = check(&proof(&key, &jwk, claims(over))).unwrap_err();
            assert!(err.to_string().contains(what), "{what}: {err}");
        }
        // Another key, even with every claim right.
        let (other, other_jwk) = super::tests::key();
        let err = check(&proof(&other, &other_jwk, claims(serde_json::json!({})))).unwrap_err();
        assert_eq!(err, DpopError::Mismatch("key is not the one this port is bound to"));
        // A header naming one key over a signature by another.
        let forged = proof(&other, &jwk, claims(serde_json::json!({})));
        assert!(matches!(check(&forged), Err(DpopError::Malformed(_))), "{:?}", check(&forged));
        // Not a DPoP proof at all, or an HMAC one.
        assert!(matches!(check("a.b.c"), Err(DpopError::Malformed(_))));
        let mut hs = Header::new(Algorithm::HS256);
        hs.typ = Some("dpop+jwt".into());
        let hmac = jsonwebtoken::encode(&hs, &claims(serde_json::json!({})), &EncodingKey::from_secret(b"k").unwrap())
            .unwrap();
        assert_eq!(check(&hmac), Err(DpopError::Mismatch("alg is not an asymmetric signature algorithm")));
    }

    /// A proof id no other proof of this process has.
    pub(crate) fn rand_id() -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    #[test]
    fn the_replay_cache_is_bounded_and_forgets_old_ids() {
        let mut c = ReplayCache::default();
        assert!(c.insert("a".into(), 1000));
        assert!(!c.insert("a".into(), 1001));
        assert!(c.insert("a".into(), 1000 + 3 * MAX_SKEW.as_secs() as i64), "forgotten past the window");
        for i in 0..REPLAY_CAPACITY + 10 {
            c.insert(format!("n{i}"), 5000);
        }
        assert!(c.order.len() <= REPLAY_CAPACITY && c.seen.len() <= REPLAY_CAPACITY);
    }
}
