//! The SSRF guard of the HTTP executor: which addresses an HTTP target may reach, and the reqwest
//! plumbing that makes every connection go to a checked address.
//!
//! It owns the address policy ([`SsrfGuard::check_ip`]) and its three enforcement points:
//!
//! 1. a DNS resolver ([`client_builder`] installs it) that resolves host names with
//!    `tokio::net::lookup_host` and hands reqwest only the addresses the guard allows, so the
//!    connection goes to exactly the address that was checked (no DNS-rebinding gap between check
//!    and connect); if every address is refused the request fails naming the host and address;
//! 2. URLs whose host is an IP literal, for which reqwest never calls the resolver: the executor
//!    checks them with [`SsrfGuard::check_url_host`] before sending. The URL is parsed the WHATWG way
//!    first, so `http://2130706433/`, `http://0x7f.1/` and `http://127.1/` are all seen as 127.0.0.1;
//! 3. redirects: a redirect policy checks every hop's IP-literal host (host-name hops go through the
//!    resolver) and follows at most [`MAX_REDIRECTS`] hops.
//!
//! The client it builds also ignores proxy settings (`HTTP_PROXY` and friends): behind a proxy the
//! proxy resolves and connects, and nothing here could check that.
//!
//! Refused unless allow-listed (first match wins):
//!
//! | IPv4 | IPv6 | category |
//! |------|------|----------|
//! | 0.0.0.0, (0.0.0.0/8 as reserved) | `::` | unspecified |
//! | 127.0.0.0/8 | `::1` | loopback |
//! | 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 | `fc00::/7`, `fec0::/10`, `64:ff9b:1::/48` | private |
//! | 169.254.0.0/16 | `fe80::/10` | link-local |
//! | 100.64.0.0/10 | | shared address space (CGNAT) |
//! | 224.0.0.0/4 | `ff00::/8` | multicast |
//! | 255.255.255.255 | | broadcast |
//! | 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 | `2001:db8::/32`, `3fff::/20` | documentation |
//! | 192.0.0.0/24, 192.88.99.0/24, 198.18.0.0/15, 240.0.0.0/4 | `100::/64`, `2001::/32` (Teredo), anything outside `2000::/3` | reserved |
//!
//! IPv6 addresses that embed an IPv4 address are judged by that address: IPv4-mapped
//! (`::ffff:a.b.c.d`), IPv4-translated (`::ffff:0:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64
//! (`64:ff9b::/96`) and 6to4 (`2002::/16`). So `::ffff:127.0.0.1` is loopback and
//! `64:ff9b::8.8.8.8` is public.
//!
//! Cloud metadata addresses are marked as such: 169.254.169.254 (AWS, GCP, Azure, OCI, ...),
//! 169.254.170.2 and 169.254.170.23 (AWS ECS/EKS), `fd00:ec2::254` and `fd00:ec2::23` (AWS IPv6),
//! 100.100.100.200 (Alibaba), 192.0.0.192 (Oracle) and 168.63.129.16 (Azure WireServer, refused
//! although it is in a public range). A metadata address is only allowed by an allow-list entry
//! that is exactly that address (`/32` or `/128`): allow-listing `100.64.0.0/10` for a Tailscale
//! network or `fc00::/7` does not open the metadata service.
//!
//! Allow-list entries are CIDR blocks (`10.0.0.0/8`, `::1/128`), single addresses (`10.1.2.3`) or
//! host names (exact, case-insensitive, no wildcards). A host-name entry allows that name whatever it
//! resolves to, metadata addresses included: it trusts that name's DNS. [`SsrfGuard::allow_loopback`]
//! (for `chronoshard dev`) allows 127.0.0.0/8 and `::1`, nothing else.
//!
//! It must not do I/O beyond resolving the target's host name, must not cache resolutions (a cached
//! answer would be a rebinding gap of its own), and must not be bypassed: a client for tickets is
//! built with [`client_builder`] and never gets another resolver, `resolve` override, proxy or
//! redirect policy afterwards.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::Arc,
};

