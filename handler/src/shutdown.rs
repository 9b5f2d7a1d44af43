//! Signal-driven shutdown shared by every task of the process.
//!
//! The first SIGTERM or SIGINT flips a [`Shutdown`] that all loops select on: they stop taking
//! work and return, and `main` waits for them at most a bounded time. A second signal exits the
//! process at once (status 130) without waiting for anything.

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// Exit status after a second signal.
pub const FORCED_EXIT: i32 = 130;

/// A cloneable "stop now" flag.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// The sending half: [`Trigger::fire`] asks every [`Shutdown`] holder to stop.
#[derive(Clone, Debug)]
pub struct Trigger {
    tx: std::sync::Arc<watch::Sender<bool>>,
}

/// A new trigger and its flag.
pub fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (Trigger { tx: tx.into() }, Shutdown { rx })
}

impl Trigger {
    /// Asks every holder of the flag to stop (idempotent).
    pub fn fire(&self) {
        self.tx.send_replace(true);
    }

    /// A flag bound to this trigger.
    pub fn subscribe(&self) -> Shutdown {
        Shutdown {
            rx: self.tx.subscribe(),
        }
    }
}

impl Shutdown {
    /// Whether the stop was asked for.
    pub fn is_set(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once the stop is asked for (or the trigger is gone).
    pub async fn wait(&self) {
        let mut rx = self.rx.clone();
        let _ = rx.wait_for(|v| *v).await;
    }
}

/// Installs the SIGTERM/SIGINT handling: the first signal fires `trigger`, the second exits
/// the process with [`FORCED_EXIT`].
pub fn on_signals(trigger: Trigger) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let mut seen = 0u32;
        loop {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            seen += 1;
            if seen == 1 {
                tracing::info!("{name}: shutting down (a second signal exits at once)");
                trigger.fire();
            } else {
                tracing::warn!("{name} again: exiting now");
                std::process::exit(FORCED_EXIT);
            }
        }
    });
    Ok(())
}
