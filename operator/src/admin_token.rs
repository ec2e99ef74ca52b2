//! The admin token engines and routers accept: 32 random bytes in lower-case hex, made by
//! the operator (a Secret in a cluster, the runtime's config on this machine).
//!
//! Invariant: a token comes from the operating system's random source or not at all.

/// A fresh admin token.
pub fn random_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex(&bytes))
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
