//! Collection set-up and the stored-point count, over the same protocol and connection path
//! as the workload (so a gRPC-only target needs no REST port): create when missing,
//! recreate on request, and an exact count that proves what was stored.

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use prost::Message;
use qdrant_client::qdrant as pb;

use super::{Conn, Connector, Protocol};

/// A control-plane session on one connection.
pub struct Admin<'a> {
    connector: &'a Connector,
    conn: Conn,
}

impl<'a> Admin<'a> {
    /// Opens a connection to the target for control-plane calls.
    pub async fn connect(connector: &'a Connector) -> Result<Self> {
        let opened = connector
            .open()
            .await
            .map_err(|f| anyhow!("{} ({})", f.message, f.kind))?;
        Ok(Self {
            connector,
            conn: opened.conn,
        })
    }

    /// Makes sure `collection` exists with `dim`-dimensional cosine vectors; drops it first
    /// when `recreate`. Returns whether it was created.
    pub async fn ensure_collection(
        &mut self,
        collection: &str,
        dim: usize,
        recreate: bool,
    ) -> Result<bool> {
        let exists = self.exists(collection).await?;
        if exists && !recreate {
            return Ok(false);
        }
        if exists {
            self.delete(collection).await?;
        }
        if let Err(e) = self.create(collection, dim).await {
            // Several loadgen processes started together (--start-at) all find it missing;
            // one creates it, and for the others it exists now.
            if !recreate && self.exists(collection).await.unwrap_or(false) {
                return Ok(false);
            }
            return Err(e);
        }
        Ok(true)
    }

    async fn exists(&mut self, collection: &str) -> Result<bool> {
        match self.connector.protocol {
            Protocol::Rest => {
                let (status, _) = self
                    .rest(Method::GET, &format!("/collections/{collection}"), None)
                    .await?;
                Ok(status == 200)
            }
            Protocol::Grpc => {
                let req = pb::GetCollectionInfoRequest {
                    collection_name: collection.to_owned(),
                };
                match self
                    .grpc("/qdrant.Collections/Get", req.encode_to_vec())
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(GrpcError::Status(5, _)) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    async fn delete(&mut self, collection: &str) -> Result<()> {
        match self.connector.protocol {
            Protocol::Rest => {
                let (status, body) = self
                    .rest(Method::DELETE, &format!("/collections/{collection}"), None)
                    .await?;
                if status != 200 {
                    bail!("deleting collection {collection}: HTTP {status}: {body}");
                }
            }
            Protocol::Grpc => {
                let req = pb::DeleteCollection {
                    collection_name: collection.to_owned(),
                    ..Default::default()
                };
                self.grpc("/qdrant.Collections/Delete", req.encode_to_vec())
                    .await?;
            }
        }
        Ok(())
    }

    async fn create(&mut self, collection: &str, dim: usize) -> Result<()> {
        match self.connector.protocol {
            Protocol::Rest => {
                let body = serde_json::json!({"vectors": {"size": dim, "distance": "Cosine"}});
                let (status, text) = self
                    .rest(
                        Method::PUT,
                        &format!("/collections/{collection}"),
                        Some(body.to_string()),
                    )
                    .await?;
                if status != 200 {
                    bail!("creating collection {collection}: HTTP {status}: {text}");
                }
            }
            Protocol::Grpc => {
                let req = pb::CreateCollection {
                    collection_name: collection.to_owned(),
                    vectors_config: Some(pb::VectorsConfig {
                        config: Some(pb::vectors_config::Config::Params(pb::VectorParams {
                            size: dim as u64,
                            distance: pb::Distance::Cosine as i32,
                            ..Default::default()
                        })),
                    }),
                    ..Default::default()
                };
                self.grpc("/qdrant.Collections/Create", req.encode_to_vec())
                    .await?;
            }
        }
        Ok(())
    }

    /// The exact number of points in `collection`.
    pub async fn count(&mut self, collection: &str) -> Result<u64> {
        match self.connector.protocol {
            Protocol::Rest => {
                let (status, text) = self
                    .rest(
                        Method::POST,
                        &format!("/collections/{collection}/points/count"),
                        Some(r#"{"exact":true}"#.to_owned()),
                    )
                    .await?;
                if status != 200 {
                    bail!("counting points in {collection}: HTTP {status}: {text}");
                }
                let v: serde_json::Value = serde_json::from_str(&text).context("count answer")?;
                v["result"]["count"]
                    .as_u64()
                    .ok_or_else(|| anyhow!("count answer without result.count: {text}"))
            }
            Protocol::Grpc => {
                let req = pb::CountPoints {
                    collection_name: collection.to_owned(),
                    exact: Some(true),
                    ..Default::default()
                };
                let body = self
                    .grpc("/qdrant.Points/Count", req.encode_to_vec())
                    .await?;
                let resp = pb::CountResponse::decode(body.as_ref()).context("CountResponse")?;
                Ok(resp.result.map(|r| r.count).unwrap_or(0))
            }
        }
    }

    async fn rest(
        &mut self,
        method: Method,
        path: &str,
        body: Option<String>,
    ) -> Result<(u16, String)> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, self.connector.authority().as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        req.headers_mut()
            .extend(self.connector.extra_headers.clone());
        let Conn::H1 { sender, .. } = &mut self.conn else {
            bail!("REST call on an HTTP/2 connection");
        };
        sender.ready().await?;
        let resp = sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    async fn grpc(&mut self, path: &str, message: Vec<u8>) -> Result<Bytes, GrpcError> {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(format!(
                "{}://{}{path}",
                if self.connector.target.tls {
                    "https"
                } else {
                    "http"
                },
                self.connector.authority()
            ))
            .version(http::Version::HTTP_2)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(Full::new(Bytes::from(super::grpc_frame(&message))))
            .map_err(|e| GrpcError::Other(e.into()))?;
        req.headers_mut()
            .extend(self.connector.extra_headers.clone());
        let Conn::H2 { sender, .. } = &mut self.conn else {
            return Err(GrpcError::Other(anyhow!(
                "gRPC call on an HTTP/1.1 connection"
            )));
        };
        let other = |e: hyper::Error| GrpcError::Other(e.into());
        sender.ready().await.map_err(other)?;
        let resp = sender.send_request(req).await.map_err(other)?;
        let (parts, body) = resp.into_parts();
        if parts.status != 200 {
            return Err(GrpcError::Other(anyhow!("{path}: HTTP {}", parts.status)));
        }
        let collected = body.collect().await.map_err(other)?;
        let trailers = collected
            .trailers()
            .cloned()
            .unwrap_or_else(|| parts.headers.clone());
        let data = collected.to_bytes();
        let (code, msg) = super::grpc_status(&trailers)
            .ok_or_else(|| GrpcError::Other(anyhow!("{path}: answer without grpc-status")))?;
        if code != 0 {
            return Err(GrpcError::Status(
                code,
                format!("{path}: grpc-status {code}: {msg}"),
            ));
        }
        if data.len() < 5 {
            return Err(GrpcError::Other(anyhow!("{path}: empty gRPC answer")));
        }
        Ok(data.slice(5..))
    }
}

#[derive(Debug, thiserror::Error)]
enum GrpcError {
    #[error("{1}")]
    Status(u32, String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}
