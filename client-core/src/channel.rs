//! The member's channel to the control plane, which follows certificate
//! renewal. One [`Membership`] per process holds the current identity and
//! an mTLS channel built from it; each task calls through a
//! [`MemberChannel`], which picks the membership's channel for every call.
//! A renewal replaces the channel, so the next call of every task makes a
//! new connection with the new certificate; calls and streams already
//! open finish on the old one (the control plane lets it drain).
//!
//! With several control-plane endpoints (`crate::endpoints`) there is one
//! lazy channel per endpoint, and calls go to the active one; a call whose
//! connection fails moves every later call on to the next endpoint, so a
//! replica that dies costs each task one failed call, which its own retry
//! already handles.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::Channel;

use crate::identity::{Identity, IdentityStore};
use crate::tls::mtls_endpoint;

#[derive(Clone)]
struct Current {
    identity: Identity,
    /// One per endpoint, in the configured order.
    channels: Arc<[Channel]>,
    /// Which endpoint calls go to; kept across renewals.
    active: Arc<AtomicUsize>,
}

impl Current {
    fn pick(&self) -> Picked {
        let i = self.active.load(Ordering::Relaxed) % self.channels.len().max(1);
        Picked {
            channel: self.channels[i].clone(),
            index: i,
            count: self.channels.len(),
            active: self.active.clone(),
        }
    }
}

/// The channel a call goes through, and how to move on if it fails.
struct Picked {
    channel: Channel,
    index: usize,
    count: usize,
    active: Arc<AtomicUsize>,
}

impl Picked {
    /// Moves later calls to the next endpoint, unless another failed
    /// call already has.
    fn failed(&self) {
        if self.count > 1 {
            let next = (self.index + 1) % self.count;
            if self
                .active
                .compare_exchange(self.index, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                tracing::warn!(
                    endpoint = next,
                    "control-plane endpoint failed; moving to the next"
                );
            }
        }
    }
}

/// The enrolled identity of this process and its channel; empty until
/// enrollment. Cloning shares it.
#[derive(Clone)]
pub struct Membership {
    urls: Arc<[String]>,
    store: IdentityStore,
    current: Arc<watch::Sender<Option<Current>>>,
}

impl Membership {
    /// Not enrolled yet: [`Membership::channel`] waits for
    /// [`Membership::set_identity`].
    pub fn new(url: &str, data_dir: &Path) -> Membership {
        // A list the config refused never gets here; a bad one fails when
        // set_identity builds its channels.
        let urls = crate::endpoints::parse(url).unwrap_or_else(|_| vec![url.to_string()]);
        Membership {
            urls: urls.into(),
            store: IdentityStore::new(data_dir),
            current: Arc::new(watch::Sender::new(None)),
        }
    }

    /// Already enrolled (tests and tools that hold an identity).
    pub fn with_identity(
        url: &str,
        data_dir: &Path,
        identity: Identity,
    ) -> Result<Membership, tonic::transport::Error> {
        let m = Membership::new(url, data_dir);
        m.set_identity(identity)?;
        Ok(m)
    }

    pub fn store(&self) -> &IdentityStore {
        &self.store
    }

    /// Makes `identity` current: later calls connect with it.
    pub fn set_identity(&self, identity: Identity) -> Result<(), tonic::transport::Error> {
        crate::install_crypto_provider();
        let channels = self
            .urls
            .iter()
            .map(|u| Ok(mtls_endpoint(u, &identity)?.connect_lazy()))
            .collect::<Result<Vec<_>, tonic::transport::Error>>()?;
        let active = self
            .current
            .borrow()
            .as_ref()
            .map_or_else(Arc::default, |c| c.active.clone());
        self.current.send_replace(Some(Current {
            identity,
            channels: channels.into(),
            active,
        }));
        Ok(())
    }

    /// The current identity, once enrolled.
    pub fn identity(&self) -> Option<Identity> {
        self.current.borrow().as_ref().map(|c| c.identity.clone())
    }

    /// A channel that follows renewals, once enrolled; `None` if
    /// `shutdown` comes first.
    pub async fn channel(&self, shutdown: &CancellationToken) -> Option<MemberChannel> {
        let mut rx = self.current.subscribe();
        let fallback = tokio::select! {
            current = rx.wait_for(|c| c.is_some()) => current.ok()?.as_ref()?.clone(),
            _ = shutdown.cancelled() => return None,
        };
        Some(MemberChannel {
            rx,
            fallback,
            ready: None,
        })
    }

    /// The channel now, if enrolled.
    pub fn channel_now(&self) -> Option<MemberChannel> {
        let rx = self.current.subscribe();
        let fallback = rx.borrow().as_ref()?.clone();
        Some(MemberChannel {
            rx,
            fallback,
            ready: None,
        })
    }
}

/// A gRPC channel that calls through the membership's current channel.
/// Generated clients take it in place of a [`Channel`].
pub struct MemberChannel {
    rx: watch::Receiver<Option<Current>>,
    /// The channels when this handle was made; the membership never goes
    /// back to empty, so this is only for the type's sake.
    fallback: Current,
    /// The channel `poll_ready` readied, which `call` must use.
    ready: Option<Picked>,
}

impl Clone for MemberChannel {
    fn clone(&self) -> Self {
        // A clone has readied nothing.
        MemberChannel {
            rx: self.rx.clone(),
            fallback: self.fallback.clone(),
            ready: None,
        }
    }
}

fn pick(rx: &watch::Receiver<Option<Current>>, fallback: &Current) -> Picked {
    rx.borrow().as_ref().unwrap_or(fallback).pick()
}

impl tower::Service<http::Request<Body>> for MemberChannel {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let (rx, fallback) = (&self.rx, &self.fallback);
        let picked = self.ready.get_or_insert_with(|| pick(rx, fallback));
        let r = tower::Service::poll_ready(&mut picked.channel, cx);
        if let Poll::Ready(Err(_)) = &r {
            picked.failed();
            self.ready = None;
        }
        r
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // poll_ready came first (tower's contract), so `ready` is set.
        let mut picked = self
            .ready
            .take()
            .unwrap_or_else(|| pick(&self.rx, &self.fallback));
        let response = tower::Service::call(&mut picked.channel, request);
        Box::pin(async move {
            let r = response.await;
            if r.is_err() {
                // The connection failed (refused, reset, timed out): the
                // server never answered this call.
                picked.failed();
            }
            r
        })
    }
}