use reqwest::{
    dns::{Addrs, Name, Resolve, Resolving},
    redirect, Url,
};

/// Redirect hops followed per request; one more is an error.
pub const MAX_REDIRECTS: usize = 5;

/// The address policy of the HTTP executor. `SsrfGuard::default()` refuses every non-public address.
#[derive(Clone, Debug, Default)]
pub struct SsrfGuard {
    blocks: Vec<Cidr>,
    hosts: Vec<String>,
    loopback: bool,
}

/// A bad guard configuration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SsrfError {
    #[error("invalid ssrf allow-list entry {entry:?}: {reason}")]
    InvalidEntry { entry: String, reason: String },
}

/// Why an address is not public.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    Unspecified,
    Loopback,
    Private,
    LinkLocal,
    /// 100.64.0.0/10, carrier-grade NAT.
    SharedAddressSpace,
    /// A metadata endpoint in an otherwise public range.
    CloudMetadata,
    Broadcast,
    Multicast,
    Documentation,
    Reserved,
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Category::Unspecified => "unspecified",
            Category::Loopback => "loopback",
            Category::Private => "private",
            Category::LinkLocal => "link-local",
            Category::SharedAddressSpace => "shared address space (CGNAT)",
            Category::CloudMetadata => "a cloud metadata address",
            Category::Broadcast => "broadcast",
            Category::Multicast => "multicast",
            Category::Documentation => "documentation",
            Category::Reserved => "reserved",
        })
    }
}

/// An address the guard refused. Its `Display` starts with `refused:` and names the address and why,
/// e.g. `refused: 169.254.169.254 is link-local (metadata) and not allow-listed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub ip: IpAddr,
    pub category: Category,
    /// A cloud metadata address.
    pub metadata: bool,
    /// The IPv4 address an IPv6 address embeds, which decided the category.
    pub embedded: Option<Ipv4Addr>,
    /// The host name that resolved to `ip`, when refused by the resolver.
    pub host: Option<String>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Some(host) => write!(f, "refused: {host} resolves to {}, which is ", self.ip)?,
            None => write!(f, "refused: {} is ", self.ip)?,
        }
        write!(f, "{}", self.category)?;
        if self.metadata && self.category != Category::CloudMetadata {
            f.write_str(" (metadata)")?;
        }
        if let Some(v4) = self.embedded {
            write!(f, " (embeds {v4})")?;
        }
        f.write_str(" and not allow-listed")
    }
}

impl std::error::Error for Refused {}

impl SsrfGuard {
    /// A guard that allows, besides public addresses, what `allow` lists: CIDR blocks
    /// (`10.0.0.0/8`, `::1/128`), single addresses, or host names. An entry that is none of these,
    /// or a block with host bits set (`10.0.0.1/8`), is an error naming the entry.
    pub fn new(allow: &[String]) -> Result<SsrfGuard, SsrfError> {
        let mut guard = SsrfGuard::default();
        for raw in allow {
            match parse_entry(raw).map_err(|reason| SsrfError::InvalidEntry {
                entry: raw.clone(),
                reason,
            })? {
                Entry::Block(b) => guard.blocks.push(b),
                Entry::Host(h) => guard.hosts.push(h),
            }
        }
        Ok(guard)
    }

    /// Also allows loopback targets (127.0.0.0/8, `::1`): for `chronoshard dev`.
    pub fn allow_loopback(mut self) -> SsrfGuard {
        self.loopback = true;
        self
    }

    pub fn allows_loopback(&self) -> bool {
        self.loopback
    }

    /// Whether `host` is an allow-listed host name (case-insensitive, a trailing dot ignored).
    pub fn allows_host(&self, host: &str) -> bool {
        let host = normalize_host(host);
        self.hosts.contains(&host)
    }

