use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn guard(allow: &[&str]) -> SsrfGuard {
    let allow: Vec<String> = allow.iter().map(|s| s.to_string()).collect();
    SsrfGuard::new(&allow).expect("valid allow list")
}

#[test]
fn default_guard_refuses_each_category() {
    use Category::*;
    let cases = [
        (Unspecified, false, "0.0.0.0 ::"),
        (Loopback, false, "127.0.0.1 127.255.255.254 ::1"),
        (
            Private,
            false,
            "10.0.0.1 172.16.0.1 172.31.255.255 192.168.1.1",
        ),
        (
            Private,
            false,
            "fc00::1 fd12:3456::1 fec0::1 64:ff9b:1::a00:1",
        ),
        (LinkLocal, false, "169.254.0.1 fe80::1"),
        (SharedAddressSpace, false, "100.64.0.1 100.127.255.255"),
        (Broadcast, false, "255.255.255.255"),
        (Multicast, false, "224.0.0.1 239.255.255.250 ff02::1"),
        (
            Documentation,
            false,
            "192.0.2.1 198.51.100.1 203.0.113.1 2001:db8::1 3fff::1",
        ),
        (
            Reserved,
            false,
            "0.1.2.3 240.0.0.1 198.18.0.1 192.0.0.1 100::1 2001::1 4000::1",
        ),
        // Metadata.
        (LinkLocal, true, "169.254.169.254 169.254.170.2"),
        (SharedAddressSpace, true, "100.100.100.200"),
        (Private, true, "fd00:ec2::254"),
        (Reserved, true, "192.0.0.192"),
        (CloudMetadata, true, "168.63.129.16"),
    ];
    let g = SsrfGuard::default();
    for (category, metadata, addrs) in cases {
        for addr in addrs.split_whitespace() {
            let refused = g.check_ip(ip(addr)).expect_err(addr);
            assert_eq!(refused.category, category, "{addr}");
            assert_eq!(refused.metadata, metadata, "{addr}");
            assert_eq!(refused.embedded, None, "{addr}");
            assert!(refused.to_string().starts_with("refused: "), "{refused}");
        }
    }
}

#[test]
fn public_addresses_pass() {
    let g = SsrfGuard::default();
    let v4 = "93.184.216.34 1.1.1.1 100.63.255.255 100.128.0.0 172.15.255.255 172.32.0.0";
    let v6 = "2606:4700::1111 2001:4860:4860::8888 ::ffff:93.184.216.34 64:ff9b::808:808 2002:808:808::1";
    for addr in v4.split_whitespace().chain(v6.split_whitespace()) {
        assert_eq!(g.check_ip(ip(addr)), Ok(()), "{addr}");
    }
}

#[test]
fn embedded_ipv4_is_judged_as_ipv4() {
    let g = SsrfGuard::default();
    for (addr, v4, category) in [
        ("::ffff:127.0.0.1", "127.0.0.1", Category::Loopback),
        (
            "::ffff:169.254.169.254",
            "169.254.169.254",
            Category::LinkLocal,
        ),
        ("::ffff:0:10.0.0.1", "10.0.0.1", Category::Private),
        ("::127.0.0.1", "127.0.0.1", Category::Loopback),
        ("::a9fe:a9fe", "169.254.169.254", Category::LinkLocal),
        ("64:ff9b::192.168.0.1", "192.168.0.1", Category::Private),
        ("64:ff9b::a9fe:a9fe", "169.254.169.254", Category::LinkLocal),
        ("2002:7f00:1::", "127.0.0.1", Category::Loopback),
    ] {
        let refused = g.check_ip(ip(addr)).expect_err(addr);
        assert_eq!(refused.category, category, "{addr}");
        assert_eq!(refused.embedded, Some(v4.parse().unwrap()), "{addr}");
    }
    let refused = g.check_ip(ip("::ffff:127.0.0.1")).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "refused: ::ffff:127.0.0.1 is loopback (embeds 127.0.0.1) and not allow-listed"
    );
    assert_eq!(
        g.check_ip(ip("169.254.169.254")).unwrap_err().to_string(),
        "refused: 169.254.169.254 is link-local (metadata) and not allow-listed"
    );
}

#[test]
fn allow_list_blocks_open_their_addresses_only() {
    let g = guard(&["10.0.0.0/8", "::1/128", "127.0.0.1/32", "192.168.7.7"]);
    assert_eq!(g.check_ip(ip("10.1.2.3")), Ok(()));
    assert_eq!(g.check_ip(ip("::1")), Ok(()));
    assert_eq!(g.check_ip(ip("127.0.0.1")), Ok(()));
    assert_eq!(g.check_ip(ip("192.168.7.7")), Ok(()));
    // An IPv4 entry covers the mapped form too.
    assert_eq!(g.check_ip(ip("::ffff:10.9.9.9")), Ok(()));
    assert_eq!(g.check_ip(ip("::ffff:127.0.0.1")), Ok(()));
    for refused in ["127.0.0.2", "192.168.7.8", "172.16.0.1", "fe80::1", "::2"] {
        assert!(g.check_ip(ip(refused)).is_err(), "{refused}");
    }
}

