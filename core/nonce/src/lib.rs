//! Unguessable hex: the remote protocol's boot and client ids and `terminal-bash`'s private
//! in-band markers, which the commands they frame must not be able to forge; and the one
//! constant-time comparison the daemons check their tokens with.
//!
//! The bytes come from the OS RNG. If that fails, the clock and the pid still keep values
//! distinct between sessions and processes (guessable then), so a caller always gets a value
//! rather than an error it could do nothing about.

/// `BYTES` random bytes as `2 * BYTES` lowercase hex digits.
pub fn random_hex<const BYTES: usize>() -> String {
    let mut b = [0u8; BYTES];
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let seed = (t ^ u128::from(std::process::id())).to_le_bytes();
        for (x, s) in b.iter_mut().zip(seed.iter().cycle()) {
            *x = *s;
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Constant-time comparison of two byte strings (length leaks, content does not): how a
/// front end checks a presented token against its own.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_twice_as_many_hex_digits_as_bytes_and_never_the_same_twice() {
        let (a, b) = (random_hex::<8>(), random_hex::<8>());
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{a}");
        assert_ne!(a, b);
        assert_eq!(random_hex::<16>().len(), 32);
    }

    #[test]
    fn secrets_match_only_byte_for_byte() {
        assert!(same_secret(b"tok", b"tok"));
        assert!(!same_secret(b"tok", b"tol"));
        assert!(!same_secret(b"tok", b"to"));
        assert!(same_secret(b"", b""));
    }
}
