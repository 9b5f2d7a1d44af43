//! A tiny HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (process alive), `/readyz`
//! (see [`crate::health`]: standing by for leadership, or leading with caches filled).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::health::Health;
use crate::metrics::Metrics;

/// Errors of the HTTP endpoint. The messages name `--metrics-addr`, the flag that sets it.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Another process listens on the address.
    #[error("--metrics-addr {addr}: address already in use; stop the other process or choose another address with --metrics-addr")]
    InUse {
        /// Address.
        addr: SocketAddr,
    },
    /// Binding the listen address failed otherwise.
    #[error("--metrics-addr {addr}: cannot listen there: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
}

impl HttpError {
    fn bind(addr: SocketAddr, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::AddrInUse {
            Self::InUse { addr }
        } else {
            Self::Bind { addr, source }
        }
    }
}

/// The response for a request line's path: (status line, content type, body).
pub fn respond(
    path: &str,
    metrics: &Metrics,
    health: &Health,
) -> (&'static str, &'static str, String) {
    let path = path.split('?').next().unwrap_or("");
    match path {
        "/metrics" => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" | "/livez" => ("200 OK", "text/plain", "ok\n".into()),
        "/readyz" => match health.readiness() {
            Ok(why) => ("200 OK", "text/plain", format!("ok: {why}\n")),
            Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
        },
        _ => ("404 Not Found", "text/plain", "not found\n".into()),
    }
}

async fn serve_one(mut sock: TcpStream, metrics: Arc<Metrics>, health: Arc<Health>) {
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    // Read until the end of the request head or the buffer is full.
    while n < buf.len() {
        match sock.read(&mut buf[n..]).await {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                n += k;
                if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
        }
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = if method == "GET" || method == "HEAD" {
        respond(path, &metrics, &health)
    } else {
        ("405 Method Not Allowed", "text/plain", "GET only\n".into())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = sock.write_all(head.as_bytes()).await;
    if method != "HEAD" {
        let _ = sock.write_all(body.as_bytes()).await;
    }
    let _ = sock.shutdown().await;
}

/// Bind `addr`; returns the bound address and a future serving forever.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> Result<(SocketAddr, impl std::future::Future<Output = ()>), HttpError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| HttpError::bind(addr, e))?;
    let local = listener
        .local_addr()
        .map_err(|e| HttpError::bind(addr, e))?;
    let fut = async move {
        loop {
            match listener.accept().await {
                Ok((sock, _)) => {
                    tokio::spawn(serve_one(sock, metrics.clone(), health.clone()));
                }
                Err(e) => tracing::warn!("accept: {e}"),
            }
        }
    };
    Ok((local, fut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        use crate::health::Role;
        let m = Metrics::new();
        let h = Health::new();
        assert_eq!(respond("/healthz", &m, &h).0, "200 OK");
        assert_eq!(respond("/readyz", &m, &h).0, "503 Service Unavailable");
        h.set_role(Role::Standby);
        assert_eq!(respond("/readyz", &m, &h).0, "200 OK");
        assert_eq!(respond("/nope", &m, &h).0, "404 Not Found");
        let (s, _, body) = respond("/metrics", &m, &h);
        assert_eq!(s, "200 OK");
        assert!(body.ends_with("# EOF\n"), "{body}");
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_over_tcp() {
        let metrics = Arc::new(Metrics::new());
        metrics.reconciled("vm", std::time::Duration::from_millis(1), None);
        let health = Arc::new(Health::new());
        let (addr, fut) = serve("127.0.0.1:0".parse().unwrap(), metrics, health.clone())
            .await
            .unwrap();
        let server = tokio::spawn(fut);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        health.set_role(crate::health::Role::Leading);
        health
            .caches_filled()
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        // The same address again: one clear error naming the flag.
        let e = serve(addr, Arc::new(Metrics::new()), health)
            .await
            .err()
            .unwrap()
            .to_string();
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.contains("address already in use") && e.contains("--metrics-addr"),
            "{e}"
        );
        let m = get(addr, "/metrics").await;
        assert!(
            m.contains("microvirt_operator_reconciles_total{controller=\"vm\"} 1"),
            "{m}"
        );
        server.abort();
    }
}
