//! IP address ranges: CIDR parsing, and which addresses the server may connect out to.
//!
//! Used by the configuration (trusted proxies, outbound allow and deny lists), client-IP
//! extraction and the outbound HTTP client. Nothing here does I/O.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

/// An IP range such as `10.0.0.0/8` or `::1/128`; a bare address is a single-address range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// The range `network/prefix`; bits of `network` beyond the prefix are ignored.
    pub const fn new(network: IpAddr, prefix: u8) -> Self {
        Cidr { network, prefix }
    }

    /// Whether `ip` is inside the range (an IPv4-mapped IPv6 address counts as its IPv4 form).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("'{s}' is not an IP address or CIDR range"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("'{s}' has an invalid prefix length"))?,
        };
        Ok(Cidr { network, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// Parses a comma- or whitespace-separated list of CIDR ranges.
pub fn parse_cidr_list(s: &str) -> Result<Vec<Cidr>, String> {
    s.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|part| !part.is_empty())
        .map(str::parse)
        .collect()
}

/// The IPv4 form of an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`); other addresses as they are.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Cidr {
    Cidr::new(IpAddr::V4(Ipv4Addr::new(a, b, c, d)), prefix)
}

const fn v6(segments: [u16; 8], prefix: u8) -> Cidr {
    let [a, b, c, d, e, f, g, h] = segments;
    Cidr::new(IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)), prefix)
}

/// Ranges the server never connects out to unless allowed: anything that is not the public
/// internet (Synapse's `ip_range_blacklist` defaults, plus documentation ranges).
const NON_PUBLIC: &[Cidr] = &[
    v4(0, 0, 0, 0, 8),                         // "this network", unspecified
    v4(10, 0, 0, 0, 8),                        // RFC 1918
    v4(100, 64, 0, 0, 10),                     // CGNAT
    v4(127, 0, 0, 0, 8),                       // loopback
    v4(169, 254, 0, 0, 16),                    // link-local (cloud metadata)
    v4(172, 16, 0, 0, 12),                     // RFC 1918
    v4(192, 0, 0, 0, 24),                      // IETF protocol assignments
    v4(192, 0, 2, 0, 24),                      // TEST-NET-1
    v4(192, 88, 99, 0, 24),                    // 6to4 relay anycast
    v4(192, 168, 0, 0, 16),                    // RFC 1918
    v4(198, 18, 0, 0, 15),                     // benchmarking
    v4(198, 51, 100, 0, 24),                   // TEST-NET-2
    v4(203, 0, 113, 0, 24),                    // TEST-NET-3
    v4(224, 0, 0, 0, 4),                       // multicast
    v4(240, 0, 0, 0, 4),                       // reserved, broadcast
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128),         // unspecified
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128),         // loopback
    v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96),  // NAT64 (embeds any IPv4 address)
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64),      // discard
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), // documentation
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16),     // 6to4 (embeds any IPv4 address)
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),      // unique local
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),     // link-local
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),     // site-local (deprecated)
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),      // multicast
];

/// Which addresses outbound connections may reach: public addresses, plus `allow`, minus `deny`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// Ranges reachable even though they are not public (e.g. `127.0.0.1/32` in tests).
    pub allow: Vec<Cidr>,
    /// Ranges refused in addition to the non-public ones.
    pub deny: Vec<Cidr>,
}

impl AddressPolicy {
    /// Whether the server may connect to `ip`. The deny list wins over the allow list.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        if self.deny.iter().any(|r| r.contains(ip)) {
            return false;
        }
        self.allow.iter().any(|r| r.contains(ip)) || !NON_PUBLIC.iter().any(|r| r.contains(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_contains_its_addresses_only() {
        let range: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(range.contains(ip("10.1.255.3")));
        assert!(!range.contains(ip("10.2.0.1")));
        assert!(range.contains(ip("::ffff:10.1.0.1")));
        let single: Cidr = "::1".parse().unwrap();
        assert!(single.contains(ip("::1")) && !single.contains(ip("::2")));
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains(ip("8.8.8.8")));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("example.org".parse::<Cidr>().is_err());
    }

    #[test]
    fn default_policy_refuses_everything_but_the_public_internet() {
        let policy = AddressPolicy::default();
        for blocked in [
            "127.0.0.1",
            "10.0.0.1",
            "172.20.1.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.1.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "192.0.2.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::7f00:1",
            "2001:db8::1",
        ] {
            assert!(!policy.permits(ip(blocked)), "{blocked} should be refused");
        }
        for public in ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(policy.permits(ip(public)), "{public} should be allowed");
        }
    }

    #[test]
    fn allow_overrides_the_block_list_and_deny_wins() {
        let policy = AddressPolicy {
            allow: parse_cidr_list("127.0.0.1/32, 10.0.0.0/8").unwrap(),
            deny: parse_cidr_list("10.9.0.0/16 8.8.8.8").unwrap(),
        };
        assert!(policy.permits(ip("127.0.0.1")));
        assert!(!policy.permits(ip("127.0.0.2")));
        assert!(policy.permits(ip("10.1.1.1")));
        assert!(!policy.permits(ip("10.9.1.1")));
        assert!(!policy.permits(ip("8.8.8.8")));
    }
}
