//! The one list of error classes, used end to end: a library error says which class it
//! is (`code()`), the VMM's control socket and the daemon's spawner carry it across
//! their process hops as this type, the daemon answers with its HTTP status, and the
//! Rust client hands it back typed. Nothing matches on error text to find a class.

use serde::{Deserialize, Serialize};

/// What kind of failure an error is, as its `code` in every error body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request cannot be done as asked (a bad id, field, tag or value).
    BadRequest,
    /// No or a wrong bearer token.
    Unauthorized,
    /// Refused by policy (origin, fault injection off).
    Forbidden,
    /// What the request names does not exist.
    NotFound,
    /// The HTTP method is not served on that path.
    MethodNotAllowed,
    /// The object is in the wrong state for the request; the body's `state` says which.
    Conflict,
    /// A JSON body without `Content-Type: application/json`.
    UnsupportedMediaType,
    /// Too much in flight; try again.
    Busy,
    /// The host has no space left for what the request writes.
    DiskFull,
    /// A sandbox's guest did not answer on the port asked for (nothing listens there,
    /// or it closed the connection): exposed ports and port forwarding.
    BadGateway,
    /// Anything else: a failure of the host or of forkvm, not of the request.
    Internal,
    /// A code this build does not know (a newer peer's); treated as internal.
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// Every code a forkvm peer sends (not [`ErrorCode::Unknown`]).
    pub const ALL: [ErrorCode; 11] = [
        ErrorCode::BadRequest,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Conflict,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::Busy,
        ErrorCode::DiskFull,
        ErrorCode::BadGateway,
        ErrorCode::Internal,
    ];

    /// The wire name (`not_found`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Conflict => "conflict",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::Busy => "busy",
            ErrorCode::DiskFull => "disk_full",
            ErrorCode::BadGateway => "bad_gateway",
            ErrorCode::Internal | ErrorCode::Unknown => "internal",
        }
    }

    /// The HTTP status the daemon answers with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::BadRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Conflict => 409,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::Busy => 503,
            ErrorCode::DiskFull => 507,
            ErrorCode::BadGateway => 502,
            ErrorCode::Internal | ErrorCode::Unknown => 500,
        }
    }
}

impl ErrorCode {
    /// The code of an HTTP error status, for an error body that carries none (forkd's,
    /// a proxy's page): the inverse of [`ErrorCode::http_status`], else internal. A 502
    /// without a body saying `bad_gateway` is a proxy's in front of the daemon, not a
    /// guest's port: internal.
    pub fn from_http_status(status: u16) -> ErrorCode {
        ErrorCode::ALL
            .into_iter()
            .filter(|c| *c != ErrorCode::BadGateway)
            .find(|c| c.http_status() == status)
            .unwrap_or(ErrorCode::Internal)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_by_their_wire_names_and_unknown_ones_are_kept_apart() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
            assert!((400..600).contains(&code.http_status()), "{code}");
        }
        assert_eq!(serde_json::from_str::<ErrorCode>("\"quota_exceeded\"").unwrap(), ErrorCode::Unknown);
        assert_eq!(ErrorCode::Unknown.http_status(), 500);
        for code in ErrorCode::ALL.into_iter().filter(|c| *c != ErrorCode::BadGateway) {
            assert_eq!(ErrorCode::from_http_status(code.http_status()), code);
        }
        assert_eq!(ErrorCode::from_http_status(502), ErrorCode::Internal, "only the daemon's body says bad_gateway");
        assert_eq!(ErrorCode::from_http_status(504), ErrorCode::Internal);
        let mut statuses: Vec<u16> = ErrorCode::ALL.iter().map(|c| c.http_status()).collect();
        statuses.dedup();
        assert_eq!(statuses.len(), ErrorCode::ALL.len(), "each code has its own status");
    }
}
