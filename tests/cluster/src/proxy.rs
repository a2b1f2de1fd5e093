//! A TCP proxy on loopback that can be paused: while paused it forwards no byte in either
//! direction and keeps every connection open, as a stalled network path or a hung API server
//! looks to a client. It still takes what the client sends (and notes when), holding it. Tests
//! put it between a client and the API server (TLS passes through: the serving certificate is
//! for 127.0.0.1, whatever the port). [`cut`](PausableProxy::cut) then drops the stalled
//! connections with what they held, as a network path that resets them does.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime};

use crate::{Error, io_error};

/// How often a waiting thread looks at the pause and stop flags.
const TICK: Duration = Duration::from_millis(20);

#[derive(Default)]
struct Flags {
    paused: AtomicBool,
    stopped: AtomicBool,
    /// Raised by `cut`: connections of an older generation end, dropping what they hold.
    generation: std::sync::atomic::AtomicU64,
    /// When a byte last arrived from a client (held or forwarded).
    last_from_client: Mutex<Option<SystemTime>>,
    /// Per connection, in accept order: when it opened and when its client last sent a byte.
    connections: Mutex<Vec<ConnectionTimes>>,
    /// Both ends of every connection, to cut them on stop.
    sockets: Mutex<Vec<TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// When a proxied connection opened and when its client last sent a byte (wall clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionTimes {
    pub opened: SystemTime,
    pub last_from_client: Option<SystemTime>,
}

/// Forwards `127.0.0.1:PORT` to a target; stopped (every connection closed) when dropped.
pub struct PausableProxy {
    address: SocketAddr,
    flags: Arc<Flags>,
    acceptor: Option<JoinHandle<()>>,
}

impl PausableProxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub fn start(target: SocketAddr) -> Result<PausableProxy, Error> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| io_error("proxy: bind", e))?;
        let address = listener
            .local_addr()
            .map_err(|e| io_error("proxy: local address", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io_error("proxy: non-blocking listener", e))?;
        let flags = Arc::new(Flags::default());
        let acceptor = {
            let flags = Arc::clone(&flags);
            thread::Builder::new()
                .name("proxy-accept".into())
                .spawn(move || accept(listener, target, &flags))
                .map_err(|e| io_error("proxy: starting a thread", e))?
        };
        Ok(PausableProxy {
            address,
            flags,
            acceptor: Some(acceptor),
        })
    }

    /// `127.0.0.1:PORT`
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops forwarding; connections stay open and bytes in flight are held.
    pub fn pause(&self) {
        self.flags.paused.store(true, Ordering::SeqCst);
    }

    /// Forwards again, held bytes first.
    pub fn resume(&self) {
        self.flags.paused.store(false, Ordering::SeqCst);
    }

    pub fn is_paused(&self) -> bool {
        self.flags.paused.load(Ordering::SeqCst)
    }

    /// Closes every open connection at once, dropping the bytes they hold; new connections
    /// work as before (forwarded unless paused).
    pub fn cut(&self) {
        self.flags.generation.fetch_add(1, Ordering::SeqCst);
        for socket in lock(&self.flags.sockets).drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    /// When a client last sent a byte through the proxy (paused or not), on the wall clock.
    pub fn last_byte_from_client(&self) -> Option<SystemTime> {
        *lock(&self.flags.last_from_client)
    }

    /// Every connection so far, in the order they opened: tells bytes sent on a connection
    /// that existed before some moment from those on connections opened after it.
    pub fn connections(&self) -> Vec<ConnectionTimes> {
        lock(&self.flags.connections).clone()
    }
}