#[test]
fn metadata_needs_its_own_entry() {
    let wide = guard(&["169.254.0.0/16", "100.64.0.0/10", "fc00::/7"]);
    assert_eq!(wide.check_ip(ip("169.254.1.1")), Ok(()));
    assert_eq!(wide.check_ip(ip("100.101.102.103")), Ok(()));
    assert_eq!(wide.check_ip(ip("fd00::1")), Ok(()));
    for metadata in ["169.254.169.254", "100.100.100.200", "fd00:ec2::254"] {
        let refused = wide.check_ip(ip(metadata)).expect_err(metadata);
        assert!(refused.metadata, "{metadata}");
    }
    let exact = guard(&["169.254.169.254/32", "fd00:ec2::254"]);
    assert_eq!(exact.check_ip(ip("169.254.169.254")), Ok(()));
    assert_eq!(exact.check_ip(ip("::ffff:169.254.169.254")), Ok(()));
    assert_eq!(exact.check_ip(ip("fd00:ec2::254")), Ok(()));
    assert!(exact.check_ip(ip("169.254.170.2")).is_err());
}

#[test]
fn allow_loopback_opens_loopback_only() {
    let g = SsrfGuard::default().allow_loopback();
    assert!(g.allows_loopback());
    for addr in ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"] {
        assert_eq!(g.check_ip(ip(addr)), Ok(()), "{addr}");
    }
    for addr in ["0.0.0.0", "::", "10.0.0.1", "169.254.169.254", "fe80::1"] {
        assert!(g.check_ip(ip(addr)).is_err(), "{addr}");
    }
}

#[test]
fn host_names_match_exactly_and_case_insensitively() {
    let g = guard(&["Internal.Example.com", "metadata.google.internal."]);
    assert!(g.allows_host("internal.example.com"));
    assert!(g.allows_host("INTERNAL.EXAMPLE.COM."));
    assert!(g.allows_host("metadata.google.internal"));
    assert!(!g.allows_host("x.internal.example.com"));
    assert!(!g.allows_host("example.com"));
    // A host-name entry does not open addresses.
    assert!(g.check_ip(ip("10.0.0.1")).is_err());
}

#[test]
fn resolved_addresses_are_filtered() {
    let sock = |s: &str| SocketAddr::new(ip(s), 0);
    let g = SsrfGuard::default();
    let mixed = [sock("10.0.0.1"), sock("93.184.216.34"), sock("::1")];
    assert_eq!(
        g.filter_resolved("mixed.example", mixed),
        Ok(vec![sock("93.184.216.34")])
    );
    let refused = g
        .filter_resolved("evil.example", [sock("169.254.169.254"), sock("::1")])
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "refused: evil.example resolves to 169.254.169.254, which is link-local (metadata) \
         and not allow-listed"
    );
    let trusted = guard(&["evil.example"]);
    assert_eq!(
        trusted.filter_resolved("EVIL.example", [sock("169.254.169.254")]),
        Ok(vec![sock("169.254.169.254")])
    );
    assert_eq!(g.filter_resolved("empty.example", []), Ok(vec![]));
}

#[test]
fn bad_entries_are_named() {
    for (entry, reason) in [
        ("10.0.0.0/33", "prefix length 33 is longer than 32"),
        ("::/129", "prefix length 129 is longer than 128"),
        ("10.0.0.1/8", "host bits are set; the block is 10.0.0.0/8"),
        ("10.0.0.0/x", "prefix length \"x\" is not a number"),
        ("10.0.0/8", "\"10.0.0\" is not an IP address"),
        ("", "empty entry"),
        (
            "*.example.com",
            "wildcards are not supported; list each host name",
        ),
        ("10.0.0", "looks like an IPv4 address but is not one"),
        ("http://example.com", "a URL; list its host name or address"),
        ("example.com:8080", "not a CIDR block"),
        ("exa mple.com", "not a CIDR block"),
        ("-bad.example", "not a CIDR block"),
    ] {
        let err = SsrfGuard::new(&[entry.to_string()]).unwrap_err();
        let SsrfError::InvalidEntry {
            entry: named,
            reason: got,
        } = &err;
        assert_eq!(named, entry);
        assert!(got.starts_with(reason), "{entry}: {got}");
        assert!(
            err.to_string()
                .starts_with(&format!("invalid ssrf allow-list entry {entry:?}: ")),
            "{err}"
        );
    }
    assert!(SsrfGuard::new(&["[::1]/128".into(), "[fe80::1]".into()]).is_ok());
}

#[tokio::test]
async fn resolver_refuses_localhost() {
    let resolver = GuardedResolver {
        guard: SsrfGuard::default(),
    };
    let err = match resolver.resolve("localhost".parse().unwrap()).await {
        Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
        Err(e) => e,
    };
    let refused = find_refused(&*err).expect("a refusal");
    assert_eq!(refused.host.as_deref(), Some("localhost"));
    assert_eq!(refused.category, Category::Loopback);

    let dev = GuardedResolver {
        guard: SsrfGuard::default().allow_loopback(),
    };
    let addrs: Vec<_> = match dev.resolve("localhost".parse().unwrap()).await {
        Ok(addrs) => addrs.collect(),
        Err(e) => panic!("{e}"),
    };
    assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    assert!(!addrs.is_empty());
}
