//! The pod's DNS settings, read from its `/etc/resolv.conf`, handed to the guest by DHCP.

use std::net::Ipv4Addr;

/// DNS settings for the guest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsConfig {
    /// IPv4 name servers, in file order (IPv6 ones cannot go in a DHCPv4 option and are skipped).
    pub servers: Vec<Ipv4Addr>,
    /// Search domains (`search`, or `domain` when there is no `search` line).
    pub search: Vec<String>,
}

/// Parses resolv.conf text. Unknown lines, comments and malformed entries are skipped; at most
/// 8 servers and 16 search domains of ≤ 253 bytes are kept (DHCP option size limits).
pub fn parse_resolv_conf(text: &str) -> DnsConfig {
    let mut cfg = DnsConfig::default();
    let mut domain = None;
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => {
                if let Some(Ok(ip)) = words.next().map(str::parse::<Ipv4Addr>) {
                    if cfg.servers.len() < 8 && !cfg.servers.contains(&ip) {
                        cfg.servers.push(ip);
                    }
                }
            }
            Some("search") => {
                cfg.search = words
                    .filter(|d| valid_domain(d))
                    .take(16)
                    .map(|d| d.trim_end_matches('.').to_string())
                    .collect();
            }
            Some("domain") => {
                domain = words
                    .next()
                    .filter(|d| valid_domain(d))
                    .map(|d| d.trim_end_matches('.').to_string());
            }
            _ => {}
        }
    }
    if cfg.search.is_empty() {
        cfg.search.extend(domain);
    }
    cfg
}

fn valid_domain(d: &str) -> bool {
    let d = d.trim_end_matches('.');
    !d.is_empty()
        && d.len() <= 253
        && d.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_resolv_conf() {
        let cfg = parse_resolv_conf(
            "# generated\nsearch default.svc.cluster.local svc.cluster.local cluster.local\n\
             nameserver 10.96.0.10\nnameserver fd00::10\nnameserver 10.96.0.10\noptions ndots:5\n",
        );
        assert_eq!(cfg.servers, vec![Ipv4Addr::new(10, 96, 0, 10)]);
        assert_eq!(
            cfg.search,
            vec![
                "default.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local"
            ]
        );
    }

    #[test]
    fn domain_fallback_and_garbage() {
        let cfg = parse_resolv_conf(
            "domain example.org.\nnameserver bogus\nnameserver 1.1.1.1 ; x\nsearch\n\u{0}\n",
        );
        assert_eq!(cfg.servers, vec![Ipv4Addr::new(1, 1, 1, 1)]);
        assert_eq!(cfg.search, vec!["example.org"]);
        let cfg = parse_resolv_conf("search bad..name ok.example\n");
        assert_eq!(cfg.search, vec!["ok.example"]);
    }
}
