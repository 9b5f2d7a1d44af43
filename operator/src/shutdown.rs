//! Signals: the first SIGTERM or SIGINT starts an orderly, bounded shutdown; a second one ends
//! the process at once.
//!
//! The orderly shutdown (see `main.rs`): the controllers take no new work, reconciles already
//! running get [`crate::controller::run::DEFAULT_DRAIN_TIMEOUT`], the Lease is released if the API
//! server answers within [`RELEASE_TIMEOUT`], and the process exits 0. A watchdog thread ends
//! the process with status 1 should that ever take longer than [`HARD_DEADLINE`].

use std::future::Future;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// How long releasing the Lease may take on shutdown.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest an orderly shutdown may take before the watchdog ends the process.
pub const HARD_DEADLINE: Duration = Duration::from_secs(8);

/// Errors installing the signal handlers.
#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    /// The handler could not be registered.
    #[error("installing the {signal} handler: {source}")]
    Install {
        /// Signal name.
        signal: &'static str,
        /// Cause.
        source: std::io::Error,
    },
}

/// Resolves once the first signal arrived (clone it freely).
#[derive(Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
    fut: Shared<BoxFuture<'static, ()>>,
}

impl Shutdown {
    /// A future that resolves on the first signal; `Clone + Send + Sync`, as kube's
    /// `graceful_shutdown_on` wants.
    pub fn signalled(&self) -> impl Future<Output = ()> + Send + Sync + Clone + 'static {
        self.fut.clone()
    }

    /// Whether the first signal has arrived.
    pub fn requested(&self) -> bool {
        *self.rx.borrow()
    }
}

/// Install the SIGTERM and SIGINT handlers (call inside the runtime).
pub fn install() -> Result<Shutdown, ShutdownError> {
    let mut term = signal(SignalKind::terminate()).map_err(|source| ShutdownError::Install {
        signal: "SIGTERM",
        source,
    })?;
    let mut int = signal(SignalKind::interrupt()).map_err(|source| ShutdownError::Install {
        signal: "SIGINT",
        source,
    })?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut seen = 0u32;
        loop {
            let signo = tokio::select! {
                _ = term.recv() => libc::SIGTERM,
                _ = int.recv() => libc::SIGINT,
            };
            seen += 1;
            if seen == 1 {
                tracing::info!("signal {signo}: shutting down (a second signal exits at once)");
                let _ = tx.send(true);
                std::thread::Builder::new()
                    .name("shutdown-watchdog".into())
                    .spawn(|| {
                        std::thread::sleep(HARD_DEADLINE);
                        eprintln!(
                            "virt-operator: shutdown did not finish within {} s; exiting",
                            HARD_DEADLINE.as_secs()
                        );
                        std::process::exit(1);
                    })
                    .ok();
            } else {
                eprintln!("virt-operator: second signal {signo}; exiting now");
                std::process::exit(128 + signo);
            }
        }
    });
    let mut wait_rx = rx.clone();
    let fut = async move {
        let _ = wait_rx.wait_for(|v| *v).await;
    }
    .boxed()
    .shared();
    Ok(Shutdown { rx, fut })
}