impl Drop for PausableProxy {
    fn drop(&mut self) {
        self.flags.stopped.store(true, Ordering::SeqCst);
        for socket in lock(&self.flags.sockets).drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let threads: Vec<_> = lock(&self.flags.threads).drain(..).collect();
        for thread in threads {
            let _ = thread.join();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn accept(listener: TcpListener, target: SocketAddr, flags: &Arc<Flags>) {
    while !flags.stopped.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(TICK);
                continue;
            }
            Err(_) => continue,
        };
        let Ok(server) = TcpStream::connect(target) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        if client.set_nonblocking(false).is_err() {
            continue;
        }
        let connection = {
            let mut connections = lock(&flags.connections);
            connections.push(ConnectionTimes {
                opened: SystemTime::now(),
                last_from_client: None,
            });
            connections.len() - 1
        };
        let pumps = [
            (client.try_clone(), server.try_clone(), true),
            (server.try_clone(), client.try_clone(), false),
        ];
        {
            let mut sockets = lock(&flags.sockets);
            if let (Ok(a), Ok(b)) = (client.try_clone(), server.try_clone()) {
                sockets.push(a);
                sockets.push(b);
            }
        }
        for (from, to, from_client) in pumps {
            let (Ok(from), Ok(to)) = (from, to) else {
                continue;
            };
            let pump_flags = Arc::clone(flags);
            if let Ok(thread) = thread::Builder::new()
                .name("proxy-pump".into())
                .spawn(move || pump(from, to, &pump_flags, from_client.then_some(connection)))
            {
                lock(&flags.threads).push(thread);
            }
        }
    }
}

/// Copies `from` to `to` until either closes, the proxy stops or the connection is cut; while
/// paused it keeps reading and holds what it read.
/// `client_connection` is the index of the connection when `from` is its client.
fn pump(mut from: TcpStream, mut to: TcpStream, flags: &Flags, client_connection: Option<usize>) {
    let _ = from.set_read_timeout(Some(TICK));
    let generation = flags.generation.load(Ordering::SeqCst);
    let ended = || {
        flags.stopped.load(Ordering::SeqCst)
            || flags.generation.load(Ordering::SeqCst) != generation
    };
    let paused = || flags.paused.load(Ordering::SeqCst);
    let mut buffer = vec![0u8; 64 * 1024];
    let mut held: Vec<u8> = Vec::new();
    let mut open = true;
    while !ended() {
        if !paused() && !held.is_empty() {
            if to.write_all(&held).is_err() {
                return;
            }
            held.clear();
        }
        if !open {
            if held.is_empty() {
                break;
            }
            thread::sleep(TICK);
            continue;
        }
        match from.read(&mut buffer) {
            Ok(0) => open = false,
            Ok(n) => {
                if let Some(index) = client_connection {
                    let now = SystemTime::now();
                    *lock(&flags.last_from_client) = Some(now);
                    if let Some(times) = lock(&flags.connections).get_mut(index) {
                        times.last_from_client = Some(now);
                    }
                }
                held.extend_from_slice(&buffer[..n]);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    if !ended() {
        let _ = to.shutdown(Shutdown::Write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback for one connection.
    fn echo() -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        let thread = thread::spawn(move || {
            if let Ok((mut socket, _)) = listener.accept() {
                let mut buffer = [0u8; 1024];
                while let Ok(n) = socket.read(&mut buffer) {
                    if n == 0 || socket.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        (address, thread)
    }

    #[test]
    fn a_paused_proxy_holds_bytes_until_resumed() {
        let (target, server) = echo();
        let proxy = PausableProxy::start(target).expect("proxy");
        let mut client = TcpStream::connect(proxy.address()).expect("connect");
        client
            .set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        let mut answer = [0u8; 5];
        client.write_all(b"hello").expect("write");
        client
            .read_exact(&mut answer)
            .expect("echo through the proxy");
        assert_eq!(&answer, b"hello");

        proxy.pause();
        client.write_all(b"again").expect("write while paused");
        let stalled = client.read(&mut answer);
        assert!(stalled.is_err(), "no answer while paused: {stalled:?}");
        proxy.resume();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        client.read_exact(&mut answer).expect("held bytes arrive");
        assert_eq!(&answer, b"again");
        assert!(proxy.last_byte_from_client().is_some());
        let connections = proxy.connections();
        assert_eq!(connections.len(), 1);
        assert!(connections[0].last_from_client >= Some(connections[0].opened));

        // A cut drops what a paused connection holds and closes it.
        proxy.pause();
        client.write_all(b"never").expect("write while paused");
        proxy.cut();
        proxy.resume();
        let mut rest = Vec::new();
        let closed = client.read_to_end(&mut rest);
        assert!(
            rest.is_empty(),
            "nothing held arrives after a cut: {closed:?} {rest:?}"
        );
        drop(client);
        drop(proxy);
        server.join().expect("echo server ends");
    }
}
