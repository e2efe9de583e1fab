//! Which peers are proxies themselves (a load balancer in front of this one) and may
//! therefore tell us the client's address in X-Forwarded-For: `trusted_proxies`, a list of
//! addresses or CIDR blocks.

use std::net::IpAddr;

/// Parsed `trusted_proxies`.
#[derive(Clone, Debug, Default)]
pub struct TrustedProxies(Vec<(IpAddr, u8)>);

impl TrustedProxies {
    /// Parses `10.0.0.0/8`, `192.168.1.7`, `fd00::/8` and the like.
    pub fn parse(list: &[String]) -> Result<Self, String> {
        list.iter()
            .map(|entry| {
                let (addr, bits) = match entry.split_once('/') {
                    Some((a, b)) => (a, Some(b)),
                    None => (entry.as_str(), None),
                };
                let addr: IpAddr = addr.trim().parse().map_err(|_| {
                    format!("trusted_proxies: {entry:?} is not an IP address or CIDR block")
                })?;
                let max = if addr.is_ipv4() { 32 } else { 128 };
                let bits = match bits {
                    Some(b) => b
                        .trim()
                        .parse::<u8>()
                        .ok()
                        .filter(|b| *b <= max)
                        .ok_or_else(|| {
                            format!("trusted_proxies: {entry:?}: the prefix length must be 0-{max}")
                        })?,
                    None => max,
                };
                Ok((addr, bits))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether `ip` is one of them (IPv4-mapped IPv6 peers match IPv4 entries).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.iter().any(|(net, bits)| match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), *bits),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), *bits),
            _ => false,
        })
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let full = usize::from(bits / 8);
    if a[..full] != b[..full] {
        return false;
    }
    let rest = bits % 8;
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        a[full] & mask == b[full] & mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_blocks() {
        let t = TrustedProxies::parse(&["10.1.0.0/16".into(), "::1".into(), "192.168.7.9".into()])
            .unwrap();
        assert!(t.contains("10.1.200.3".parse().unwrap()));
        assert!(!t.contains("10.2.0.1".parse().unwrap()));
        assert!(t.contains("::1".parse().unwrap()));
        assert!(t.contains("::ffff:192.168.7.9".parse().unwrap()));
        assert!(!t.contains("192.168.7.10".parse().unwrap()));
        assert!(!TrustedProxies::default().contains("127.0.0.1".parse().unwrap()));
        assert!(TrustedProxies::parse(&["10.0.0.0/33".into()]).is_err());
        assert!(TrustedProxies::parse(&["proxy.local".into()]).is_err());
    }
}