    /// Whether a connection to `ip` is allowed.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Refused> {
        let Some(class) = classify(ip) else {
            return Ok(());
        };
        if self.allows(ip, &class) {
            return Ok(());
        }
        Err(Refused {
            ip,
            category: class.category,
            metadata: class.metadata,
            embedded: class.embedded,
            host: None,
        })
    }

    /// Checks the host of `url` if it is an IP literal. A host name passes here: the guarded
    /// resolver checks what it resolves to.
    pub fn check_url_host(&self, url: &Url) -> Result<(), Refused> {
        match literal_ip(url) {
            Some(ip) => self.check_ip(ip),
            None => Ok(()),
        }
    }

    /// The addresses `host` resolved to that a connection may use: all of them for an
    /// allow-listed host name, else those [`SsrfGuard::check_ip`] allows. If there were addresses and
    /// all were refused, the first refusal, naming `host`.
    pub fn filter_resolved(
        &self,
        host: &str,
        addrs: impl IntoIterator<Item = SocketAddr>,
    ) -> Result<Vec<SocketAddr>, Refused> {
        let addrs: Vec<SocketAddr> = addrs.into_iter().collect();
        if self.allows_host(host) {
            return Ok(addrs);
        }
        let mut first_refused = None;
        let mut allowed = Vec::with_capacity(addrs.len());
        for addr in addrs {
            match self.check_ip(addr.ip()) {
                Ok(()) => allowed.push(addr),
                Err(r) => {
                    first_refused.get_or_insert(r);
                }
            }
        }
        match first_refused {
            Some(mut refused) if allowed.is_empty() => {
                refused.host = Some(host.to_string());
                Err(refused)
            }
            _ => Ok(allowed),
        }
    }

    fn allows(&self, ip: IpAddr, class: &Class) -> bool {
        if self.loopback && class.category == Category::Loopback {
            return true;
        }
        let candidates = [Some(ip), class.embedded.map(IpAddr::V4)];
        self.blocks.iter().any(|block| {
            (!class.metadata || block.is_single())
                && candidates.iter().flatten().any(|&c| block.contains(c))
        })
    }
}

/// A `reqwest::ClientBuilder` that resolves through `guard`, follows redirects only to addresses
/// `guard` allows (at most [`MAX_REDIRECTS`]) and ignores proxy settings. Add a user agent or
/// timeouts to it, but no `dns_resolver`, `resolve*`, `proxy` or `redirect`: each would undo the
/// guard. IP-literal URLs still need [`SsrfGuard::check_url_host`] before sending; `HttpExecutor`
/// does both.
pub fn client_builder(guard: &SsrfGuard) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver {
            guard: guard.clone(),
        }))
        .redirect(redirect_policy(guard.clone()))
}

/// The first [`Refused`] in an error's source chain (reqwest wraps the resolver's and the redirect
/// policy's errors).
pub fn find_refused<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refused> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(r) = e.downcast_ref::<Refused>() {
            return Some(r);
        }
        cur = e.source();
    }
    None
}

fn redirect_policy(guard: SsrfGuard) -> redirect::Policy {
    redirect::Policy::custom(move |attempt| {
        // `previous` starts with the original URL, so this allows MAX_REDIRECTS hops.
        if attempt.previous().len() > MAX_REDIRECTS {
            let msg = format!("too many redirects (more than {MAX_REDIRECTS})");
            return attempt.error(msg);
        }
        match guard.check_url_host(attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(refused) => attempt.error(refused),
        }
    })
}

