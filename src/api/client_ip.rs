//! The client's IP address, for rate limits and devices' `last_seen_ip`.
//!
//! The socket peer is the client unless it is a configured trusted proxy
//! (`MYELIN_TRUSTED_PROXIES`). Behind trusted proxies, the client is the right-most
//! `X-Forwarded-For` entry that is not itself a trusted proxy: every entry left of it was
//! written by someone we do not trust, so it may be forged. `Forwarded` is never read.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use actix_web::HttpRequest;

use crate::net::{canonical, Cidr};

/// The IP address the request came from (see the module doc for proxies).
pub fn client_ip(req: &HttpRequest, trusted_proxies: &[Cidr]) -> IpAddr {
    let peer = req
        .peer_addr()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| canonical(a.ip()));
    let trusted = |ip: IpAddr| trusted_proxies.iter().any(|r| r.contains(ip));
    if !trusted(peer) {
        return peer;
    }
    let hops: Vec<&str> = req
        .headers()
        .get_all("x-forwarded-for")
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let mut nearest = peer;
    for hop in hops.iter().rev() {
        // An entry we cannot read ends what we can believe: the last proxy is the client.
        let Some(ip) = parse_hop(hop) else {
            return nearest;
        };
        if !trusted(ip) {
            return ip;
        }
        nearest = ip;
    }
    nearest
}

/// One `X-Forwarded-For` entry: an address, optionally with a port (`1.2.3.4:80`, `[::1]:80`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>()
        .or_else(|_| hop.parse::<SocketAddr>().map(|a| a.ip()))
        .ok()
        .map(canonical)
}

#[cfg(test)]
mod tests {
    use actix_web::test::TestRequest;

    use super::*;
    use crate::net::parse_cidr_list;

    fn ip_of(peer: &str, forwarded: Option<&str>, trusted: &str) -> String {
        let mut req = TestRequest::default().peer_addr(peer.parse().unwrap());
        if let Some(xff) = forwarded {
            req = req.insert_header(("X-Forwarded-For", xff));
        }
        client_ip(&req.to_http_request(), &parse_cidr_list(trusted).unwrap()).to_string()
    }

    #[test]
    fn untrusted_peers_cannot_choose_their_address() {
        assert_eq!(
            ip_of("203.0.113.9:5000", Some("1.2.3.4"), ""),
            "203.0.113.9"
        );
        assert_eq!(
            ip_of("203.0.113.9:5000", Some("1.2.3.4"), "10.0.0.0/8"),
            "203.0.113.9"
        );
    }

    #[test]
    fn behind_trusted_proxies_the_rightmost_untrusted_hop_is_the_client() {
        let trusted = "10.0.0.0/8";
        assert_eq!(
            ip_of("10.0.0.2:1", Some("1.2.3.4, 5.6.7.8"), trusted),
            "5.6.7.8"
        );
        assert_eq!(
            ip_of("10.0.0.2:1", Some("1.2.3.4, 5.6.7.8, 10.0.0.7"), trusted),
            "5.6.7.8"
        );
        assert_eq!(ip_of("10.0.0.2:1", None, trusted), "10.0.0.2");
        assert_eq!(
            ip_of("10.0.0.2:1", Some("garbage, 10.0.0.3"), trusted),
            "10.0.0.3"
        );
        assert_eq!(
            ip_of("10.0.0.2:1", Some("[2001:db8::1]:443"), trusted),
            "2001:db8::1"
        );
    }
}
