//! A forwarded request's trace: the W3C context read or started (`trace`), and the span's
//! first attributes, OpenTelemetry's semantic conventions for the request, the client, the
//! TLS handshake that carried it and, for gRPC, the service and method.

use http::Request;
use hyper::body::Incoming;

use super::head::is_grpc;
use super::{ForwardService, HttpForwarder};

impl HttpForwarder {
    /// The request's trace (see `trace`), with the attributes its span starts with: the
    /// request, the client, and the TLS handshake that carried it.
    pub(super) fn begin_trace(
        &self,
        req: &mut Request<Incoming>,
        client: &ForwardService,
        method: Option<&crate::metrics::MethodHandles>,
    ) -> Option<crate::trace::RequestTrace> {
        use crate::trace::Attribute::{Bool, Text};
        let tracer = self.controls.tracer.as_ref()?;
        let http_method = req.method().clone();
        let label = method.map(|m| m.method.clone());
        let mut trace = tracer.begin(req.headers_mut(), || match &label {
            Some(label) if &**label != crate::metrics::METHOD_OTHER => label.to_string(),
            _ => http_method.to_string(),
        })?;
        if let Some(span) = trace.span.as_deref_mut() {
            span.set("http.request.method", Text(req.method().to_string()));
            span.set("url.path", Text(req.uri().path().to_owned()));
            span.set("client.address", Text(client.peer_addr.to_string()));
            span.set("vtp.listener", Text(self.metrics.name().to_owned()));
            let version = if req.version() == http::Version::HTTP_2 {
                "2"
            } else {
                "1.1"
            };
            span.set("network.protocol.version", Text(version.to_owned()));
            span.set("tls.protocol.version", Text(client.tls.version.to_owned()));
            span.set("tls.resumed", Bool(client.tls.resumed));
            span.set("vtp.tls.provider", Text(client.tls.provider.to_owned()));
            span.set(
                "vtp.tls.algorithm",
                Text(self.metrics.algorithm().to_owned()),
            );
            if is_grpc(req.headers()) {
                span.set("rpc.system", Text("grpc".to_owned()));
                if let Some((service, call)) =
                    req.uri().path().trim_start_matches('/').split_once('/')
                {
                    span.set("rpc.service", Text(service.to_owned()));
                    span.set("rpc.method", Text(call.to_owned()));
                }
            } else if let Some(route) = label.filter(|l| &**l != crate::metrics::METHOD_OTHER) {
                span.set("http.route", Text(route.to_string()));
            }
        }
        Some(trace)
    }
}
