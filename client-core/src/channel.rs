//! The member's channel to the control plane, which follows certificate
//! renewal. One [`Membership`] per process holds the current identity and
//! an mTLS channel built from it; each task calls through a
//! [`MemberChannel`], which picks the membership's channel for every call.
//! A renewal replaces the channel, so the next call of every task makes a
//! new connection with the new certificate; calls and streams already
//! open finish on the old one (the control plane lets it drain).

use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::transport::channel::ResponseFuture;
use tonic::transport::Channel;

use crate::identity::{Identity, IdentityStore};
use crate::tls::mtls_endpoint;

#[derive(Clone)]
struct Current {
    identity: Identity,
    channel: Channel,
}

/// The enrolled identity of this process and its channel; empty until
/// enrollment. Cloning shares it.
#[derive(Clone)]
pub struct Membership {
    url: Arc<str>,
    store: IdentityStore,
    current: Arc<watch::Sender<Option<Current>>>,
}

impl Membership {
    /// Not enrolled yet: [`Membership::channel`] waits for
    /// [`Membership::set_identity`].
    pub fn new(url: &str, data_dir: &Path) -> Membership {
        Membership {
            url: url.into(),
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
        let channel = mtls_endpoint(&self.url, &identity)?.connect_lazy();
        self.current
            .send_replace(Some(Current { identity, channel }));
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
            current = rx.wait_for(|c| c.is_some()) => current.ok()?.as_ref()?.channel.clone(),
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
        let fallback = rx.borrow().as_ref()?.channel.clone();
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
    /// The channel when this handle was made; the membership never goes
    /// back to empty, so this is only for the type's sake.
    fallback: Channel,
    /// The channel `poll_ready` readied, which `call` must use.
    ready: Option<Channel>,
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

fn pick(rx: &watch::Receiver<Option<Current>>, fallback: &Channel) -> Channel {
    rx.borrow()
        .as_ref()
        .map_or_else(|| fallback.clone(), |c| c.channel.clone())
}

impl tower::Service<http::Request<Body>> for MemberChannel {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let (rx, fallback) = (&self.rx, &self.fallback);
        tower::Service::poll_ready(self.ready.get_or_insert_with(|| pick(rx, fallback)), cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // poll_ready came first (tower's contract), so `ready` is set.
        let mut channel = self
            .ready
            .take()
            .unwrap_or_else(|| pick(&self.rx, &self.fallback));
        tower::Service::call(&mut channel, request)
    }
}
