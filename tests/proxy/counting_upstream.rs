//! An upstream that counts its connections: a raw HTTP/1.1 server that answers slowly (a
//! slow Qdrant) or reads nothing at all (a stalled one).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Default)]
pub struct UpstreamCounts {
    pub accepted: AtomicUsize,
    pub open: AtomicUsize,
    pub peak: AtomicUsize,
}

pub struct OpenGuard(Arc<UpstreamCounts>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A raw HTTP/1.1 upstream. `hold`: each request is answered that long after its head
/// arrived (a slow Qdrant); `None`: it never reads anything at all (a stalled one), with a
/// 4 KiB receive buffer so the kernel holds little for it.
pub struct CountingUpstream {
    pub addr: SocketAddr,
    pub counts: Arc<UpstreamCounts>,
    pub _stop: tokio::sync::oneshot::Sender<()>,
}

impl CountingUpstream {
    pub fn start(hold: Option<Duration>) -> Self {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        if hold.is_none() {
            socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        }
        socket
            .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .expect("bind");
        socket.listen(4096).expect("listen");
        socket.set_nonblocking(true).expect("nonblocking");
        let std_listener: std::net::TcpListener = socket.into();
        let addr = std_listener.local_addr().expect("addr");
        let counts = Arc::new(UpstreamCounts::default());
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let c = counts.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
                loop {
                    let (mut s, _) = tokio::select! {
                        r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
                        _ = &mut stop_rx => return,
                    };
                    c.accepted.fetch_add(1, Ordering::SeqCst);
                    let open = c.open.fetch_add(1, Ordering::SeqCst) + 1;
                    c.peak.fetch_max(open, Ordering::SeqCst);
                    let guard = OpenGuard(c.clone());
                    tokio::spawn(async move {
                        let _guard = guard;
                        let Some(hold) = hold else {
                            // Never read: wait for the proxy to give up on us.
                            let _ = s.readable().await;
                            let mut probe = [0u8; 1];
                            loop {
                                match s.peek(&mut probe).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                                }
                            }
                        };
                        let mut head = Vec::new();
                        let mut buf = [0u8; 4096];
                        loop {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                                break;
                            }
                        }
                        // Answer after `hold`, unless the proxy closes first (a cancelled
                        // request): a read of 0 bytes says so.
                        tokio::select! {
                            _ = tokio::time::sleep(hold) => {
                                // One request per connection, said so: the proxy pools nothing.
                                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}").await;
                                let _ = s.read(&mut buf).await;
                            }
                            _ = async { while let Ok(n) = s.read(&mut buf).await { if n == 0 { break } } } => {}
                        }
                    });
                }
            });
        });
        Self {
            addr,
            counts,
            _stop: stop_tx,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn accepted(&self) -> usize {
        self.counts.accepted.load(Ordering::SeqCst)
    }

    pub fn open(&self) -> usize {
        self.counts.open.load(Ordering::SeqCst)
    }

    pub fn peak(&self) -> usize {
        self.counts.peak.load(Ordering::SeqCst)
    }
}
