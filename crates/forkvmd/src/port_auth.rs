//! Who may pass to an exposed port ([`crate::port_proxy`]): the port's own token, never
//! the API's. A bearer token comes in `X-Forkvm-Port-Token`, once as `?forkvm_token=`
//! (a browser's first visit) or in the cookie that visit set. A token bound to a key
//! comes only as `Authorization: DPoP <token>` with a proof of that key
//! ([`crate::dpop`]), so the token alone opens nothing.
//!
//! Refusals: 401 with no token (or, for a bound port, no valid proof; with
//! `WWW-Authenticate: DPoP`), 403 with a token that is not this port's.

use crate::dpop::{self, DpopError};
use crate::error::ApiError;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use forkvm_api::ports::{PORT_TOKEN_COOKIE, PORT_TOKEN_HEADER, PORT_TOKEN_QUERY};
use forkvm_sandbox::registry::ExposedPortRecord;

/// Where the token of a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenFrom {
    Header,
    Query,
    Cookie,
    /// `Authorization: DPoP`, its proof checked.
    Dpop,
}

/// A request the proxy does not pass on: the error, and whether to ask for DPoP.
#[derive(Debug)]
pub struct Refusal {
    pub error: ApiError,
    pub dpop_challenge: bool,
}

impl From<ApiError> for Refusal {
    fn from(error: ApiError) -> Refusal {
        Refusal { error, dpop_challenge: false }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut r = self.error.into_response();
        if self.dpop_challenge {
            let algs = r#"DPoP algs="ES256 ES384 RS256 RS384 RS512 PS256 PS384 PS512""#;
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(algs));
        }
        r
    }
}

/// The token a request presents, and where (header first, then query, then cookies).
/// Every cookie of the name is returned: a browser may hold one per path.
fn presented_tokens(headers: &HeaderMap, query: Option<&str>) -> Vec<(Vec<u8>, TokenFrom)> {
    if let Some(v) = headers.get(PORT_TOKEN_HEADER) {
        return vec![(v.as_bytes().to_vec(), TokenFrom::Header)];
    }
    if let Some(t) = query_token(query) {
        return vec![(t.as_bytes().to_vec(), TokenFrom::Query)];
    }
    cookie_pairs(headers)
        .filter(|(k, _)| *k == PORT_TOKEN_COOKIE)
        .map(|(_, v)| (v.as_bytes().to_vec(), TokenFrom::Cookie))
        .collect()
}

fn query_token(query: Option<&str>) -> Option<&str> {
    query?.split('&').find_map(|pair| pair.strip_prefix(PORT_TOKEN_QUERY)?.strip_prefix('='))
}

/// The `name=value` pairs of every `Cookie` header.
pub fn cookie_pairs(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
}

fn forbidden(id: &str, port: u16) -> ApiError {
    ApiError::new(
        forkvm_api::ErrorCode::Forbidden,
        format!("that token is not the one of port {port} of sandbox {id:?} (a fork's child has tokens of its own)"),
    )
}

/// Whether the request (`method`, its `headers`, raw `path` and `query`) may pass to
/// `exposed`, a port of sandbox `id`; where its token came from.
pub fn authorize(
    exposed: &ExposedPortRecord,
    id: &str,
    method: &str,
    headers: &HeaderMap,
    path: &str,
    query: Option<&str>,
) -> Result<TokenFrom, Refusal> {
    if let Some(jkt) = &exposed.dpop_jkt {
        return authorize_dpop(exposed, jkt, id, method, headers, path);
    }
    let presented = presented_tokens(headers, query);
    match presented.iter().find(|(t, _)| exposed.token_matches(t)) {
        Some((_, from)) => Ok(*from),
        None if presented.is_empty() => Err(ApiError::unauthorized(format!(
            "this port needs its token: header {PORT_TOKEN_HEADER}, or ?{PORT_TOKEN_QUERY}= once in a browser"
        ))
        .into()),
        None => Err(forbidden(id, exposed.port).into()),
    }
}

