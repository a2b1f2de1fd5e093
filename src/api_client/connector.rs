//! Connections to the API server that write only while their [`WriteGate`] is open.
//!
//! The check sits under TLS, at the socket: a request written after the gate closed fails with
//! an I/O error before any of its bytes leave the process, however long it waited in a queue,
//! for a connection, or in a paused process.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use tower::Service;

use super::gate::WriteGate;

/// Wraps a connector; every stream it makes is checked against `gate`.
#[derive(Clone, Debug)]
pub struct GatedConnector<C> {
    inner: C,
    gate: WriteGate,
}

impl<C> GatedConnector<C> {
    pub fn new(inner: C, gate: WriteGate) -> Self {
        Self { inner, gate }
    }
}

/// The error of a write the gate refused.
#[derive(Debug, thiserror::Error)]
#[error("not writing to the API server: this replica does not lead (its write gate is closed)")]
pub struct GateClosed;

impl<C> Service<Uri> for GatedConnector<C>
where
    C: Service<Uri>,
    C::Future: Send + 'static,
    C::Response: 'static,
{
    type Response = GatedStream<C::Response>;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let gate = self.gate.clone();
        Box::pin(async move {
            let inner = connecting.await?;
            Ok(GatedStream { inner, gate })
        })
    }
}

/// A stream whose writes go through only while the gate is open.
#[derive(Debug)]
pub struct GatedStream<S> {
    inner: S,
    gate: WriteGate,
}

impl<S> GatedStream<S> {
    fn check(&self) -> io::Result<()> {
        if self.gate.is_open() {
            Ok(())
        } else {
            Err(io::Error::new(io::ErrorKind::PermissionDenied, GateClosed))
        }
    }
}

impl<S: Read + Unpin> Read for GatedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: Write + Unpin> Write for GatedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check()?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check()?;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: Connection> Connection for GatedStream<S> {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}
