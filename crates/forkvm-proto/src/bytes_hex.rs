//! Serde helper that carries `Vec<u8>` as a lowercase hex string, so binary fields in
//! JSON messages (identity entropy) stay compact and readable instead of number arrays.

use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

/// Serializes bytes as lowercase hex.
pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
    }
    s.serialize_str(&out)
}

/// Parses a hex string (either case) back into bytes.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(d)?;
    if text.len() % 2 != 0 {
        return Err(D::Error::custom("hex string has an odd length"));
    }
    text.as_bytes()
        .chunks(2)
        .map(|pair| {
            let hi = (pair[0] as char).to_digit(16);
            let lo = (pair[1] as char).to_digit(16);
            match (hi, lo) {
                (Some(hi), Some(lo)) => Ok((hi * 16 + lo) as u8),
                _ => Err(D::Error::custom("hex string has a non-hex character")),
            }
        })
        .collect()
}
