//! Loopback ports for the processes a benchmark starts.

use std::net::TcpListener;

/// A loopback port free when asked (the OS's choice; the listener is closed at once).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
