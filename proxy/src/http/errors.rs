//! Answers the proxy gives itself when the upstream cannot: for REST clients the shape the
//! listener's `error_body` names (Qdrant's JSON envelope or plain text), for gRPC clients a
//! trailers-only status.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use super::body::ResponseBody;
use crate::config::ErrorBody;

/// gRPC status codes we produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrpcCode {
    /// 3: the client's request was malformed.
    InvalidArgument = 3,
    /// 4: the upstream did not answer in time.
    DeadlineExceeded = 4,
    /// 8: the request is larger than allowed.
    ResourceExhausted = 8,
    /// 12: the method is not served (CONNECT).
    Unimplemented = 12,
    /// 13: the proxy failed.
    Internal = 13,
    /// 14: the upstream is down or refused.
    Unavailable = 14,
}

/// Which side failed, which decides the status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Upstream refused, reset, or spoke nonsense: 502 / UNAVAILABLE.
    UpstreamUnavailable,
    /// Upstream too slow: 504 / DEADLINE_EXCEEDED.
    UpstreamTimeout,
    /// Client sent a body over the limit: 413 / RESOURCE_EXHAUSTED.
    RequestTooLarge,
    /// Client sent a request head over the limit: 431 / RESOURCE_EXHAUSTED.
    HeadersTooLarge,
    /// The proxy could not build the upstream request: 500 / INTERNAL.
    Internal,
    /// The upstream already has `limits.max_upstream_requests` in flight: 503 /
    /// RESOURCE_EXHAUSTED, at once, without queueing.
    Overloaded,
    /// The client's body framing was broken or cut (bad chunk, a reset mid-body): 400 /
    /// INVALID_ARGUMENT; the client's fault, not the upstream's.
    ClientBody,
    /// CONNECT: the proxy forwards requests, it does not open tunnels: 405 / UNIMPLEMENTED.
    MethodNotAllowed,
    /// Over a listener's rate limit: 429 / RESOURCE_EXHAUSTED, with when to retry.
    RateLimited,
}

impl Failure {
    fn http_status(self) -> StatusCode {
        match self {
            Self::UpstreamUnavailable => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::HeadersTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Self::ClientBody => StatusCode::BAD_REQUEST,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    fn grpc_code(self) -> GrpcCode {
        match self {
            Self::UpstreamUnavailable => GrpcCode::Unavailable,
            Self::UpstreamTimeout => GrpcCode::DeadlineExceeded,
            Self::RequestTooLarge
            | Self::HeadersTooLarge
            | Self::Overloaded
            | Self::RateLimited => GrpcCode::ResourceExhausted,
            Self::Internal => GrpcCode::Internal,
            Self::ClientBody => GrpcCode::InvalidArgument,
            Self::MethodNotAllowed => GrpcCode::Unimplemented,
        }
    }
}

/// Builds the error response for a REST or gRPC client. `message` goes to the client: it
/// must name nothing internal (no upstream address, no OS error; those go to the log).
/// `retry_after`, when the client should wait before retrying (a rate limit), becomes
/// REST's `Retry-After` and gRPC's `grpc-retry-pushback-ms` (which gRPC's retry policy
/// honours) plus `retry-after` (which qdrant-client's uploader waits for); overloaded
/// answers say one second.
pub fn error_response(
    failure: Failure,
    grpc: bool,
    shape: ErrorBody,
    message: &str,
    elapsed_secs: f64,
    retry_after: Option<std::time::Duration>,
) -> Response<ResponseBody> {
    let retry_after = retry_after
        .or_else(|| (failure == Failure::Overloaded).then_some(std::time::Duration::from_secs(1)));
    // Whole seconds, at least one: HTTP's Retry-After has no fractions, and qdrant-client
    // takes 0 for "no advice".
    let retry_after_secs = retry_after.map(|d| d.as_secs_f64().ceil().max(1.0) as u64);
    if grpc {
        // Trailers-only response: HTTP 200 with the status in the headers, as gRPC servers
        // answer calls that fail before any message.
        let mut resp = Response::new(ResponseBody::empty());
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        h.insert("grpc-status", HeaderValue::from(failure.grpc_code() as u16));
        if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
            h.insert("grpc-message", v);
        }
        if let (Some(d), Some(secs)) = (retry_after, retry_after_secs) {
            h.insert(
                "grpc-retry-pushback-ms",
                HeaderValue::from(d.as_millis().max(1) as u64),
            );
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        return resp;
    }
    let (body, content_type) = match shape {
        ErrorBody::Qdrant => {
            let envelope = serde_json::json!({
                "status": { "error": message },
                "time": elapsed_secs,
            });
            (envelope.to_string(), "application/json")
        }
        ErrorBody::Text => (format!("{message}\n"), "text/plain; charset=utf-8"),
    };
    let mut resp = Response::new(ResponseBody::local(Bytes::from(body)));
    *resp.status_mut() = failure.http_status();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Some(secs) = retry_after_secs {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if failure == Failure::MethodNotAllowed {
        resp.headers_mut().insert(
            header::ALLOW,
            HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
        );
    }
    resp
}

/// grpc-message is percent-encoded (gRPC over HTTP/2 spec): everything outside printable
/// ASCII, and '%' itself.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use http_body_util::BodyExt;

    async fn body_text(r: Response<ResponseBody>) -> String {
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn rest_answers_take_the_listeners_shape() {
        let r = error_response(
            Failure::UpstreamUnavailable,
            false,
            ErrorBody::Qdrant,
            "upstream down",
            0.5,
            None,
        );
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        let envelope: serde_json::Value = serde_json::from_str(&body_text(r).await).unwrap();
        assert_eq!(envelope["status"]["error"], "upstream down");
        assert_eq!(envelope["time"], 0.5);

        let r = error_response(
            Failure::RequestTooLarge,
            false,
            ErrorBody::Text,
            "too large",
            0.5,
            None,
        );
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        assert_eq!(body_text(r).await, "too large\n");
    }

    #[test]
    fn grpc_answers_are_trailers_only_whatever_the_rest_shape() {
        for shape in [ErrorBody::Qdrant, ErrorBody::Text] {
            let r = error_response(
                Failure::UpstreamTimeout,
                true,
                shape,
                "slow 100%",
                0.0,
                None,
            );
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.headers()["grpc-status"], "4");
            assert_eq!(r.headers()["grpc-message"], "slow 100%25");
        }
    }

    /// A rate limit's answer says when to come back: 1.2 s is `Retry-After: 2` (whole
    /// seconds, rounded up) and `grpc-retry-pushback-ms: 1200`; under a second is 1.
    #[test]
    fn rate_limited_answers_say_when_to_retry() {
        let wait = Some(std::time::Duration::from_millis(1200));
        let r = error_response(
            Failure::RateLimited,
            false,
            ErrorBody::Qdrant,
            "slow down",
            0.0,
            wait,
        );
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        let r = error_response(
            Failure::RateLimited,
            true,
            ErrorBody::Qdrant,
            "slow down",
            0.0,
            wait,
        );
        assert_eq!(r.headers()["grpc-status"], "8");
        assert_eq!(r.headers()["grpc-retry-pushback-ms"], "1200");
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        let short = Some(std::time::Duration::from_millis(30));
        let r = error_response(
            Failure::RateLimited,
            false,
            ErrorBody::Text,
            "x",
            0.0,
            short,
        );
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = error_response(Failure::Overloaded, false, ErrorBody::Text, "x", 0.0, None);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }
}