fn authorize_dpop(
    exposed: &ExposedPortRecord,
    jkt: &str,
    id: &str,
    method: &str,
    headers: &HeaderMap,
    path: &str,
) -> Result<TokenFrom, Refusal> {
    let challenge = |e: DpopError| Refusal { error: ApiError::unauthorized(e.to_string()), dpop_challenge: true };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("DPoP "))
        .ok_or_else(|| challenge(DpopError::Missing))?;
    if !exposed.token_matches(token.as_bytes()) {
        return Err(forbidden(id, exposed.port).into());
    }
    let mut proofs = headers.get_all("dpop").iter();
    let (Some(proof), None) = (proofs.next(), proofs.next()) else {
        return Err(challenge(DpopError::Malformed("a request carries exactly one DPoP header".into())));
    };
    let proof = proof.to_str().map_err(|_| challenge(DpopError::Malformed("not text".into())))?;
    let authority = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    dpop::verify(proof, dpop::Expected { method, authority, path, token, jkt }).map_err(challenge)?;
    Ok(TokenFrom::Dpop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::headers;

    #[test]
    fn tokens_come_from_the_header_the_query_or_cookies() {
        let h = headers(&[("x-forkvm-port-token", "fvp_h"), ("cookie", "forkvm_port_token=fvp_c")]);
        assert_eq!(presented_tokens(&h, Some("forkvm_token=fvp_q")), [(b"fvp_h".to_vec(), TokenFrom::Header)]);
        let h = headers(&[("cookie", "a=1; forkvm_port_token=fvp_c1"), ("cookie", "forkvm_port_token=fvp_c2")]);
        assert_eq!(presented_tokens(&h, Some("x=1&forkvm_token=fvp_q")), [(b"fvp_q".to_vec(), TokenFrom::Query)]);
        assert_eq!(
            presented_tokens(&h, Some("forkvm_tokenx=1")),
            [(b"fvp_c1".to_vec(), TokenFrom::Cookie), (b"fvp_c2".to_vec(), TokenFrom::Cookie)]
        );
        assert!(presented_tokens(&HeaderMap::new(), None).is_empty());
    }

    #[test]
    fn a_bound_port_takes_its_token_only_with_a_proof_of_its_key() {
        let (key, jwk) = crate::dpop::tests::key();
        let jkt = crate::dpop::thumbprint(&jwk).unwrap();
        let port = ExposedPortRecord { port: 80, token: "fvp_t".into(), created_at_unix_ms: 0, dpop_jkt: Some(jkt) };
        let path = "/v1/sandboxes/a/ports/80/x";
        let proof = |htm: &str| {
            let claims = serde_json::json!({
                "jti": format!("p{}", crate::dpop::tests::rand_id()), "htm": htm, "htu": format!("http://forkvmd{path}"),
                "iat": jsonwebtoken::get_current_timestamp(), "ath": crate::dpop::token_hash("fvp_t"),
            });
            crate::dpop::tests::proof(&key, &jwk, claims)
        };
        let check = |pairs: &[(&'static str, &str)]| authorize(&port, "a", "GET", &headers(pairs), path, None);
        let good = proof("GET");
        let ok = [("host", "forkvmd"), ("authorization", "DPoP fvp_t"), ("dpop", good.as_str())];
        assert_eq!(check(&ok).unwrap(), TokenFrom::Dpop);
        // The token alone, as a bearer would send it: asked for a proof.
        let r = check(&[("host", "forkvmd"), ("x-forkvm-port-token", "fvp_t")]).unwrap_err();
        assert!(r.dpop_challenge && r.error.status() == 401, "{r:?}");
        // Another token: 403; a proof for another method, or none: 401.
        let other = proof("GET");
        let r = check(&[("host", "forkvmd"), ("authorization", "DPoP fvp_x"), ("dpop", other.as_str())]).unwrap_err();
        assert_eq!(r.error.status(), 403);
        let post = proof("POST");
        let r = check(&[("host", "forkvmd"), ("authorization", "DPoP fvp_t"), ("dpop", post.as_str())]).unwrap_err();
        assert!(r.error.message.contains("htm"), "{r:?}");
        let r = check(&[("host", "forkvmd"), ("authorization", "DPoP fvp_t")]).unwrap_err();
        assert!(r.error.message.contains("exactly one"), "{r:?}");
        // A proof used twice.
        let r = check(&ok).unwrap_err();
        assert!(r.error.message.contains("used before"), "{r:?}");
    }
}