/// Resolves with the system resolver and passes on only what the guard allows.
#[derive(Debug)]
struct GuardedResolver {
    guard: SsrfGuard,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = self.guard.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let resolved = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let allowed = guard.filter_resolved(&host, resolved)?;
            if allowed.is_empty() {
                return Err(format!("{host} resolved to no address").into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// The host of `url` as an address, if it is an IP literal (the `url` crate has normalised
/// numeric forms such as `2130706433` or `0x7f.1` to dotted quads already).
fn literal_ip(url: &Url) -> Option<IpAddr> {
    strip_brackets(url.host_str()?).parse().ok()
}

/// What makes an address non-public.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Class {
    category: Category,
    metadata: bool,
    embedded: Option<Ipv4Addr>,
}

/// The first block holding `ip` and its category.
fn v4_category(ip: Ipv4Addr) -> Option<Category> {
    use Category::*;
    const REFUSED: &[([u8; 4], u8, Category)] = &[
        ([0, 0, 0, 0], 32, Unspecified),
        ([0, 0, 0, 0], 8, Reserved),
        ([10, 0, 0, 0], 8, Private),
        ([100, 64, 0, 0], 10, SharedAddressSpace),
        ([127, 0, 0, 0], 8, Loopback),
        ([169, 254, 0, 0], 16, LinkLocal),
        ([172, 16, 0, 0], 12, Private),
        ([192, 0, 0, 0], 24, Reserved),
        ([192, 0, 2, 0], 24, Documentation),
        ([192, 88, 99, 0], 24, Reserved),
        ([192, 168, 0, 0], 16, Private),
        ([198, 18, 0, 0], 15, Reserved),
        ([198, 51, 100, 0], 24, Documentation),
        ([203, 0, 113, 0], 24, Documentation),
        ([224, 0, 0, 0], 4, Multicast),
        ([255, 255, 255, 255], 32, Broadcast),
        ([240, 0, 0, 0], 4, Reserved),
    ];
    REFUSED
        .iter()
        .find(|(net, len, _)| Cidr::v4(Ipv4Addr::from(*net), *len).contains(IpAddr::V4(ip)))
        .map(|(_, _, c)| *c)
}

/// The first block holding `ip` and its category; what is outside 2000::/3 (global unicast) and
/// not listed is reserved.
fn v6_category(ip: Ipv6Addr) -> Option<Category> {
    use Category::*;
    // The first three segments of each block; the rest are zero.
    const REFUSED: &[([u16; 3], u8, Category)] = &[
        ([0, 0, 0], 128, Unspecified),
        ([0x100, 0, 0], 64, Reserved),
        ([0x64, 0xff9b, 1], 48, Private),
        ([0x2001, 0, 0], 32, Reserved),
        ([0x2001, 0xdb8, 0], 32, Documentation),
        ([0x3fff, 0, 0], 20, Documentation),
        ([0xfc00, 0, 0], 7, Private),
        ([0xfec0, 0, 0], 10, Private),
        ([0xfe80, 0, 0], 10, LinkLocal),
        ([0xff00, 0, 0], 8, Multicast),
    ];
    if ip == Ipv6Addr::LOCALHOST {
        return Some(Loopback);
    }
    let global = Cidr::v6(Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3);
    REFUSED
        .iter()
        .find(|([a, b, c], len, _)| {
            Cidr::v6(Ipv6Addr::new(*a, *b, *c, 0, 0, 0, 0, 0), *len).contains(IpAddr::V6(ip))
        })
        .map(|(_, _, c)| *c)
        .or((!global.contains(IpAddr::V6(ip))).then_some(Reserved))
}

const V4_METADATA: &[Ipv4Addr] = &[
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(169, 254, 170, 23),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(192, 0, 0, 192),
    Ipv4Addr::new(168, 63, 129, 16),
];

const V6_METADATA: &[Ipv6Addr] = &[
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23),
];

/// `None` for a public address.
fn classify(ip: IpAddr) -> Option<Class> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<Class> {
    let metadata = V4_METADATA.contains(&ip);
    let category = v4_category(ip).or(metadata.then_some(Category::CloudMetadata))?;
    Some(Class {
        category,
        metadata,
        embedded: None,
    })
}

fn classify_v6(ip: Ipv6Addr) -> Option<Class> {
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4).map(|c| Class {
            embedded: Some(v4),
            ..c
        });
    }
    let metadata = V6_METADATA.contains(&ip);
    let category = v6_category(ip).or(metadata.then_some(Category::CloudMetadata))?;
    Some(Class {
        category,
        metadata,
        embedded: None,
    })
}

/// The IPv4 address an IPv6 address stands for: mapped, translated, compatible, NAT64 or 6to4.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let v4 = |hi: u16, lo: u16| Some(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo] => v4(hi, lo),
        [0, 0, 0, 0, 0xffff, 0, hi, lo] => v4(hi, lo),
        // `::` and `::1` are themselves, not IPv4-compatible.
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, hi, lo] => v4(hi, lo),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => v4(hi, lo),
        [0x2002, hi, lo, ..] => v4(hi, lo),
        _ => None,
    }
}

/// A CIDR block; `net` has no host bits set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cidr {
    net: IpAddr,
    len: u8,
}

impl Cidr {
    const fn v4(net: Ipv4Addr, len: u8) -> Cidr {
        Cidr {
            net: IpAddr::V4(net),
            len,
        }
    }

    const fn v6(net: Ipv6Addr, len: u8) -> Cidr {
        Cidr {
            net: IpAddr::V6(net),
            len,
        }
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.net, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = mask_v4(self.len);
                u32::from(ip) & mask == u32::from(net) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = mask_v6(self.len);
                u128::from(ip) & mask == u128::from(net) & mask
            }
            _ => false,
        }
    }

    fn is_single(&self) -> bool {
        u32::from(self.len) == max_len(self.net)
    }
}

fn mask_v4(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

fn mask_v6(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

fn max_len(ip: IpAddr) -> u32 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

enum Entry {
    Block(Cidr),
    Host(String),
}

fn strip_brackets(s: &str) -> &str {
    s.strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(s)
}

fn normalize_host(host: &str) -> String {
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

fn parse_entry(raw: &str) -> Result<Entry, String> {
    let s = raw.trim();
    if s.is_empty() {
        return Err("empty entry".into());
    }
    if s.contains("://") {
        return Err("a URL; list its host name or address".into());
    }
    if let Some((addr, len)) = s.split_once('/') {
        let net: IpAddr = strip_brackets(addr)
            .parse()
            .map_err(|_| format!("{addr:?} is not an IP address"))?;
        let len: u8 = len
            .parse()
            .map_err(|_| format!("prefix length {len:?} is not a number"))?;
        let max = max_len(net);
        if u32::from(len) > max {
            return Err(format!("prefix length {len} is longer than {max}"));
        }
        let base = match net {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask_v4(len))),
            IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask_v6(len))),
        };
        if base != net {
            return Err(format!("host bits are set; the block is {base}/{len}"));
        }
        return Ok(Entry::Block(Cidr { net, len }));
    }
    if let Ok(ip) = strip_brackets(s).parse::<IpAddr>() {
        let len = max_len(ip) as u8;
        return Ok(Entry::Block(Cidr { net: ip, len }));
    }
    if s.contains('*') {
        return Err("wildcards are not supported; list each host name".into());
    }
    let host = normalize_host(s);
    if host.len() > 253 {
        return Err("host name longer than 253 characters".into());
    }
    let labels: Vec<&str> = host.split('.').collect();
    for label in &labels {
        let ok_chars = label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if label.is_empty()
            || label.len() > 63
            || !ok_chars
            || label.starts_with('-')
            || label.ends_with('-')
        {
            return Err(
                "not a CIDR block, IP address or host name (non-ASCII names in their xn-- form)"
                    .into(),
            );
        }
    }
    let last = labels.last().copied().unwrap_or_default();
    if last.bytes().all(|b| b.is_ascii_digit()) || last.starts_with("0x") {
        return Err("looks like an IPv4 address but is not one".into());
    }
    Ok(Entry::Host(host))
}

#[cfg(test)]
mod tests;
